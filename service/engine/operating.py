"""Operating points of a model, as queries use them: cached per version, refreshed in the
background, never computed per request.

A ``verify`` or ``identify`` with a target (``far`` / ``frr`` in the body, or the model's
``operating_point``) needs the held-out pairs of a snapshot's metric
(:func:`service.core.operating_points.held_out_pairs`: one ``n x d x d`` product on the
reservoir) and then a threshold for the target (``O(|grid|)``). :class:`OperatingCache` keeps
both for the latest snapshots it evaluated:

* **Which metric.** An answer decides with the metric its operating point certifies: the
  ``verify`` computes its distance with the cached snapshot's ``L`` and reports that
  snapshot's ``version`` (a few batches behind the newest while a refresh runs). ``identify``
  decides with the gallery's snapshot, and the cache evaluates that snapshot's metric when it
  has not yet (once per version). Any version may be certified on the current reservoir copy:
  held-out samples are never learned by any version, so they are independent of every ``L``.
* **Refresh.** A request (or a status read: model document, ``/events``, a scrape) that finds
  the cache older than the model's newest snapshot starts one background refresh (at most one
  running; starts at least :data:`REFRESH_S` and :data:`REFRESH_DUTY` times the last
  evaluation's duration apart) and is answered from the cache; only a request with
  ``min_version`` beyond the cache, or the first one, waits for the computation. The work runs
  in one dedicated thread (the cores belong to the learners).
* **Refusals** (too few held-out samples, an empty calibration window) are cached as well, so
  a burst of refused requests costs nothing; a refusal older than the model is never served
  (held-out samples that came since may lift it): that request waits for an evaluation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.core._validation import Array
from service.core.calibration import in_order
from service.core.certificates import NotEnoughHeldOut
from service.core.operating_points import (
    DEFAULT_DELTA,
    HeldOutPairs,
    Kind,
    OperatingPoint,
    held_out_pairs,
    operating_point,
)
from service.engine.snapshot import Snapshot
from service.engine.writer import Writer
from service.errors import NotCertifiable

log = logging.getLogger(__name__)

#: One thread: the evaluations are short and CPU-bound.
_THREADS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opml-operating-point")
#: Fewest seconds between the starts of two background refreshes of one model ...
REFRESH_S = 1.0
#: ... and at least this many times the last evaluation's duration: at d = 1024 an evaluation
#: of 5,000 held-out samples is ~5 GFLOP, which must not take the learners' cores.
REFRESH_DUTY = 20.0
#: Snapshots whose pairs are kept (the newest verify's, a gallery's older one).
KEEP = 3
#: Targets whose operating points are kept per snapshot.
KEEP_POINTS = 16

#: How a REST user holds samples out (the hint of every 409).
HOLDOUT_HINT = (
    'hold samples out: create the model with "holdout": 0.1 (that fraction of samples is '
    'routed to the held-out reservoir, never learned), or send samples with "holdout": true '
    "(e.g. a labelled validation set)"
)


@dataclass(frozen=True)
class Target:
    """A target rate asked for: ``kind`` ``"far"`` or ``"frr"``, its value, the confidence."""

    kind: Kind
    value: float
    delta: float = DEFAULT_DELTA


def target_of(far: float | None, frr: float | None, config_point: Any) -> Target | None:
    """The target of a request: the body's ``far`` / ``frr`` (already validated, at most one),
    else the model's ``operating_point`` (``None`` for ``"eer"``: the calibrated threshold)."""
    if far is not None:
        return Target("far", far)
    if frr is not None:
        return Target("frr", frr)
    if isinstance(config_point, dict):
        ((kind, value),) = config_point.items()
        return Target(kind, float(value))
    return None


@dataclass
class _Entry:
    snapshot: Snapshot
    pairs: HeldOutPairs | None
    error: Exception | None
    points: OrderedDict[Target, OperatingPoint | Exception]
    #: The model's version when the reservoir was copied (a refusal older than the model
    #: may have been lifted by held-out samples that came since).
    copied_at: int = -1
    #: The JSON text of each cached point as answers carry it (:func:`wire_json`): encoded
    #: once, so a verify by target costs no encoding of the point.
    encoded: dict[Target, str] = field(default_factory=dict)


