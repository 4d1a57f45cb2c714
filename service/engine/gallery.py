"""A model's identification gallery: durable in Redis, held transformed in memory
(``Z = G L^T``), kept up to date as ``L`` changes, searched exactly.

The engine part of identification (1:N); it takes arrays, ids and labels and answers with
views and matches, and knows no HTTP.

* **Durable.** An enrol is one Lua script (``enrol.lua`` of :mod:`service.storage.gallery`) that
  writes the items and the ``Idempotency-Key`` record together; it is acknowledged after the
  script returned (with the embedded Redis and ``appendfsync always``: on disk). A delete is
  one script too. Every change counts in the model's meta hash (field ``gallery``). Start-up
  (after a restart or a ``kill -9``) reads the gallery back.
* **Held transformed.** :class:`GalleryView` is what queries read: the rows transformed under
  one snapshot's ``L`` (:class:`~service.core.gallery.TransformedGallery`), the item of each
  row, and that snapshot. An answer is exact for that snapshot's ``L`` and carries its
  ``version``. A new view is published after every change: an enrol (the new rows are
  transformed under the view's ``L`` before the answer, so an identify sent after an enrol's
  answer finds the new items), a delete, and a refresh to the model's latest snapshot.
* **The refresher** (one task per model) waits for a new snapshot and brings the view up to it
  in a worker thread (full or incremental, :func:`~service.core.gallery.refresh_method`), one
  refresh at a time: snapshots published during a refresh are taken together by the next one,
  never blocking the event loop. It is background work, kept from the cores that queries
  and ingestion need in two ways:

  - *at most an eighth of one core*: a refresh that took ``t`` is followed by a pause of
    ``7 t``, so under a fast stream the view follows the learner a few refreshes behind
    (10,000 x 128 at 20,000 samples/s: a full refresh, in float32, of ~7 ms every ~50 ms);
  - *at the lowest priority*: the refresh thread runs at nice 19 (Linux; each thread has its
    own nice value), so whenever the event loop, the learner or a client needs the core, the
    kernel's scheduler gives it to them first. On a machine saturated for long, refreshes
    then slow down (the view lags) rather than the answers; a refresh that a ``min_version``
    read waits for runs at the normal priority.

  Both keep identify's latency near the floor the ingestion itself sets
  (``benchmarks/results/identify.md``). ``min_version`` waits until the view is transformed to at
  least that version; such a wait cuts the pause short.
* **One change at a time.** Enrols, deletes and refreshes hold one lock (an enrol may wait for
  a refresh in flight); a write to Redis and its application in memory are shielded from
  cancellation, so a client that goes away never leaves memory behind Redis. Queries take no
  lock: they read the current view (rows are appended, never rewritten, so a reader of an
  older view is not disturbed).
* **Several processes.** Each one holds the gallery of every model it serves (the model's
  owner is the one meant to answer). A change made through another process shows as a jump in
  the change count: this process reloads the gallery when its next change sees one, and on
  every lease round (:meth:`Gallery.sync`, every ``OPML_LEASE_TTL_S / 3``).

Item ids are strings of 1-256 characters or integers; like labels, an integer means its decimal
string (``3`` and ``"3"`` are one item, its *key*), and answers give the id as last enrolled.
Re-enrolling a key replaces the item (vector and label). Ties in distance are broken by key
(code point order).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from service import telemetry
from service.config import Settings
from service.core import LearnerConfig, normalize_rows
from service.core._validation import Array
from service.core.gallery import TransformedGallery
from service.engine.snapshot import ModelClosed, Snapshot, SnapshotBoard
from service.engine.tasks import stop_task, wait_event
from service.errors import Conflict, LimitExceeded, NotFound, Unavailable
from service.storage.codec import decode_gallery_item, encode_gallery_item
from service.storage.store import GalleryFull, NoSuchItem, NoSuchModel, Store

log = logging.getLogger("service.gallery")

T = TypeVar("T")

#: The niceness of the refresh thread: the lowest priority (see the module docstring).
REFRESH_NICENESS = 19


def _lowest_priority() -> None:
    """Run the calling thread at :data:`REFRESH_NICENESS` (Linux gives each thread its own
    nice value; elsewhere, or where the system refuses, it keeps the process's)."""
    if sys.platform != "linux":
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), REFRESH_NICENESS)
    except OSError:  # pragma: no cover - a lower priority is always allowed on Linux
        log.warning("the gallery refresh thread keeps the normal priority")


