"""One model at run time: its writer, lease, admission control, results, and the operations on
it (ingest, replace the metric, read a snapshot), in the domain's terms: arrays and class keys
in, results out; nothing here knows HTTP.

The parts, each in a module named for its job:

* :mod:`service.engine.writer` -- the single writer task: log -> learner -> snapshots,
  checkpoints;
* :mod:`service.engine.snapshot` -- the immutable snapshots queries read, and waits on them;
* :mod:`service.engine.lease` -- whether this process owns the model (applies and checkpoints);
* :mod:`service.engine.admission` -- learner backpressure before an append;
* :mod:`service.engine.results` -- per-sample results for ``?wait=true``;
* :mod:`service.engine.gallery` -- the identification gallery, kept transformed by ``L``;
* :mod:`service.storage.group_commit` -- the model's append queue (one Lua call for the requests
  and frames that arrive together).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from service import telemetry
from service.config import Settings
from service.core import LearnerConfig
from service.core._validation import Array
from service.engine.admission import Admission, unapplied_limit
from service.engine.gallery import Gallery
from service.engine.lease import Lease
from service.engine.results import StepResultsKeeper
from service.engine.snapshot import ModelClosed, Snapshot
from service.engine.status import ModelStatus
from service.engine.writer import Writer
from service.errors import Conflict, LimitExceeded, NotFound, Unavailable
from service.storage.codec import StreamId, encode_vector, sample_id
from service.storage.group_commit import GroupCommit
from service.storage.store import Appended, Group, NoSuchModel, Store, TooManyClasses

log = logging.getLogger("service.runtime")


@dataclass(frozen=True)
class IngestResult:
    """What an ingestion gets back: its seqs, whether it replayed an earlier answer, and with
    ``wait`` the version that includes it and its per-sample results (None when a replay's
    results are no longer kept)."""

    accepted: int
    first_seq: int
    last_seq: int
    replayed: bool
    version: int | None = None
    results: list[dict[str, Any]] | None = None


def fingerprint(X: Array, keys: list[str]) -> str:
    """A digest of an append's samples (an idempotency key reused with other samples is 409).

    >>> fingerprint(np.zeros((1, 2)), ["a"]) == fingerprint(np.zeros((1, 2)), ["a"])
    True
    """
    h = hashlib.sha256(np.ascontiguousarray(X).tobytes())
    h.update("\x00".join(keys).encode())
    return h.hexdigest()[:32]


class ModelRuntime:
    """The live state of one model and the operations on it (see the module docstring)."""

    def __init__(
        self,
        name: str,
        config: LearnerConfig,
        created_at: float,
        store: Store,
        settings: Settings,
        owner_id: str,
    ) -> None:
        self.name = name
        self.config = config
        self.created_at = created_at
        self.settings = settings
        self.metrics = telemetry.ModelMetrics(name, {})
        self.lease = Lease(store, name, owner_id, created_at, settings.lease_ttl_s)
        self.results = StepResultsKeeper()
        self.writer = Writer(name, config, store, settings, self.lease, self.results, self.metrics)
        self.admission = Admission(
            unapplied_limit(config.dim, settings.batch_max, settings.max_unapplied),
            self.writer.board,
            lambda: self.writer.logged_seq - self.writer.board.current.version,
            self.metrics.backpressure_wait,
        )
        #: Appends to this model's log go through one queue (group commit).
        self.appender = GroupCommit(
            store,
            name,
            ttl_ms=settings.idempotency_ttl_s * 1000,
            max_classes=settings.max_classes,
            max_samples=settings.max_batch,
        )
        self.store = store
        #: The identification gallery (served by the process that serves the model).
        self.gallery = Gallery(name, config, store, settings, self.writer.board, self.metrics)

    @property
    def snapshot(self) -> Snapshot:
        """The latest published snapshot."""
        return self.writer.board.current

    # -- lifecycle ---------------------------------------------------------------------------

    async def load(self) -> None:
        """Restore the latest checkpoint and try to take the lease (the writer replays the
        log tail once started)."""
        await self.writer.load()
        await self.gallery.load()
        self.metrics.count_steps(self.writer.learner.counts)
        await self.claim()

    def start(self) -> None:
        self.writer.start()
        self.gallery.start()

    async def claim(self) -> None:
        """Renew or take the lease, and pick up gallery changes made through other processes
        (a Redis error is raised to the caller)."""
        if await self.lease.claim():
            self.writer.kick()  # a checkpoint may be due
        await self.gallery.sync()

    async def stop(self, *, checkpoint: bool) -> None:
        """Stop the writer after its batch; with ``checkpoint`` (and while we own the model)
        write a final checkpoint and hand the lease back, so another process takes over at
        once."""
        await self.gallery.stop()
        try:
            await self.writer.stop(final_checkpoint=checkpoint)
            if checkpoint:
                await self.lease.release()
        except RedisError as exc:
            telemetry.REDIS_ERROR["writer"].inc()
            log.warning("%s: final checkpoint failed (%s); the log keeps it", self.name, exc)

    def status(self) -> ModelStatus:
        """The model's status as of its latest snapshot."""
        w = self.writer
        return ModelStatus(
            name=self.name,
            config=self.config,
            created_at=self.created_at,
            snapshot=w.board.current,
            logged_seq=max(w.logged_seq, w.board.current.version),
            checkpoint_seq=w.checkpoint.seq,
            checkpoint_at=w.checkpoint.at,
            owner=self.lease.held,
            fencing_token=self.lease.token,
            staleness_s=None if w.synced_at is None else max(0.0, time.monotonic() - w.synced_at),
        )

    # -- operations ----------------------------------------------------------------------------

    async def ingest(
        self, X: Array, keys: list[str], *, idempotency_field: str = "", wait: bool = False
    ) -> IngestResult:
        """Append validated samples (rows of ``X``, their class keys) atomically to the log,
        and with ``wait`` wait until they are applied."""
        token = self.results.want(self.snapshot.version) if wait else None
        try:
            appended = await self._append(X, keys, idempotency_field)
            n = appended.last_seq - appended.first_seq + 1
            if token is None:
                return IngestResult(n, appended.first_seq, appended.last_seq, appended.replayed)
            self.results.raise_floor(token, appended.first_seq - 1)
            await self._wait_applied((appended.last_seq, 1), appended.first_seq, appended.last_seq)
            return IngestResult(
                n,
                appended.first_seq,
                appended.last_seq,
                appended.replayed,
                self.snapshot.version,
                self.results.results(appended.first_seq, appended.last_seq),
            )
        finally:
            if token is not None:
                self.results.release(token)

    async def _append(self, X: Array, keys: list[str], idempotency_field: str) -> Appended:
        """Admit (backpressure), then log the samples atomically."""
        s = self.settings
        digest = fingerprint(X, keys)
        try:
            room = await self.admission.wait_room(len(keys), s.apply_wait_s)  # in call order
        except ModelClosed:
            raise NotFound(f"model {self.name!r} was deleted") from None
        if not room:
            raise Unavailable(
                f"the learner is {self.admission.unapplied} samples behind the log (more than "
                f"{self.admission.limit}: OPML_MAX_UNAPPLIED) and did not catch up within "
                f"{s.apply_wait_s:g} s; nothing was logged, retry later",
                retry_after=2,
            )
        try:
            # No await between the room check and this enqueue: calls are logged in call order.
            appended = await self.appender.append(
                Group(encode_vector(X), keys, idempotency_field, digest)
            )
            if not appended.replayed:
                self.writer.notify_logged(appended.last_seq)  # before admission.done: no gap
        except NoSuchModel:
            raise NotFound(f"model {self.name!r} does not exist") from None
        except TooManyClasses as exc:
            raise LimitExceeded(
                f"the model has {exc.have} classes; at most {s.max_classes} per model "
                "(OPML_MAX_CLASSES)"
            ) from None
        finally:
            self.admission.done(len(keys))
        if appended.replayed and appended.fingerprint != digest:
            raise Conflict(
                "this idempotency key / frame id was used for different samples",
                first_seq=appended.first_seq,
                last_seq=appended.last_seq,
            )
        return appended

    async def _reached(self, target: StreamId, timeout: float) -> bool:
        """Wait (bounded) until log entry ``target`` is applied; NotFound if the model goes."""
        try:
            return await self.writer.board.wait_applied(target, timeout)
        except ModelClosed:
            raise NotFound(f"model {self.name!r} was deleted") from None

    async def _wait_applied(self, target: StreamId, first: int, last: int) -> None:
        if not await self._reached(target, self.settings.apply_wait_s):
            raise Unavailable(
                f"logged as seqs {first}..{last} (entry {sample_id(last)}) but not applied "
                f"within {self.settings.apply_wait_s:g} s; query with min_version={last}",
                retry_after=2,
                first_seq=first,
                last_seq=last,
            )

    async def put_metric(self, L: Array) -> None:
        """Log a metric replacement after every sample logged so far; wait until applied."""
        try:
            entry = await self.store.append_metric(self.name, encode_vector(L))
        except NoSuchModel:
            raise NotFound(f"model {self.name!r} does not exist") from None
        self.writer.notify_logged(entry[0])
        await self._wait_applied(entry, entry[0], entry[0])

    async def read(self, min_version: int | None) -> Snapshot:
        """The latest snapshot, after waiting (bounded) for ``min_version`` if given."""
        snap = self.snapshot
        if min_version is None or snap.version >= min_version:
            return snap
        wait_s = self.settings.min_version_wait_s
        if not await self._reached((min_version, 1), wait_s):
            raise Unavailable(
                f"version {min_version} not reached within {wait_s:g} s (now "
                f"{self.snapshot.version}, logged {self.writer.logged_seq})",
                retry_after=1,
                version=self.snapshot.version,
            )
        return self.snapshot