class OperatingCache:
    """The held-out pairs and operating points of a model's latest evaluated snapshots."""

    def __init__(self, writer: Writer) -> None:
        self._writer = weakref.ref(writer)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._refresh: asyncio.Task[None] | None = None
        self._started = -np.inf
        self._cost = 0.0  # seconds the last evaluation took
        self._one = asyncio.Lock()

    @property
    def newest(self) -> _Entry | None:
        return next(reversed(self._entries.values())) if self._entries else None

    async def _evaluate(self, snapshot: Snapshot | None, again: bool = False) -> _Entry:
        """Copy the reservoir (from the writer) and evaluate ``snapshot`` (default: the
        snapshot the copy was taken at) in the worker thread; cache the entry (``again``:
        replace a cached one)."""
        async with self._one:
            writer = self._writer()
            if writer is None:
                raise NotCertifiable("the model moved or closed while evaluating")
            if (
                snapshot is not None
                and not again
                and (cached := self._entries.get(snapshot.version))
            ):
                return cached
            # A fresh copy each time (a few MB at most): an older copy may lack the held-out
            # samples that arrived since, which any version may be certified on.
            current, holdout = await writer.frozen_holdout()
            X, labels, _ = holdout.reservoir.samples()
            stream = holdout.reservoir.total
            snapshot = snapshot or current
            cached = self._entries.get(snapshot.version)
            if cached is not None and not (again and cached.copied_at < current.version):
                return cached
            began = time.monotonic()
            entry = await asyncio.get_running_loop().run_in_executor(
                _THREADS, _pairs_entry, snapshot, X, labels, stream
            )
            self._cost = time.monotonic() - began
            entry.copied_at = current.version
            self._entries[snapshot.version] = entry
            self._entries.move_to_end(snapshot.version)
            while len(self._entries) > KEEP:
                self._entries.popitem(last=False)
            return entry

    def _refresh_soon(self, newest_version: int) -> None:
        """Start a background refresh if the cache is older than the model (one at a time)."""
        entry = self.newest
        if entry is not None and entry.snapshot.version >= newest_version:
            return
        now = time.monotonic()
        running = self._refresh is not None and not self._refresh.done()
        if running or now - self._started < max(REFRESH_S, REFRESH_DUTY * self._cost):
            return
        self._started = now

        async def refresh() -> None:
            try:
                await self._evaluate(None)
            except Exception:  # the next request tries again, and reports what it meets
                log.debug("operating point refresh failed", exc_info=True)

        self._refresh = asyncio.create_task(refresh(), name="operating-point")

    def ready(self, newest: Snapshot, min_version: int | None) -> _Entry | None:
        """The newest evaluated entry when :meth:`latest` would answer it without waiting
        (starting the background refresh when the model moved on), else None: the hot path of
        a verify by target, with no coroutine."""
        entry = self.newest
        if entry is None or (min_version is not None and entry.snapshot.version < min_version):
            return None
        if entry.snapshot.version < newest.version:
            if entry.pairs is None:  # a refusal may be stale: never serve it
                return None
            self._refresh_soon(newest.version)
        return entry

    async def latest(self, newest: Snapshot, min_version: int | None) -> _Entry:
        """The newest evaluated entry (refreshed in the background when the model moved on);
        waits for an evaluation only when there is none yet or it is older than
        ``min_version``."""
        entry = self.ready(newest, min_version)
        if entry is None:
            entry = await self._evaluate(None)
            self._refresh_soon(newest.version)
        return entry

    async def of(self, snapshot: Snapshot, newest: Snapshot) -> _Entry:
        """The entry of ``snapshot`` (a gallery's), evaluated once per version."""
        entry = self._entries.get(snapshot.version)
        if entry is None:
            entry = await self._evaluate(snapshot)
        elif entry.pairs is None and entry.copied_at < newest.version:
            entry = await self._evaluate(snapshot, again=True)  # held-out samples came since
        self._refresh_soon(newest.version)
        return entry


def _pairs_entry(snapshot: Snapshot, X: Array, labels: NDArray[np.int64], stream: int) -> _Entry:
    """Evaluate a snapshot's metric on the reservoir copy (worker thread)."""
    config = snapshot.config
    try:
        if not len(X):
            if config.holdout == 0.0:
                raise NotCertifiable(
                    "this model holds no samples out (holdout = 0 and none flagged): an "
                    "operating point is certified on samples the learner never saw",
                    needed=None,
                    have=0,
                    hint=HOLDOUT_HINT,
                )
            raise NotCertifiable("no held-out sample yet", needed=None, have=0, hint=HOLDOUT_HINT)
        window = in_order(snapshot.ring, snapshot.pairs_seen, snapshot.window_size)
        pairs = held_out_pairs(
            snapshot.L,
            X,
            labels,
            window,
            algorithm=config.algorithm,
            seed=config.seed,
            stream=stream,
            version=snapshot.version,
        )
        return _Entry(snapshot, pairs, None, OrderedDict())
    except (NotCertifiable, NotEnoughHeldOut, ValueError) as exc:
        return _Entry(snapshot, None, _refusal(exc), OrderedDict())