#: Refreshes of every model, one at a time, at the lowest priority (a refresh runs one BLAS
#: thread; the other core is the learner's and the event loop's).
_REFRESH_THREADS = ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="opml-gallery-refresh", initializer=_lowest_priority
)
#: Large enrols, compactions and reloads of every model, one at a time (an enrol's answer
#: waits for them, so they run at the normal priority).
_CHANGE_THREADS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opml-gallery-change")
#: Searches of large galleries (so the event loop keeps answering meanwhile).
_SEARCH_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="opml-identify")
#: Work (multiply-adds) from which a change runs in a worker thread rather than inline.
_THREAD_WORK = 1 << 16
#: ... and a search: up to about 2M multiply-adds (one query over 10,000 x 128: ~0.5 ms) it
#: runs on the event loop, because handing it to a thread and back costs more than that on a
#: busy machine (two context switches, each waiting for a core).
_INLINE_SEARCH = 1 << 21
#: Most of its (wall) time the refresher spends refreshing (see ``_refresh_loop``).
_REFRESH_SHARE = 0.125
#: Dead rows (deleted or replaced items) are dropped once they are this share of the rows.
_DEAD_SHARE = 0.25


@dataclass(frozen=True)
class Item:
    """A gallery item: its id and label as enrolled (``y`` None: no label), and its key."""

    id: int | str
    key: str
    y: int | str | None


@dataclass(frozen=True)
class Match:
    """One row of an identify answer (Eq. 2 squared distance under the view's ``L``)."""

    id: int | str
    y: int | str | None
    squared_distance: float


@dataclass(frozen=True)
class GalleryView:
    """What an identify reads: the transformed rows, the item of each row, and the snapshot
    whose ``L`` they are exact for (its ``version`` is the answer's)."""

    rows: TransformedGallery
    items: list[Item]
    snapshot: Snapshot

    @property
    def version(self) -> int:
        return self.snapshot.version

    @property
    def size(self) -> int:
        """Items in the gallery."""
        return self.rows.size


@dataclass(frozen=True)
class EnrolResult:
    """An enrol's answer: items in the request, how many of them replaced an item with the
    same key, the gallery's size after it, and whether it replayed an earlier answer."""

    enrolled: int
    replaced: int
    size: int
    replayed: bool


def step_rank(old: Snapshot, new: Snapshot) -> int | None:
    """A bound on ``rank(L_new - L_old)`` from the steps between two snapshots: 2 per triplet
    step (Eq. 16), 1 per COPML pair step (Eq. 20); None when unknown (a metric replacement).

    >>> from service.core import Learner, LearnerConfig
    >>> s = Snapshot.of(Learner(LearnerConfig(dim=2)), (0, 0), 0)
    >>> step_rank(s, s), step_rank(s, Snapshot.of(Learner(LearnerConfig(dim=2)), (0, 0), 1))
    (0, None)
    """
    if new.metric_puts != old.metric_puts:
        return None
    diff = {k: new.counts[k] - old.counts.get(k, 0) for k in new.counts}
    if any(v < 0 for v in diff.values()):
        return None
    return diff["pair_update"] + 2 * (diff["triplet_update"] + diff["shrunk_update"])


def _digest(items: dict[str, bytes]) -> str:
    """A digest of an enrol's items as stored (a key reused with other items is 409)."""
    h = hashlib.sha256()
    for key, value in items.items():
        h.update(len(key).to_bytes(4, "little") + key.encode())
        h.update(len(value).to_bytes(8, "little") + value)
    return h.hexdigest()[:32]


