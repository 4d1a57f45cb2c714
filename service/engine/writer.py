"""The single writer of one model: reads its log in order, learns, publishes, checkpoints.

The writer task is the only code that touches the model's :class:`~service.core.Learner`. It
reads the log in id order after the last applied entry, applies a batch (decoding, learning and
building the snapshot in a worker thread, so the event loop keeps answering), then publishes an
immutable :class:`~service.engine.snapshot.Snapshot` on the model's board. Batches hold about
``min(OPML_BATCH_MAX, 2^24 / d^2)`` samples (:func:`~service.engine.admission.sample_work`;
about constant learning time per batch), so snapshots are published often at any dimension.

Start-up: the latest checkpoint (or a fresh learner) plus a replay of the log tail. Because the
RNG state is part of the checkpoint and the log is the order of application, the result equals
applying every logged sample exactly once, in order.

A writer runs only in the process that owns the model (holds its lease): the others hold no
learner state for it at all. Checkpoints, each with the lease's fencing token: every
``OPML_CHECKPOINT_EVERY`` samples or ``OPML_CHECKPOINT_INTERVAL_S`` after the first unsaved
change, and on a graceful stop or hand-over; each one trims the log behind it. After every batch
the writer also publishes its applied seq in the model's meta hash (in the same round trip as
its next read), for the admission control of processes that append but do not learn. After a
batch that reached the end of the log that next read waits for the next append, at most
:data:`PUBLISH_DELAY_S`: with one sample per request it then shares the next batch's read
instead of costing a Redis round trip (and a write, under ``appendfsync always`` an fsync) of its
own per sample.

An append made through this process is also handed to the writer as it was logged
(:meth:`Writer.offer`), so with one sample per request the writer need not read it back: it
applies an offered entry in place of a read when that entry is certainly the next one of the
log (its first seq follows the applied version, and no metric replacement was logged that is
not applied yet: the append script returns the count of those, ``puts``), while the lease is
held, the log tail found at start-up is applied, and no replicas are awaited. A read still
happens at least every :data:`SKIP_READ_S`: it publishes the applied seq, sees entries appended
through other processes, and notices a checkpoint written by another owner. While offered
entries flow it reads one entry, not a batch, beside the learning of the batch that starts with
that entry: when that entry is not the offered one, the next step reads the log rather than
applying offered entries (a batch of entries read back costs its bytes a second time through
Redis and the decoder). That read and the checkpoint writes are the writer's *chores*: one at a
time, each runs beside the next batch instead of between two (:meth:`Writer._start_chore`).
The entries are the same bytes either way (the offered one is the very group that the append
script logged), so the learner's result does not change; an offered entry also comes with the
samples it was encoded from (rows, class keys, flags), which are what decoding its bytes gives
back, so it is not decoded either.

Offered appends of a few samples are held back a little before they are learned, so that one
batch learns several of them (with one sample per request, most of the cost of learning a
sample is the batch's own: a snapshot, its reports, the bookkeeping): until
:data:`COALESCE_SAMPLES` samples are offered or the oldest has waited :data:`APPLY_DELAY_S`,
unless someone waits for the next snapshot (a ``min_version`` query, a ``?wait=true``
ingestion, an append held back by admission control: :attr:`SnapshotBoard.waiting`), who gets
it at once. The acknowledgements do not wait for learning, so this only adds to the
ack-to-applied lag, at most :data:`APPLY_DELAY_S`.

It wakes when an append through this process logged something (:meth:`Writer.notify_logged`),
when the registry relays an append made through another process (the model's
``opml:wake:<name>`` pub/sub channel: :meth:`Writer.heard_append`), and at the latest every
``OPML_POLL_INTERVAL_S``. A wake that brings nothing new (within :data:`SKIP_READ_S` of a read,
no other process heard from, every append of this process that returned applied) reads
nothing: what the log holds beyond the applied state is then this process's appends in flight,
applied as offered when they return (:meth:`Writer._nothing_new`).
If it finds a checkpoint past its own position, another process has taken the model over: it
stops applying and gives the lease up (the registry then drops it).

Certificates (:mod:`service.engine.certify`) read the learner's held-out state under the
writer's learning lock, so it matches the published snapshot; with ``OPML_CERTIFICATE_EVERY``
the writer refreshes one in the background every that many versions, for the gauges.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np

from service import telemetry
from service.config import Settings
from service.core import Learner, LearnerConfig, StepResults
from service.core._validation import Array
from service.core.certificates import Certificate, Method
from service.core.holdout import Holdout, SampleWindow
from service.engine.admission import sample_work, samples_per_batch
from service.engine.certify import certify
from service.engine.checkpointing import CheckpointInfo, CheckpointSchedule, PendingCheckpoint
from service.engine.lease import Lease
from service.engine.offered import Decoded, Entries, OfferedEntries
from service.engine.results import StepResultsKeeper
from service.engine.snapshot import Snapshot, SnapshotBoard
from service.engine.tasks import stop_task, wait_event
from service.errors import NotCertifiable, Unavailable
from service.storage import checkpoint
from service.storage.codec import (
    StreamId,
    after,
    decode_entry,
    decode_vector,
    entry_flags,
    format_id,
)
from service.storage.store import Appended, Fenced, Group, Overtaken, Store, Tail

log = logging.getLogger("service.writer")

#: Longest wait, after a batch that reached the end of the log, before the read that publishes
#: its applied seq (see the module docstring); the admission control of other processes polls
#: that seq about as often (``service.engine.runtime.FOLLOWER_POLL_S``).
PUBLISH_DELAY_S = 0.02
#: An offered entry is applied without a read only this soon after the latest read.
SKIP_READ_S = PUBLISH_DELAY_S
#: Offered appends are learned together once this many samples are offered (at most a batch)...
COALESCE_SAMPLES = 64
#: ... or once the oldest of them was offered this long ago: with a slow stream most of a
#: batch's cost is fixed, so fewer, larger batches cost less per request. A waiter ends the
#: hold at once and the ack never waits for it (docs/design/apply-hold.md).
APPLY_DELAY_S = 0.05
#: A hold with less than this left counts as over: the event loop's timers fire in whole
#: milliseconds, often just before a fractional deadline (docs/design/apply-hold.md).
HOLD_RESOLUTION_S = 0.001
#: A batch of at most this many multiply-adds (:func:`sample_work` x samples) is applied on the
#: event loop, not in a worker thread: 256 samples at d = 64, 16 at d = 256, one ``sgd_psd``
#: sample at d = 64 (at most about a millisecond).
#: A small batch is faster on the loop than in a worker thread, which behind a busy event loop
#: waits for the GIL (up to the 5 ms switch interval) between its kernels.
INLINE_WORK = 1 << 20
#: Latest applied samples kept per model for the console (``d`` floats each, in memory only).
RECENT_SAMPLES = 512


class Writer:
    """The writer task of one model (see the module docstring)."""

    def __init__(
        self,
        name: str,
        config: LearnerConfig,
        store: Store,
        settings: Settings,
        lease: Lease,
        results: StepResultsKeeper,
        series: telemetry.ModelTelemetry,
    ) -> None:
        self.name = name
        self.store = store
        self.settings = settings
        self.lease = lease
        #: The model's created_at stamp as Redis holds it: the scripts that write refuse (or
        #: skip) another incarnation of the model.
        self._created = repr(lease.created_at)
        self.results = results
        self.telemetry = series
        self.learner = Learner(config)
        self.metric_puts = 0
        self.board = SnapshotBoard(Snapshot.of(self.learner, (0, 0), 0))
        self.board.on_wait = self.kick  # someone waits for the next snapshot: no delay
        #: The highest seq known to be logged (our appends, the log, the applied state).
        self.logged_seq = 0
        self.checkpoint = CheckpointInfo()
        #: Monotonic time of the latest log read that reached the end of the log.
        self.synced_at: float | None = None
        #: Set once the log found at start-up has been applied.
        self.caught_up = asyncio.Event()
        self.samples_per_batch = samples_per_batch(sample_work(config), settings.batch_max)
        self._kick = asyncio.Event()
        #: Whether the task waits out a hold of offered appends (:meth:`_hold`).
        self._holding = False
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        #: Samples applied since the latest checkpoint, and since when.
        self.unsaved = CheckpointSchedule(settings.checkpoint_every, settings.checkpoint_interval_s)
        self._saved: StreamId | None = None  # log position of our latest checkpoint
        self._per_entry = 1.0  # samples per log entry in the latest batch
        self._replaying = False  # applying the log tail found at start-up
        #: Appends of this process as logged (:meth:`offer`).
        self._offered = OfferedEntries()
        self._read_at: float | None = None  # monotonic time of the latest log read
        #: The one Redis job the writer runs beside its batches (:meth:`_start_chore`): the periodic
        #: one-entry read or a checkpoint write.
        self._chore: asyncio.Task[None] | None = None
        #: A one-entry read did not find the offered entry it expected: read before offered
        #: entries are applied again.
        self._unconfirmed = False
        #: Another process appended (the registry heard it on the model's channel) since the
        #: latest read.
        self._heard = False
        self.offered_applied = 0  # entries applied as offered (not read back)
        #: Held while the learner changes (a batch, from reading it to publishing its
        #: snapshot), so a copy taken under it matches the published snapshot.
        self._learning = asyncio.Lock()
        #: One certificate at a time per model: at most one copy of its held-out state.
        self._one_certificate = asyncio.Lock()
        #: The latest periodic certificate (OPML_CERTIFICATE_EVERY; None: none yet, or off).
        self.latest_certificate: Certificate | None = None
        self._certified_version = 0  # version of the latest periodic certificate attempt
        self._certifying: asyncio.Task[None] | None = None
        self._certificate_again = False  # a certificate fell due while one was computing
        #: The latest applied samples (in memory only, empty after a restart): the console's
        #: picture of the classes (:meth:`recent_samples`).
        self.recent = SampleWindow(RECENT_SAMPLES, config.dim)
        #: The latest rows of a batch being applied (worker thread), moved into :attr:`recent`
        #: on the event loop when the batch's snapshot is published: readers never wait.
        self._fresh: list[tuple[Array, list[str]]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def load(self) -> None:
        """Restore the latest checkpoint (the log tail is replayed by the writer task)."""
        self._replaying = True
        fields = await self.store.read_checkpoint(self.name)
        self.notify_logged(await self.store.logged_seq(self.name))
        if fields is not None:
            self._restore(checkpoint.decode(*fields, dim=self.learner.dim))
        self.telemetry.learning(self.learner.counts)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"writer:{self.name}")

    async def stop(self, *, final_checkpoint: bool, moved: bool) -> None:
        """Let the task finish its batch; then (``final_checkpoint``, while we own the model)
        write a final checkpoint. Every waiter on the board gets ModelClosed (``moved``: the
        model lives on elsewhere)."""
        self._stopping = True
        self._kick.set()
        if self._task is not None:
            await self._task
        if self._chore is not None:
            await self._chore  # bounded by the socket timeout; it handles its own errors
        if self._certifying is not None:
            await stop_task(self._certifying)
        self.board.close(moved=moved)
        if final_checkpoint and self.lease.held and self.board.current.applied != self._saved:
            await self._write_checkpoint()

    def notify_logged(self, last_seq: int) -> None:
        """Samples up to ``last_seq`` are in the log: wake the task, unless it holds offered
        appends back (:meth:`_hold`) and all that is logged beyond the applied state is still
        short of a batch: the hold would go on to the same end (one sample per request: one
        wake per batch instead of one per sample). An urgent waiter wakes it regardless."""
        self.logged_seq = max(self.logged_seq, last_seq)
        if self._holding and self.logged_seq - self.board.current.version < self._coalesce():
            return
        self._kick.set()

    def offer(self, appended: Appended, group: Group, decoded: Decoded | None = None) -> None:
        """``group`` was logged by this process as one entry (``appended``): keep it, to be
        applied without a read when it is the log's next entry (see the module docstring).
        ``decoded``: the samples ``group`` was encoded from (what decoding it gives back)."""
        self._offered.add(appended, group, decoded, time.monotonic())

    def _coalesce(self) -> int:
        """How many offered samples make a batch that is not held back."""
        return min(COALESCE_SAMPLES, self.samples_per_batch)

    def _hold(self, now: float) -> float:
        """How long to hold the offered entries that follow the applied state back (the
        caller saw one), to learn them with the next ones (0: learn them now; see the module
        docstring)."""
        if self._stopping or self.board.waiting:
            return 0.0
        due = self._offered.held_until(self.board.current.version, self._coalesce(), APPLY_DELAY_S)
        if due is None:
            return 0.0
        left = due - now
        return left if left >= HOLD_RESOLUTION_S else 0.0

    def _may_apply_offered(self) -> bool:
        """Whether offered entries may stand in for reads now (see the module docstring)."""
        return (
            self._read_at is not None
            and not self._replaying
            and not self._unconfirmed
            and self.lease.held
            and not self.store.wait_replicas
        )

    def _read_recently(self, now: float) -> bool:
        return self._read_at is not None and now - self._read_at < SKIP_READ_S

    async def _light_read(self, read_at: float, current: Snapshot, expected: StreamId) -> None:
        """The read due every :data:`SKIP_READ_S` while offered entries flow, of one entry
        (not a batch: the offered ones are the same bytes), run beside the learning of those
        entries (:meth:`_start_chore`): it publishes the applied seq and shows a checkpoint of
        another owner. When that entry is not the offered one the writer was about to apply,
        the next step reads the log instead of applying offered entries. ``current``: the
        snapshot it reads after; ``expected``: the id of the offered entry that follows."""
        tail = await self.store.read_tail(
            self.name, after(current.applied), 1, applied=current.version, created_at=self._created
        )
        self._read_at = read_at
        if self._overtaken(tail):
            self._kick.set()
        elif not tail.entries or tail.entries[0][0] != expected:
            self._unconfirmed = True
            log.warning(
                "%s: the log's entry after %s is not the one this process appended there; "
                "reading the log", self.name, format_id(current.applied),
            )  # fmt: skip
            self._kick.set()

    def _start_chore(self, job: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``job`` (a Redis round trip: :meth:`_light_read` or a checkpoint write) as the
        writer's one chore: beside the next batch rather than between two (each waits behind the
        appends' fsyncs in Redis; awaited, they would leave the learner idle). One at a time: a
        checkpoint's trim would make a read running beside it find its entry gone. A failure is
        logged and the chore falls due again."""

        async def chore() -> None:
            try:
                await job
            except Unavailable as exc:
                telemetry.REDIS_ERROR["writer"].inc()
                log.warning("%s: Redis error in the writer's %s (%s)", self.name, what, exc)
            except Exception:
                log.exception("%s: the writer's %s failed", self.name, what)

        self._chore = asyncio.create_task(chore(), name=f"writer-{what}:{self.name}")

    def _chore_free(self) -> bool:
        return self._chore is None or self._chore.done()

    def _chores(self, read_at: float) -> None:
        """Start the checkpoint or the one-entry read that is due, if no chore runs."""
        if not self._chore_free():
            return
        if self.lease.held and self._checkpoint_due():
            pending = self._encode_checkpoint()
            if pending is not None:
                self._start_chore(self._save_checkpoint(pending), "checkpoint")
        elif not self._read_recently(read_at) and self._may_apply_offered():
            current = self.board.current
            offered = self._offered.next_of(current.version)
            if offered is not None:
                self._start_chore(self._light_read(read_at, current, offered.entry[0]), "read")

    def _overtaken(self, tail: Tail) -> bool:
        """Whether another process checkpointed past the applied state: then it owns the model
        (we were paused past our lease, or fenced); stop learning (the registry drops us)."""
        checkpointed = tail.checkpoint_applied
        if checkpointed is None or checkpointed <= self.board.current.applied:
            return False
        self._give_up("another process checkpointed past this one's position")
        return True

    def _give_up(self, why: str) -> None:
        """Another owner's checkpoint is past this writer's state: lose the lease and stop
        learning (the registry drops this writer and may later take the model afresh)."""
        self.lease.lose(why)
        self._stopping = True

    def kick(self) -> None:
        """Look at the log (and whether a checkpoint is due) now."""
        self._kick.set()

    def heard_append(self) -> None:
        """Another process appended to the log: read it now."""
        self._heard = True
        self._kick.set()

    def _nothing_new(self, now: float) -> bool:
        """Whether a read now would find nothing this writer does not get otherwise: it read
        within :data:`SKIP_READ_S`, no other process's append was heard since, and every
        append of this process that returned is applied. Then the log's next entries, if any,
        are this process's appends still in flight, which are offered when they return; read
        now, they were read back from Redis and decoded, and their offers wasted (one sample
        per JSON frame: the writer woken by an append that returned while it applied the
        previous ones read the next group commit's ~60 entries, 4 % of the service's CPU)."""
        return (
            self._may_apply_offered()
            and self._read_recently(now)
            and not self._heard
            and self.logged_seq <= self.board.current.version
        )

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping:
            try:
                wait = await self._step()
                backoff = 0.1
                if wait > 0:
                    await wait_event(self._kick, wait)
            except Unavailable as exc:
                telemetry.REDIS_ERROR["writer"].inc()
                log.warning("%s: Redis error in the writer (%s); retrying", self.name, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:
                log.exception("%s: writer failed; retrying", self.name)
                await asyncio.sleep(1.0)

    async def _step(self) -> float:
        """Read and apply one batch (checkpoint when due); how long the next read may wait for
        an append: 0 while the log has more, :data:`PUBLISH_DELAY_S` after a batch that reached
        its end, the poll interval when it had nothing; or how long offered appends are held
        back (:meth:`_hold`) when it applied nothing for that reason."""
        read_at = time.monotonic()
        self._holding = False
        # Cleared before the read: an append that lands during the read sets it again, so the
        # wait in the loop cannot sleep through it.
        self._kick.clear()
        per_batch = self.samples_per_batch  # about that many samples, however many per entry
        count = max(1, min(per_batch, round(per_batch / self._per_entry)))
        offered: Entries = []
        decoded: list[Decoded | None] = []
        if self._may_apply_offered() and self.board.current.version + 1 in self._offered:
            hold = self._hold(read_at)
            if hold > 0.0:  # woken by a batch's worth, an urgent waiter, or the delay's end
                self._holding = True
                return hold
            self._chores(read_at)  # beside this batch: the read checks its first entry
            offered, decoded = self._offered.take(
                self.board.current.version, count, self.metric_puts
            )
        if offered:
            await self._apply(offered, decoded)
            self.offered_applied += len(offered)
            self._chores(time.monotonic())
            return 0.0 if self.board.current.version + 1 in self._offered else PUBLISH_DELAY_S
        if self._nothing_new(read_at):  # woken early: wait for the next offer or read
            assert self._read_at is not None
            return self._read_at + SKIP_READ_S - read_at
        self._heard = False  # cleared before the read: one heard during it is read next
        current = self.board.current
        tail = await self.store.read_tail(
            self.name,
            after(current.applied),
            count,
            applied=current.version,
            created_at=self._created,
        )
        self._read_at = read_at
        self._unconfirmed = False
        if self._overtaken(tail):
            return 0.0
        if tail.entries:
            await self._apply(tail.entries)
        if len(tail.entries) < count:
            self.caught_up.set()
            self._replaying = False
            self.synced_at = read_at
        self._chores(read_at)  # a checkpoint, when due (the read was just made)
        if len(tail.entries) == count:
            return 0.0
        return PUBLISH_DELAY_S if tail.entries else self.settings.poll_interval_s

    async def _apply(self, entries: Entries, decoded: list[Decoded | None] | None = None) -> None:
        started = time.perf_counter()
        # Decoding, learning and building the snapshot all run in a worker thread (the
        # compiled kernel releases the GIL), so the event loop stays free for ingestion and
        # queries; only the bookkeeping below runs on it. A small batch (INLINE_WORK) is
        # applied on the event loop instead: handing it to a thread and back costs more than
        # learning it (thread wake-ups, the GIL passed back and forth, the loop woken by the
        # result, and behind a busy loop a wait for the GIL at every kernel's return).
        async with self._learning:
            if _entry_samples(entries) * sample_work(self.learner.config) <= INLINE_WORK:
                runs, snapshot, samples = self._apply_entries(entries, decoded)
            else:
                runs, snapshot, samples = await asyncio.to_thread(
                    self._apply_entries, entries, decoded
                )
            for seqs, results in runs:
                self.telemetry.count_steps(results.counts())
                if self._replaying:
                    self.telemetry.replayed.inc(len(results))
                self.results.record(seqs, results)
            self.unsaved.learned(samples, time.monotonic())
            self._per_entry = max(1.0, samples / len(entries))
            for rows, labels in self._fresh:
                self.recent.extend(rows, labels)
            self._fresh.clear()
            self._publish(snapshot)
        self.telemetry.update_duration.observe(time.perf_counter() - started)
        self._certificate_due(snapshot.version)

    def _apply_entries(
        self, entries: Entries, decoded: list[Decoded | None] | None = None
    ) -> tuple[list[tuple[list[int], StepResults]], Snapshot, int]:
        """Apply log entries in order (worker thread): per run of sample entries, the seqs of
        its samples and their results; the snapshot after the last entry; the sample count.
        ``decoded``: per entry, its samples when already at hand (None: decode the entry)."""
        d = self.learner.dim
        self._fresh.clear()  # rows of a batch that failed part-way are not shown
        runs: list[tuple[list[int], StepResults]] = []
        blocks: list[np.ndarray[Any, Any]] = []
        flags: list[np.ndarray[Any, Any] | None] = []  # per block: its holdout flags
        keys: list[str] = []
        seqs: list[int] = []
        samples = 0

        def flush() -> None:
            if blocks:
                X = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
                held = None
                if any(f is not None for f in flags):
                    held = np.concatenate(
                        [np.zeros(len(b), np.bool_) if f is None else f
                         for b, f in zip(blocks, flags, strict=True)]
                    )  # fmt: skip
                runs.append((list(seqs), self.learner.learn_many(X, keys, holdout=held)))
                self._fresh.append((X[-RECENT_SAMPLES:], keys[-RECENT_SAMPLES:]))
                blocks.clear()
                flags.clear()
                keys.clear()
                seqs.clear()

        for i, ((last, _part), fields) in enumerate(entries):
            if b"L" in fields:  # a metric replacement, ordered in the log (PUT metric)
                flush()
                self.learner.set_metric(decode_vector(fields[b"L"], d * d).reshape(d, d))
                self.metric_puts += 1
                continue
            samples_at_hand = decoded[i] if decoded else None
            if samples_at_hand is None:
                X, labels = decode_entry(fields, d)
                marks = entry_flags(fields, len(labels))
            else:
                X, labels, marks = samples_at_hand
            blocks.append(X)
            flags.append(marks)
            keys.extend(labels)
            seqs.extend(range(last - len(labels) + 1, last + 1))
            samples += len(labels)
        flush()
        return runs, Snapshot.of(self.learner, entries[-1][0], self.metric_puts), samples

    # -- certificates ------------------------------------------------------------------------

    async def frozen_holdout(self) -> tuple[Snapshot, Holdout]:
        """The current snapshot and a copy of the learner's held-out state as of it (the
        reservoir, PAC-Bayes prior and window): what a certificate of that snapshot needs.
        The copy (up to ``holdout_window x d`` floats) is made in a worker thread."""
        async with self._learning:
            holdout = await asyncio.to_thread(copy.deepcopy, self.learner.holdout)
            return self.board.current, holdout

    async def certificate(
        self, delta: float, method: Method, threshold: float | None
    ) -> Certificate:
        """The certificate of the current snapshot (:func:`~service.engine.certify.certify`;
        arguments already validated). Requests for one model take turns, so a burst holds
        one copy of the reservoir, not one per request."""
        async with self._one_certificate:
            return await certify(await self.frozen_holdout(), delta, method, threshold)

    def recent_samples(self, count: int) -> tuple[Snapshot, Array, list[str]]:
        """The current snapshot and up to ``count`` of the latest samples applied to it (rows
        as logged, oldest first) with their class keys. Both change together on the event
        loop (:meth:`_apply`), so the rows match the snapshot without taking a lock."""
        rows, codes, classes = self.recent.samples()
        keep = min(count, len(rows))
        kept = [classes[int(c)] for c in codes[len(codes) - keep :]]
        return self.board.current, rows[len(rows) - keep :], kept

    def _certificate_due(self, version: int) -> None:
        """Every OPML_CERTIFICATE_EVERY versions (when the model holds samples out), refresh
        :attr:`latest_certificate` in the background (one at a time; the gauges read it)."""
        every = self.settings.certificate_every
        if not every or version // every <= self._certified_version // every:
            return
        if self.learner.config.holdout == 0.0 and not self.learner.holdout.reservoir.total:
            return
        if self._certifying is not None and not self._certifying.done():
            # Still computing the previous one: it certifies again when done. (Leaving it to
            # the next batch lost the last due certificate of a stream that then paused.)
            self._certificate_again = True
            return
        self._certified_version = version
        self._certifying = asyncio.create_task(
            self._refresh_certificate(), name=f"certificate:{self.name}"
        )

    async def _refresh_certificate(self) -> None:
        while True:
            self._certificate_again = False
            try:
                delta = self.settings.certificate_delta
                self.latest_certificate = await self.certificate(delta, "binomial", None)
            except NotCertifiable as exc:  # too few held-out samples yet: no gauges until then
                log.debug("%s: no certificate yet (%s)", self.name, exc.detail)
            except Exception:
                log.exception("%s: periodic certificate failed", self.name)
            if not self._certificate_again:
                return
            self._certified_version = self.board.current.version

    def _publish(self, snapshot: Snapshot) -> None:
        self.logged_seq = max(self.logged_seq, snapshot.version)
        self.board.publish(snapshot)
        self._offered.drop_through(snapshot.version)  # applied (read back): not needed

    # -- checkpoints ---------------------------------------------------------------------------

    def _restore(self, restored: checkpoint.Restored) -> None:
        self.learner = restored.learner
        self.metric_puts = restored.metric_puts
        self.checkpoint = CheckpointInfo(restored.seq, restored.time)
        self._saved = restored.applied
        self.unsaved.reset()
        self._publish(Snapshot.of(self.learner, restored.applied, self.metric_puts))

    def _checkpoint_due(self) -> bool:
        return self.unsaved.due(time.monotonic())

    async def _write_checkpoint(self) -> None:
        """Checkpoint the learner as of the current snapshot and trim the log behind it (the
        owner only: Redis refuses it if our fencing token is no longer the latest)."""
        pending = self._encode_checkpoint()
        if pending is not None:
            await self._save_checkpoint(pending)

    def _encode_checkpoint(self) -> PendingCheckpoint | None:
        """The checkpoint of the current snapshot, encoded (the learner does not change while
        it is written: it is counted as saved, and :meth:`_save_checkpoint` undoes that if
        the write fails). None without the lease."""
        token = self.lease.token
        if token is None:
            return None
        now = time.time()
        current = self.board.current
        ckpt, buffer = checkpoint.encode(
            self.learner, applied=current.applied, metric_puts=self.metric_puts, time=now
        )
        since, dirty_since = self.unsaved.take()
        return PendingCheckpoint(
            ckpt, buffer, current.applied, current.version, now, token,
            since, dirty_since, time.perf_counter(),
        )  # fmt: skip

    async def _save_checkpoint(self, pending: PendingCheckpoint) -> None:
        written = False
        try:
            written = await self.store.write_checkpoint(
                self.name,
                pending.checkpoint,
                pending.buffer,
                applied=pending.applied,
                created_at=self._created,
                trim_min_id=after(pending.applied),
                fencing_token=pending.token,
            )
        except Overtaken:
            self.telemetry.checkpoints_fenced.inc()
            self._give_up("Redis refused a checkpoint behind the stored one (another owner's)")
        except Fenced:
            self.telemetry.checkpoints_fenced.inc()
            self.lease.lose(
                f"Redis refused a checkpoint with the stale fencing token {pending.token}"
            )
        finally:
            if not written:  # still unsaved: due again
                self.unsaved.put_back(pending.since, pending.dirty_since)
        if not written:
            return
        self._saved = pending.applied
        self.checkpoint = CheckpointInfo(pending.version, pending.time)
        self.telemetry.checkpoint_duration.observe(time.perf_counter() - pending.started)
        log.debug("%s: checkpoint at %s", self.name, format_id(pending.applied))


def _entry_samples(entries: Entries) -> int:
    """Samples in ``entries`` (a metric replacement counts as one: O(d^2) work, like a sample)."""
    return sum(int(fields.get(b"n", b"1")) for _, fields in entries)