def _refusal(exc: Exception) -> NotCertifiable:
    """The core's refusals as the domain's 409, with the hint."""
    if isinstance(exc, NotCertifiable):
        return exc
    if isinstance(exc, NotEnoughHeldOut):
        return NotCertifiable(str(exc), needed=exc.needed, have=exc.have, hint=HOLDOUT_HINT)
    return NotCertifiable(str(exc))


def point_of(entry: _Entry, target: Target) -> OperatingPoint:
    """The operating point of ``target`` on an evaluated entry (cached there); 409
    :class:`~service.errors.NotCertifiable` when it cannot be certified."""
    if entry.pairs is None:
        assert entry.error is not None
        raise _fresh(entry.error)
    found = entry.points.get(target)
    if found is None:
        try:
            far = target.value if target.kind == "far" else None
            frr = target.value if target.kind == "frr" else None
            found = operating_point(entry.pairs, far=far, frr=frr, delta=target.delta)
        except (NotEnoughHeldOut, ValueError) as exc:
            found = _refusal(exc)
        entry.points[target] = found
        while len(entry.points) > KEEP_POINTS:
            evicted, _ = entry.points.popitem(last=False)
            entry.encoded.pop(evicted, None)
    if isinstance(found, Exception):
        raise _fresh(found)
    return found


def wire_json(entry: _Entry, target: Target) -> tuple[OperatingPoint, str]:
    """:func:`point_of` and the point as the JSON text answers carry (:func:`wire`, encoded
    once per entry and target, compact as the service's JSON answers)."""
    point = point_of(entry, target)
    text = entry.encoded.get(target)
    if text is None:
        text = entry.encoded[target] = json.dumps(
            wire(point), allow_nan=False, separators=(",", ":")
        )
    return point, text


def _fresh(error: Exception) -> Exception:
    """A new exception like a cached one (raising one object again grows its traceback)."""
    if isinstance(error, NotCertifiable):
        return NotCertifiable(error.detail, **error.extra)
    return error


_CACHES: weakref.WeakKeyDictionary[Writer, OperatingCache] = weakref.WeakKeyDictionary()


def cache_of(writer: Writer) -> OperatingCache:
    """The cache of the writer that learns a model here (a new writer, a new cache)."""
    cache = _CACHES.get(writer)
    if cache is None:
        cache = _CACHES[writer] = OperatingCache(writer)
    return cache


def peek(writer: Writer, target: Target) -> OperatingPoint | None:
    """The newest cached operating point of ``target`` (for the gauges), without computing."""
    cache = _CACHES.get(writer)
    entry = None if cache is None else cache.newest
    if entry is None:
        return None
    with contextlib.suppress(Exception):
        return point_of(entry, target)
    return None


def observed(writer: Writer, config_point: Any) -> dict[str, Any]:
    """For the model's status (gauges, alert): the newest cached point of the configured
    target and whether it is certifiable (nothing for ``"eer"``). Never computes; from the
    event loop, starts the background refresh when the cache is behind the model (so a model
    nobody queries still has current gauges)."""
    target = target_of(None, None, config_point)
    if target is None:
        return {}
    cache = cache_of(writer)
    with contextlib.suppress(RuntimeError):  # no running loop: a status read off the loop
        asyncio.get_running_loop()
        cache._refresh_soon(writer.board.current.version)
    entry = cache.newest
    if entry is None:
        return {}
    try:
        return {"operating_point": point_of(entry, target), "certifiable": True}
    except NotCertifiable:
        return {"operating_point": None, "certifiable": False}


def wire(point: OperatingPoint) -> dict[str, Any]:
    """An operating point as answers carry it."""
    return {
        "kind": point.kind,
        "target": point.target,
        "threshold": point.threshold,
        "far_estimate": point.far_estimate,
        "far_bound": point.far_bound,
        "frr_estimate": point.frr_estimate,
        "frr_bound": point.frr_bound,
        "negatives": point.negatives,
        "positives": point.positives,
        "delta": point.delta,
        "version": point.version,
        "method": point.method,
        "grid": point.grid,
        "distance": point.distance,
        "window_far": point.window_far,
        "window_frr": point.window_frr,
        "statement": point.statement,
    }