async def _shielded(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to completion even if the caller is cancelled (its outcome is then
    retrieved so it is not reported as lost)."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return await asyncio.shield(task)


class Gallery:
    """One model's gallery (see the module docstring)."""

    def __init__(
        self,
        name: str,
        config: LearnerConfig,
        store: Store,
        settings: Settings,
        board: SnapshotBoard,
        series: telemetry.ModelTelemetry,
    ) -> None:
        self.name = name
        self.config = config
        self.store = store
        self.settings = settings
        self.board = board
        self.telemetry = series
        snap = board.current
        self.view = GalleryView(TransformedGallery.empty(snap.L), [], snap)
        self.closed = False
        self._index: dict[str, int] = {}  # item key -> row of the latest view
        self._sorted: list[str] | None = None  # the keys in order (listing), until a change
        self._changes = 0  # the gallery's change count in Redis that memory reflects
        self._stale = False  # a Redis call failed mid-change: reload before the next one
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._readers_waiting = 0  # min_version reads waiting for a newer view
        self._wanted = asyncio.Event()  # set when one starts: the refresher's pause ends

    # -- lifecycle ---------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the gallery from Redis (start-up; Unavailable is the caller's to retry)."""
        async with self._lock:
            await self._reload()

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_loop(), name=f"gallery:{self.name}")

    async def stop(self) -> None:
        """Stop the refresher; waiters get NotFound."""
        self.closed = True
        if self._task is not None:
            await stop_task(self._task)
        self._wake()

    async def sync(self) -> None:
        """Reload if the gallery was changed through another process (or a change of ours
        failed half-way); one ``HGET`` when nothing changed."""
        if self._stale or await self.store.gallery_changes(self.name) != self._changes:
            async with self._lock:
                await self._reload()

    # -- changes ---------------------------------------------------------------------------------

    async def enrol(
        self,
        X: Array,
        ids: list[int | str],
        keys: list[str],
        labels: list[int | str | None],
        idempotency_field: str = "",
    ) -> EnrolResult:
        """Enrol validated items (rows of ``X``, distinct ``keys``): durable, then in the view.
        An existing key is replaced. NotFound, LimitExceeded (OPML_MAX_GALLERY), Conflict (an
        idempotency key reused for other items)."""
        values = {
            key: encode_gallery_item(item_id, y, x)
            for key, item_id, y, x in zip(keys, ids, labels, X, strict=True)
        }
        return await _shielded(self._enrol(X, ids, keys, labels, values, idempotency_field))

    async def _enrol(
        self,
        X: Array,
        ids: list[int | str],
        keys: list[str],
        labels: list[int | str | None],
        values: dict[str, bytes],
        idempotency_field: str,
    ) -> EnrolResult:
        digest = _digest(values)
        limit = self.settings.max_gallery
        async with self._lock:
            await self._reload_if_stale()
            try:
                done = await self.store.enrol(
                    self.name,
                    values,
                    idempotency_field=idempotency_field,
                    fingerprint=digest,
                    now_ms=int(time.time() * 1000),
                    ttl_ms=self.settings.idempotency_ttl_s * 1000,
                    max_items=limit,
                    max_records=self.settings.idempotency_max_records,
                    on_dropped=self.telemetry.records_dropped.inc,
                )
            except NoSuchModel:
                raise NotFound(f"model {self.name!r} does not exist") from None
            except GalleryFull as exc:
                raise LimitExceeded(
                    f"the gallery holds {exc.size} items; at most {limit} per model "
                    "(OPML_MAX_GALLERY)"
                ) from None
            except Unavailable:
                self._stale = True  # the script may have run: Redis is the truth
                raise
            if done.replayed:
                if done.fingerprint != digest:
                    raise Conflict("this idempotency key was used for different items")
                return EnrolResult(len(keys), len(keys) - done.added, done.size, True)
            if done.changes != self._changes + 1:  # changed through another process too
                await self._reload()
            else:
                await self._append(X, ids, keys, labels)
                self._changes = done.changes
            return EnrolResult(len(keys), len(keys) - done.added, done.size, False)

    async def _append(
        self, X: Array, ids: list[int | str], keys: list[str], labels: list[int | str | None]
    ) -> None:
        view = self.view
        Xn = normalize_rows(X, self.config.normalize)
        work = len(X) * self.config.dim**2
        rows, first = await self._run(_CHANGE_THREADS, work < _THREAD_WORK, view.rows.with_rows, Xn)
        replaced = [self._index[k] for k in keys if k in self._index]
        if replaced:
            rows = rows.without(np.array(replaced, dtype=np.int64))
        items = view.items + [
            Item(item_id, key, y) for item_id, key, y in zip(ids, keys, labels, strict=True)
        ]
        for i, key in enumerate(keys):
            self._index[key] = first + i
        await self._publish_changed(GalleryView(rows, items, view.snapshot))

    async def delete(self, key: str) -> None:
        """Remove the item with ``key`` (NotFound: no such item or model)."""
        await _shielded(self._delete(key))

    async def _delete(self, key: str) -> None:
        async with self._lock:
            await self._reload_if_stale()
            try:
                changes = await self.store.delete_item(self.name, key)
            except NoSuchModel:
                raise NotFound(f"model {self.name!r} does not exist") from None
            except NoSuchItem:
                raise NotFound(f"the gallery has no item with id {key!r}") from None
            except Unavailable:
                self._stale = True
                raise
            if changes != self._changes + 1 or key not in self._index:
                await self._reload()
                return
            view = self.view
            rows = view.rows.without(np.array([self._index.pop(key)], dtype=np.int64))
            self._changes = changes
            await self._publish_changed(GalleryView(rows, view.items, view.snapshot))

    async def _publish_changed(self, view: GalleryView) -> None:
        """Publish a view after an enrol or delete, dropping dead rows when they have become
        :data:`_DEAD_SHARE` of it."""
        rows = view.rows
        if rows.n - rows.size > max(_DEAD_SHARE * rows.n, 64):
            inline = rows.n * self.config.dim < _THREAD_WORK
            rows, kept = await self._run(_CHANGE_THREADS, inline, rows.compacted)
            items = [view.items[i] for i in kept.tolist()]
            self._index = {item.key: row for row, item in enumerate(items)}
            view = GalleryView(rows, items, view.snapshot)
        self._sorted = None
        self._publish(view)

    async def _reload_if_stale(self) -> None:
        if self._stale:
            await self._reload()

    async def _reload(self) -> None:
        """Rebuild the view from Redis (the lock is held)."""
        changes, raw = await self.store.read_gallery(self.name)
        d = self.config.dim
        items: list[Item] = []
        X = np.empty((len(raw), d))
        for row, (key, value) in enumerate(sorted(raw.items())):
            item_id, y, X[row] = decode_gallery_item(value, d)
            items.append(Item(item_id, key, y))
        snap = self.board.current
        empty = TransformedGallery.empty(snap.L)
        Xn = normalize_rows(X, self.config.normalize)
        work = len(X) * d * d
        rows, _ = await self._run(_CHANGE_THREADS, work < _THREAD_WORK, empty.with_rows, Xn)
        self._index = {item.key: row for row, item in enumerate(items)}
        self._sorted = None
        self._changes = changes
        self._stale = False
        self._publish(GalleryView(rows, items, snap))

    # -- the refresher -------------------------------------------------------------------------

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.board.wait_newer(self.view.snapshot)
            except ModelClosed:
                return
            try:
                async with self._lock:
                    took = await self._refresh()
                # At most _REFRESH_SHARE of one core: a refresh that took t is followed by a
                # pause of t (1 - share) / share (a slow stream's incremental refreshes take
                # little, so it is followed at once; a fast one is followed at the pace the
                # machine allows, version by version skipped, instead of starving the learner,
                # the queries and the event loop), unless a min_version read waits.
                await self._pause(took * (1.0 - _REFRESH_SHARE) / _REFRESH_SHARE)
            except Exception:  # never leave the gallery without a refresher
                log.exception("%s: gallery refresh failed; retrying", self.name)
                await asyncio.sleep(1.0)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when a ``min_version`` read waits for a newer view."""
        if seconds <= 0.0 or self._readers_waiting:
            return
        self._wanted.clear()
        await wait_event(self._wanted, seconds)

    async def _refresh(self) -> float:
        """Bring the view to the latest snapshot; the seconds it took."""
        view, snap = self.view, self.board.current
        if snap is view.snapshot:
            return 0.0
        rank = step_rank(view.snapshot, snap) if view.rows.n else None  # empty: no product
        d = self.config.dim
        started = time.perf_counter()
        work = view.rows.n * d * d
        # A refresh that a min_version read waits for is foreground work: normal priority.
        threads = _CHANGE_THREADS if self._readers_waiting else _REFRESH_THREADS
        rows, method = await self._run(
            threads, work < _THREAD_WORK, view.rows.refreshed, snap.L, rank
        )
        took = time.perf_counter() - started
        if method != "unchanged" and rows.n:
            self.telemetry.gallery_refresh[method].observe(took)
        self._publish(GalleryView(rows, view.items, snap))
        return took

    # -- reads ---------------------------------------------------------------------------------

    def _publish(self, view: GalleryView) -> None:
        self.view = view
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def read(self, min_version: int | None) -> GalleryView:
        """The current view, once transformed to at least ``min_version`` (bounded by
        ``OPML_MIN_VERSION_WAIT_S``: then Unavailable)."""
        if min_version is None or self.view.version >= min_version:
            return self.view
        wait_s = self.settings.min_version_wait_s
        deadline = time.monotonic() + wait_s
        self._readers_waiting += 1
        self._wanted.set()  # the refresher does not pause while we wait,
        try:
            with self.board.urgent():  # nor does the writer hold appends back
                while self.view.version < min_version:
                    if self.closed:
                        raise NotFound(f"model {self.name!r} was deleted")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Unavailable(
                            f"version {min_version} not reached by the gallery within "
                            f"{wait_s:g} s (gallery at {self.view.version}, model at "
                            f"{self.board.current.version})",
                            retry_after=1,
                            version=self.view.version,
                        )
                    await wait_event(self._changed, remaining)
        finally:
            self._readers_waiting -= 1
        return self.view

    async def search(self, view: GalleryView, X: Array, k: int) -> list[list[Match]]:
        """The ``k`` nearest items of each row of ``X`` (validated; ``1 <= k <= view.size``)
        under the view's ``L``, in ascending distance, ties by key: exactly the brute force
        (see :mod:`service.core.gallery`). A value may be ``inf`` when it overflows float64."""
        Q = normalize_rows(X, self.config.normalize)
        work = view.rows.n * self.config.dim * len(Q)
        found = await self._run(_SEARCH_THREADS, work < _INLINE_SEARCH, view.rows.nearest, Q, k)
        items = view.items
        answers = []
        for rows, values in found:
            order = sorted(
                zip(values.tolist(), rows.tolist(), strict=True),
                key=lambda vr: (math.inf if math.isnan(vr[0]) else vr[0], items[vr[1]].key),
            )
            answers.append([Match(items[r].id, items[r].y, v) for v, r in order[:k]])
        return answers

    def listing(self, cursor: str | None, limit: int) -> tuple[int, list[int | str], str | None]:
        """``(size, ids, next cursor)``: up to ``limit`` ids in key order after ``cursor`` (a
        key, as returned; None: from the start); the next cursor is None after the last."""
        if self._sorted is None:
            self._sorted = sorted(self._index)
        keys = self._sorted
        start = 0 if cursor is None else bisect.bisect_right(keys, cursor)
        page = keys[start : start + limit]
        items = self.view.items
        ids = [items[self._index[key]].id for key in page]
        more = start + limit < len(keys)
        return len(keys), ids, page[-1] if more and page else None

    @staticmethod
    async def _run(
        executor: ThreadPoolExecutor, inline: bool, fn: Callable[..., T], *args: Any
    ) -> T:
        """``fn(*args)`` on the event loop (``inline``), or in ``executor`` (the products
        release the GIL)."""
        if inline:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
