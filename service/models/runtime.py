"""One model at run time: the single writer that applies its log, and the snapshots queries read.

The writer task is the only code that touches the model's :class:`~service.core.Learner`. It
reads the log in id order after the last applied entry, applies a batch (``learn_many`` in a
worker thread, so the event loop keeps answering queries), then publishes an immutable
:class:`Snapshot`. Queries only ever read the latest snapshot, so they never see a half-applied
batch, and each answer's ``version`` is the seq of the last sample applied to that snapshot.

Backpressure (:meth:`ModelRuntime.wait_room`): appends wait while more than
``OPML_MAX_UNAPPLIED`` samples (by default two batches' worth, at most 2048) are logged but
unapplied, so the
log never runs far ahead of the learner: the ack-to-applied lag and the unapplied part of the
log stay bounded however hard clients push. Batches hold about
``min(OPML_BATCH_MAX, 2^24 / d^2)`` samples (about constant learning time per batch), so
snapshots are published often at any dimension.

Start-up: the latest checkpoint (or a fresh learner) plus a replay of the log tail. Because the
RNG state is part of the checkpoint and the log is the order of application, the result equals
applying every logged sample exactly once, in order.

Several processes on one Redis: each process keeps a runtime for every model and applies the
log into its own learner, but only the holder of the model's lease (:meth:`claim`) writes
checkpoints (and trims the log), each with its fencing token. A non-owner is a read replica: it
follows the log (woken by its own appends, else every ``OPML_POLL_INTERVAL_S``), and when it
finds the owner's checkpoint past its own position (the log behind it being trimmed) it loads
that checkpoint and continues from there. Owner and replica compute the same state, because it
is a function of the log alone; a replica that takes the lease over just starts checkpointing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from service import telemetry
from service.config import Settings
from service.core import Calibration, Learner, LearnerConfig, StepResult, StepResults
from service.storage.codec import (
    DTYPE,
    StreamId,
    after,
    decode_entry,
    decode_vector,
    encode_vector,
    format_id,
)
from service.storage.group_commit import GroupCommit
from service.storage.store import Checkpoint, Fenced, Store

log = logging.getLogger("service.runtime")

#: A batch holds at most about BATCH_WORK / d^2 samples (the O(d^2) step makes that ~constant
#: learning time: 4096 samples at d = 64, 64 at d = 512), so a snapshot is published every few
#: tens of milliseconds whatever the dimension; but never fewer than MIN_BATCH.
BATCH_WORK = 1 << 24
MIN_BATCH = 32
#: Most unapplied samples under the automatic backpressure bound (OPML_MAX_UNAPPLIED = 0).
AUTO_UNAPPLIED = 2048


def samples_per_batch(dim: int, batch_max: int) -> int:
    """Samples the writer applies per batch at dimension ``dim``: ``batch_max`` (OPML_BATCH_MAX),
    fewer at large d (about ``BATCH_WORK / d^2``, never fewer than ``MIN_BATCH``).

    >>> samples_per_batch(64, 4096), samples_per_batch(512, 4096)
    (4096, 64)
    """
    return max(MIN_BATCH, min(batch_max, BATCH_WORK // (dim * dim)))


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of a model after some applied log prefix.

    ``metric`` is a private :class:`Learner` holding only a copy of ``L``; the queries call its
    methods, so their arithmetic is the core's own. ``frobenius_norm`` (``||L||_F``, O(d^2) on
    that copy) and ``hinge_loss`` (mean hinge of the calibration window) are for telemetry.
    """

    version: int
    applied: StreamId
    metric: Learner
    counts: dict[str, int]
    classes: int
    calibration: Calibration
    metric_puts: int
    frobenius_norm: float
    hinge_loss: float | None


@dataclass
class CheckpointInfo:
    """What the last checkpoint covered and when it was written."""

    seq: int = 0
    at: float | None = None


@dataclass
class _Waiters:
    """Per-sample results kept for ``?wait=true`` requests still in flight.

    Each request registers a floor (every seq it can be given is above it); results at or below
    the smallest floor are dropped, and none are kept while nobody waits.
    """

    floors: dict[int, int] = field(default_factory=dict)
    results: dict[int, StepResult] = field(default_factory=dict)
    tokens: itertools.count[int] = field(default_factory=itertools.count)

    def prune(self) -> None:
        if not self.floors:
            self.results.clear()
            return
        low = min(self.floors.values())
        for seq in [s for s in self.results if s <= low]:
            del self.results[seq]


class ModelClosed(Exception):
    """The model was deleted (or the service is stopping) while a request waited on it."""


class ModelRuntime:
    """The live state of one model and its writer task."""

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
        self.store = store
        self.settings = settings
        self.learner = Learner(config)
        #: Appends to this model's log go through one queue (group commit).
        self.appender = GroupCommit(
            store,
            name,
            ttl_ms=settings.idempotency_ttl_s * 1000,
            max_classes=settings.max_classes,
            max_samples=settings.max_batch,
        )
        self.logged_seq = 0
        self.checkpoint = CheckpointInfo()
        self.metric_puts = 0
        self.snapshot = self._publishable((0, 0))
        self.caught_up = asyncio.Event()
        self._changed = asyncio.Event()
        self._kick = asyncio.Event()
        self._stopping = False
        self._closed = False
        self._waiters = _Waiters()
        self._task: asyncio.Task[None] | None = None
        self._since_checkpoint = 0  # samples applied since the last checkpoint
        self._per_entry = 1.0  # samples per log entry in the latest batch
        #: Appends waiting for the learner to catch up (FIFO, see :meth:`wait_room`).
        self._room = asyncio.Lock()
        self._room_waiters = 0
        self._appending = 0  # samples admitted by wait_room whose append has not returned
        #: Samples per batch: OPML_BATCH_MAX, fewer at large d (~ BATCH_WORK / d^2 of them).
        self.samples_per_batch = samples_per_batch(config.dim, settings.batch_max)
        #: Backpressure bound: OPML_MAX_UNAPPLIED, or automatically two batches, at most
        #: AUTO_UNAPPLIED (about constant learning time, hence lag, at any d: 2048 samples at
        #: d = 64, 128 at d = 512).
        self.unapplied_limit = settings.max_unapplied or min(
            AUTO_UNAPPLIED, max(MIN_BATCH, 2 * self.samples_per_batch)
        )
        self._dirty_since: float | None = None
        self._ckpt_applied: StreamId | None = None
        self._replaying = False  # applying the log tail found at start-up
        self.owner_id = owner_id
        #: Our fencing token while we hold the model's lease; None: we are a read replica.
        self.fencing_token: int | None = None
        self._lease_ok_at = 0.0  # monotonic start of the last successful claim
        #: Monotonic time of the latest log read that reached the end of the log.
        self.synced_at: float | None = None

    @property
    def owner(self) -> bool:
        """True while this process holds the model's lease (it alone writes checkpoints)."""
        return self.fencing_token is not None

    # -- lifecycle ---------------------------------------------------------------------------

    async def load(self) -> None:
        """Restore the latest checkpoint (the log tail is replayed by the writer)."""
        self._replaying = True
        ckpt = await self.store.read_checkpoint(self.name)
        self.logged_seq = await self.store.logged_seq(self.name)
        if ckpt is not None:
            self._restore(ckpt)

    async def _catch_up_to_checkpoint(self) -> None:
        """Another writer checkpointed past our position (and trimmed the log behind it):
        continue from its checkpoint, which is the state we would have reached."""
        ckpt = await self.store.read_checkpoint(self.name)
        if ckpt is None:
            return
        before = self.learner.counts
        self._restore(ckpt)
        for outcome, n in self.learner.counts.items():
            if n > before.get(outcome, 0):  # keep opml_steps_total summing to the version
                telemetry.STEPS.labels(self.name, outcome).inc(n - before.get(outcome, 0))

    def _restore(self, ckpt: Checkpoint) -> None:
        meta = ckpt.meta
        d = self.config.dim
        classes = meta["learner"]["classes"]
        rows = [decode_vector(ckpt.buffer[c], d) for c in classes]
        arrays = {
            "L": decode_vector(ckpt.L, d * d).reshape(d, d),
            "buffer": np.array(rows).reshape(len(rows), d),
            "calibration": np.frombuffer(ckpt.calibration, dtype=DTYPE).reshape(-1, 2),
        }
        self.learner = Learner.from_state(arrays, meta["learner"])
        self.metric_puts = int(meta.get("metric_puts", 0))
        self.checkpoint = CheckpointInfo(int(meta["seq"]), float(meta["time"]))
        applied = (int(meta["applied"][0]), int(meta["applied"][1]))
        self._ckpt_applied = applied
        self._since_checkpoint = 0
        self._dirty_since = None
        self._publish(applied)

    def start(self) -> None:
        telemetry.model_started(self.name, self.learner.counts)
        self._task = asyncio.create_task(self._run(), name=f"writer:{self.name}")

    async def stop(self, *, checkpoint: bool) -> None:
        """Let the writer finish its batch, then (optionally, if we own the model) write a
        final checkpoint and hand the lease back, so another process takes over at once."""
        self._stopping = True
        self._kick.set()
        if self._task is not None:
            await self._task
        self._closed = True
        self._changed.set()
        if not checkpoint or self.fencing_token is None:
            return
        try:
            if self.snapshot.applied != self._ckpt_applied:
                await self._write_checkpoint()
            if self.fencing_token is not None:
                await self.store.release_lease(self.name, self.owner_id, self.fencing_token)
        except RedisError as exc:
            telemetry.REDIS_ERRORS.labels("writer").inc()
            log.warning("%s: final checkpoint failed (%s); the log keeps it", self.name, exc)

    # -- the lease -----------------------------------------------------------------------------

    async def claim(self) -> None:
        """Renew our lease on the model, or take it if it is free (one step of the lease loop).

        A Redis error is raised to the caller; if the lease could not be renewed for longer than
        its TTL we stop counting on it (Redis fencing would refuse our checkpoints anyway).
        """
        ttl = self.settings.lease_ttl_s
        started = time.monotonic()
        try:
            ours, token = await self.store.claim_lease(
                self.name,
                self.owner_id,
                int(ttl * 1000),
                repr(self.created_at),
                self.fencing_token,
            )
        except RedisError:
            if self.fencing_token is not None and started - self._lease_ok_at > ttl:
                self._lose_lease("it could not be renewed")
            raise
        if not ours:
            if self.fencing_token is not None:
                self._lose_lease(f"token {token} was granted to another process")
            return
        if self.fencing_token != token:
            log.info("%s: this process now owns the model (fencing token %s)", self.name, token)
            self._kick.set()  # a checkpoint may be due
        self.fencing_token = token
        self._lease_ok_at = started

    def _lose_lease(self, why: str) -> None:
        log.warning("%s: lease lost (%s); following the log read-only", self.name, why)
        self.fencing_token = None

    def notify_logged(self, last_seq: int) -> None:
        """An append to this model's log succeeded: wake the writer."""
        self.logged_seq = max(self.logged_seq, last_seq)
        self._kick.set()

    # -- the writer ----------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping:
            try:
                read_at = time.monotonic()
                # Cleared before the read: an append that lands during the read sets it again,
                # so the wait below cannot sleep through it.
                self._kick.clear()
                # about samples_per_batch samples per batch, however many an entry holds
                per_batch = self.samples_per_batch
                count = max(1, min(per_batch, round(per_batch / self._per_entry)))
                tail = await self.store.read_tail(self.name, after(self.snapshot.applied), count)
                if tail.checkpoint_applied is not None:
                    if tail.checkpoint_applied > self.snapshot.applied:
                        await self._catch_up_to_checkpoint()
                        continue
                    if tail.checkpoint_applied[0] > self.checkpoint.seq:  # another's checkpoint
                        self.checkpoint = CheckpointInfo(
                            tail.checkpoint_applied[0], tail.checkpoint_time
                        )
                entries = tail.entries
                if entries:
                    await self._apply(entries)
                if len(entries) < count:
                    self.caught_up.set()
                    self._replaying = False
                    self.synced_at = read_at
                if self.fencing_token is not None and self._checkpoint_due():
                    await self._write_checkpoint()
                backoff = 0.1
                if not entries:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), self.settings.poll_interval_s)
            except RedisError as exc:
                telemetry.REDIS_ERRORS.labels("writer").inc()
                log.warning("%s: Redis error in the writer (%s); retrying", self.name, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:
                log.exception("%s: writer failed; retrying", self.name)
                await asyncio.sleep(1.0)

    async def _apply(self, entries: list[tuple[StreamId, dict[bytes, bytes]]]) -> None:
        started = time.perf_counter()
        # Decoding, learning and building the snapshot all run in the worker thread (the
        # compiled kernel releases the GIL), so the event loop stays free for ingestion and
        # queries; only the bookkeeping below runs on it.
        runs, snapshot, samples = await asyncio.to_thread(self._apply_entries, entries)
        for seqs, results in runs:
            self._record(seqs, results)
        self._since_checkpoint += samples
        self._per_entry = max(1.0, samples / len(entries))
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()
        self._install(snapshot)
        telemetry.UPDATE_DURATION.labels(self.name).observe(time.perf_counter() - started)

    def _apply_entries(
        self, entries: list[tuple[StreamId, dict[bytes, bytes]]]
    ) -> tuple[list[tuple[list[int], StepResults]], Snapshot, int]:
        """Apply log entries in order (worker thread): per run of sample entries, the seqs of
        its samples and their results; the snapshot after the last entry; the sample count."""
        d = self.config.dim
        runs: list[tuple[list[int], StepResults]] = []
        blocks: list[np.ndarray[Any, Any]] = []
        keys: list[str] = []
        seqs: list[int] = []
        samples = 0

        def flush() -> None:
            if blocks:
                X = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
                runs.append((list(seqs), self.learner.learn_many(X, keys)))
                blocks.clear()
                keys.clear()
                seqs.clear()

        for (last, _part), fields in entries:
            if b"L" in fields:  # a metric replacement, ordered in the log (PUT metric)
                flush()
                self.learner.set_metric(decode_vector(fields[b"L"], d * d).reshape(d, d))
                self.metric_puts += 1
                continue
            X, labels = decode_entry(fields, d)
            blocks.append(X)
            keys.extend(labels)
            seqs.extend(range(last - len(labels) + 1, last + 1))
            samples += len(labels)
        flush()
        return runs, self._publishable(entries[-1][0]), samples

    def _record(self, seqs: list[int], results: StepResults) -> None:
        for outcome, n in results.counts().items():
            if n:
                telemetry.STEPS.labels(self.name, outcome).inc(n)
        if self._replaying:
            telemetry.REPLAYED.labels(self.name).inc(len(results))
        if self._waiters.floors:
            low = min(self._waiters.floors.values())
            for seq, result in zip(seqs, results, strict=True):
                if seq > low:
                    self._waiters.results[seq] = result

    def _publishable(self, applied: StreamId) -> Snapshot:
        metric = Learner(self.config)
        metric.set_metric(self.learner.L)
        window, _ = self.learner.calibrator.to_state()
        hinge = np.maximum(self.config.margin + window[:, 0] - window[:, 1], 0.0)  # Eq. 4
        return Snapshot(
            version=self.learner.version,
            applied=applied,
            metric=metric,
            counts=self.learner.counts,
            classes=self.learner.n_classes,
            calibration=self.learner.calibrator.calibration(),
            metric_puts=self.metric_puts,
            frobenius_norm=float(np.linalg.norm(metric.L)),
            hinge_loss=float(hinge.mean()) if len(hinge) else None,
        )

    def _publish(self, applied: StreamId) -> None:
        self._install(self._publishable(applied))

    def _install(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` the one queries read, and wake whoever waits for a change."""
        self.snapshot = snapshot
        self.logged_seq = max(self.logged_seq, self.snapshot.version)
        self._wake()

    def _wake(self) -> None:
        """Wake everyone waiting for a change (new snapshot, room for appends, closing)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- checkpoints ---------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        if self._since_checkpoint >= self.settings.checkpoint_every:
            return True
        return (
            self._dirty_since is not None
            and time.monotonic() - self._dirty_since >= self.settings.checkpoint_interval_s
        )

    async def _write_checkpoint(self) -> None:
        """Checkpoint the learner as of the current snapshot and trim the log behind it
        (owner only: Redis refuses it if our fencing token is no longer the latest)."""
        token = self.fencing_token
        if token is None:
            return
        started = time.perf_counter()
        applied = self.snapshot.applied
        arrays, learner_meta = self.learner.to_state()
        now = time.time()
        meta = {
            "learner": learner_meta,
            "seq": self.learner.version,
            "applied": list(applied),
            "metric_puts": self.metric_puts,
            "time": now,
            "dtype": DTYPE.str,
        }
        buffer = [
            (label, encode_vector(row))
            for label, row in zip(learner_meta["classes"], arrays["buffer"], strict=True)
        ]
        try:
            written = await self.store.write_checkpoint(
                self.name,
                meta,
                encode_vector(arrays["L"]),
                encode_vector(arrays["calibration"]),
                buffer,
                trim_min_id=after(applied),
                fencing_token=token,
                applied=format_id(applied),
                time=now,
            )
        except Fenced:
            telemetry.CHECKPOINTS_FENCED.labels(self.name).inc()
            self._lose_lease(f"Redis refused a checkpoint with the stale fencing token {token}")
            return
        if not written:
            return
        self._ckpt_applied = applied
        self._since_checkpoint = 0
        self._dirty_since = None
        self.checkpoint = CheckpointInfo(self.learner.version, now)
        telemetry.CHECKPOINT_DURATION.labels(self.name).observe(time.perf_counter() - started)
        log.debug("%s: checkpoint at %s", self.name, format_id(applied))

    # -- waiting -------------------------------------------------------------------------------

    @property
    def unapplied(self) -> int:
        """Samples logged (or being appended) through this process, or seen in the log, that
        the learner has not applied yet."""
        return self.logged_seq + self._appending - self.snapshot.version

    async def wait_room(self, samples: int, timeout: float) -> bool:
        """Backpressure: wait while more than :attr:`unapplied_limit` samples are unapplied
        (False if ``timeout`` runs out); on True, ``samples`` count as unapplied until the
        caller's :meth:`done_appending`. Waiters pass in arrival order, and a caller that finds
        room and nobody waiting returns without suspending, so appends that call this first
        are still logged in call order."""
        limit = self.unapplied_limit
        if self._room_waiters == 0 and self.unapplied <= limit:
            self._appending += samples
            return True
        started = time.monotonic()
        deadline = started + timeout
        self._room_waiters += 1
        try:
            async with self._room:
                while self.unapplied > limit:
                    if self._closed:
                        raise ModelClosed(self.name)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), remaining)
                self._appending += samples
                return True
        finally:
            self._room_waiters -= 1
            telemetry.BACKPRESSURE_WAIT.labels(self.name).observe(time.monotonic() - started)

    def done_appending(self, samples: int) -> None:
        """The append admitted by :meth:`wait_room` finished (logged: ``logged_seq`` counts
        it now; or failed); wake the next waiter."""
        self._appending -= samples
        if self._room_waiters:  # a failed append frees room without a new snapshot
            self._wake()

    async def wait_applied(self, target: StreamId, timeout: float) -> bool:
        """Wait until the log entry ``target`` is applied; False if ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        while self.snapshot.applied < target:
            if self._closed:
                raise ModelClosed(self.name)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    async def wait_change(self, seen: Snapshot) -> None:
        """Return once a snapshot newer than ``seen`` is published (or the model closes)."""
        while self.snapshot is seen and not self._closed:
            await self._changed.wait()
        if self._closed:
            raise ModelClosed(self.name)

    def want_results(self) -> int:
        """Register interest in per-sample results (for ``?wait=true``); returns a token."""
        token = next(self._waiters.tokens)
        self._waiters.floors[token] = self.snapshot.version
        return token

    def raise_floor(self, token: int, floor: int) -> None:
        self._waiters.floors[token] = floor
        self._waiters.prune()

    def results(self, first: int, last: int) -> list[dict[str, Any]] | None:
        """Per-sample results of seqs ``first..last`` if still kept, else None."""
        kept = self._waiters.results
        if any(seq not in kept for seq in range(first, last + 1)):
            return None
        return [{"seq": seq, **kept[seq].to_dict()} for seq in range(first, last + 1)]

    def release(self, token: int) -> None:
        self._waiters.floors.pop(token, None)
        self._waiters.prune()
