"""One model at run time: its writer, lease, admission control, results, and the operations on
it (ingest, replace the metric, read a snapshot), in the domain's terms: arrays and class keys
in, results out; nothing here knows HTTP.

The parts, each in a module named for its job:

* :mod:`service.engine.writer` -- the single writer task: log -> learner -> snapshots,
  checkpoints;
* :mod:`service.engine.offered` -- the appends of this process kept for the writer, applied
  without reading them back;
* :mod:`service.engine.snapshot` -- the immutable snapshots queries read, and waits on them;
* :mod:`service.engine.lease` -- whether this process owns the model (applies and checkpoints);
* :mod:`service.engine.admission` -- learner backpressure before an append;
* :mod:`service.engine.results` -- per-sample results for ``?wait=true``;
* :mod:`service.engine.gallery` -- the identification gallery, kept transformed by ``L``;
* :mod:`service.storage.group_commit` -- the model's append queue (one Lua call for the requests
  and frames that arrive together).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from service import telemetry
from service.config import Settings
from service.core import LearnerConfig
from service.core._validation import Array
from service.core.certificates import Certificate, Method
from service.core.holdout import Flags
from service.engine import operating
from service.engine.admission import Admission, sample_work, unapplied_limit
from service.engine.gallery import Gallery
from service.engine.lease import Lease
from service.engine.offered import Decoded
from service.engine.results import StepResultsKeeper
from service.engine.snapshot import ModelClosed, Snapshot
from service.engine.status import ModelStatus
from service.engine.tasks import stop_task, wait_event
from service.engine.writer import Writer
from service.errors import Conflict, LimitExceeded, NotFound, Unavailable
from service.storage.codec import StreamId, block_bytes, encode_flags, encode_vector, sample_id
from service.storage.group_commit import GroupCommit
from service.storage.store import Appended as Appended
from service.storage.store import Group, NoSuchModel, Store, TooManyClasses

log = logging.getLogger("service.runtime")

#: How often a process that appends to a model another process learns re-reads the owner's
#: published progress while an append waits for room (admission control).
FOLLOWER_POLL_S = 0.02


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


def fingerprint(x: bytes | memoryview, keys: list[str], holdout: Flags | None = None) -> str:
    """A digest of an append's samples (``x``: their rows as logged, :func:`~service.storage.
    codec.encode_vector`) and their ``holdout`` flags (an idempotency key reused with other
    samples is 409).

    >>> import numpy as np
    >>> x = encode_vector(np.zeros((1, 2)))
    >>> fingerprint(x, ["a"]) == fingerprint(encode_vector(np.zeros((1, 2))), ["a"])
    True
    >>> fingerprint(x, ["a"]) == fingerprint(x, ["a"], np.ones(1, dtype=bool))
    False
    """
    h = hashlib.sha256(x)
    h.update("\x00".join(keys).encode())
    if holdout is not None:  # None: nothing flagged, the entry has no ``h`` field
        h.update(b"\x00holdout" + encode_flags(holdout))
    return h.hexdigest()[:32]


class AppendOwner(Protocol):
    """What a queued append reports back to (the model's runtime): all that
    :class:`PendingAppend` needs of it."""

    def logged_here(self, appended: Appended, group: Group, decoded: Decoded) -> None:
        """``group``, appended by this process, is in the log as ``appended``."""

    def refusal(self, exc: BaseException) -> BaseException:
        """What a failed append raises to its caller."""

    def release_room(self, samples: int) -> None:
        """Admitted samples are logged now, or will not be: free their room."""


class PendingAppend:
    """An append of :meth:`ModelRuntime.submit` in the model's group commit
    (:class:`~service.storage.group_commit.Append`): its caller awaits :attr:`answer`, and
    gives up by cancelling it; its outcome goes to its :class:`AppendOwner`."""

    __slots__ = ("_decoded", "_owner", "answer", "group")

    def __init__(self, owner: AppendOwner, group: Group, decoded: Decoded) -> None:
        self._owner = owner
        self._decoded = decoded
        self.group = group
        self.answer: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()

    def gave_up(self) -> bool:
        return self.answer.done()  # nothing but a cancel settles it before the queue does

    def settle(self, outcome: Appended | BaseException | None) -> None:
        owner, answer = self._owner, self.answer
        try:
            if isinstance(outcome, Appended):
                if not outcome.replayed:  # logged, whether its caller still waits or not
                    try:
                        owner.logged_here(outcome, self.group, self._decoded)
                    except Exception:  # a bug: the entry is logged all the same, and read
                        log.exception("handing an append to the writer failed")
                if answer.done():
                    return
                if outcome.replayed and outcome.fingerprint != self.group.fingerprint:
                    answer.set_exception(
                        Conflict(
                            "this idempotency key / frame id was used for different samples",
                            first_seq=outcome.first_seq,
                            last_seq=outcome.last_seq,
                        )
                    )
                else:
                    answer.set_result(outcome)
            elif outcome is None or isinstance(outcome, asyncio.CancelledError):
                answer.cancel()  # left out, or the queue stopped before sending it
            elif not answer.done():
                answer.set_exception(owner.refusal(outcome))
        finally:
            owner.release_room(len(self.group))


class NotAppliedYet(Unavailable):
    """Samples (seqs ``first_seq``..``last_seq``) or a metric replacement are in the log, but
    the learner did not apply them within ``waited_s`` seconds: they will be, without a retry.

    >>> NotAppliedYet(3, 5, 1.0).detail
    'logged as seqs 3..5 (entry 5-1) but not applied within 1 s'
    """

    def __init__(self, first: int, last: int, waited_s: float) -> None:
        super().__init__(
            f"logged as seqs {first}..{last} (entry {sample_id(last)}) but not applied "
            f"within {waited_s:g} s",
            retry_after=2,
            first_seq=first,
            last_seq=last,
        )
        self.last_seq = last


class NotServedHere(Unavailable):
    """The operation needs the model's learner, which this process does not hold (another
    process owns the model, or is taking it over): retry shortly (the API forwards such
    requests to the owner, so this is only met while the model changes hands)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"model {name!r} is changing hands between service processes; retry shortly",
            retry_after=1,
        )


class ModelRuntime:
    """The live state of one model and the operations on it (see the module docstring).

    Every process that knows the model has one: it can append samples to the log (ingestion is
    served by any process). Only the process that owns the model (holds its lease) also has a
    :class:`~service.engine.writer.Writer` (the learner, snapshots, checkpoints), between
    :meth:`activate` and :meth:`deactivate`; the operations that read or wait for the learner
    raise :class:`NotServedHere` elsewhere (the API forwards those requests to the owner).
    """

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
        self.store = store
        self.telemetry = telemetry.ModelTelemetry(name)
        self.lease = Lease(store, name, owner_id, created_at, settings.lease_ttl_s)
        self.results = StepResultsKeeper()
        self.writer: Writer | None = None
        #: The identification gallery, held by the process that learns the model (with its
        #: writer, whose snapshots it follows).
        self._gallery: Gallery | None = None
        self.admission = Admission(
            unapplied_limit(sample_work(config), settings.batch_max, settings.max_unapplied),
            self,
            self.telemetry.backpressure_wait,
        )
        #: Appends to this model's log go through one queue (group commit). They are
        #: announced on the model's channel only when another process learns the model: the
        #: writer here is woken directly. (While the model changes hands, an append made by
        #: the previous owner may so reach the new one at its next read, within
        #: OPML_POLL_INTERVAL_S, instead of at once; nothing is lost either way.)
        self.appender = GroupCommit(
            store,
            name,
            ttl_ms=settings.idempotency_ttl_s * 1000,
            max_classes=settings.max_classes,
            max_samples=settings.max_batch,
            max_records=settings.idempotency_max_records,
            announce=lambda: self.writer is None,
            on_dropped=self.telemetry.records_dropped.inc,
        )
        self.closed = False  # deleted (or the service is stopping)
        #: Held while the model is taken, kept, handed over or closed (the registry's placement
        #: and a delete): one of them at a time, so a placement round that began before a
        #: delete cannot start a new writer on the closed model.
        self.placing = asyncio.Lock()
        self._loading: asyncio.Task[None] | None = None
        #: Follower view of the log: the highest seq known logged, and the owner's applied seq.
        self._logged = 0
        self._applied_elsewhere = 0
        self._room = asyncio.Event()  # set when an append finished while others wait for room

    # -- who learns the model ----------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """True while this process learns the model and can answer for its state: it holds
        the lease and has applied the log it found when it took the model over."""
        w = self.writer
        return w is not None and self.lease.held and w.caught_up.is_set()

    def _writer(self) -> Writer:
        if self.writer is None or not self.lease.held:
            raise NotServedHere(self.name)
        return self.writer

    def owned_writer(self) -> Writer:
        """The writer that learns the model here (NotServedHere where another process does)."""
        return self._writer()

    @property
    def gallery(self) -> Gallery:
        """The model's gallery (NotServedHere where another process learns the model)."""
        self._writer()
        if self._gallery is None:
            raise NotServedHere(self.name)
        return self._gallery

    @property
    def snapshot(self) -> Snapshot:
        """The latest published snapshot (NotServedHere where another process learns)."""
        return self._writer().board.current

    async def claim(self) -> bool:
        """Renew or take the lease; True when it was just taken (a Redis error is raised)."""
        taken = await self.lease.claim()
        if taken and self.writer is not None:
            self.writer.kick()  # a checkpoint may be due
        if self._gallery is not None:  # changed through another process meanwhile?
            await self._gallery.sync()
        return taken

    def activate(self) -> asyncio.Task[None]:
        """Start learning the model (we hold the lease): load its latest checkpoint and replay
        the log tail in the background; :attr:`serving` once caught up."""
        writer = Writer(
            self.name,
            self.config,
            self.store,
            self.settings,
            self.lease,
            self.results,
            self.telemetry,
        )
        gallery = Gallery(
            self.name, self.config, self.store, self.settings, writer.board, self.telemetry
        )
        self.writer, self._gallery = writer, gallery

        async def load() -> None:
            delay = 0.1
            while self.writer is writer:
                try:
                    await writer.load()
                    await gallery.load()
                    writer.start()
                    gallery.start()
                    return
                except Unavailable as exc:
                    telemetry.REDIS_ERROR["loader"].inc()
                    log.warning("%s: loading: Redis unavailable (%s); retrying", self.name, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)

        self._loading = asyncio.create_task(load(), name=f"load:{self.name}")
        return self._loading

    async def caught_up(self) -> None:
        """Wait until this process serves the model (after :meth:`activate`)."""
        if self._loading is not None:
            await self._loading
        if self.writer is not None:
            await self.writer.caught_up.wait()

    async def deactivate(self, *, checkpoint: bool, closing: bool = False) -> None:
        """Stop learning the model: the writer finishes its batch; with ``checkpoint`` (and
        while we hold the lease) a final checkpoint is written and the lease handed back, so
        another process takes over at once. ``closing``: the model is being deleted (waiters
        get NotFound, not "moved")."""
        writer, self.writer = self.writer, None
        gallery, self._gallery = self._gallery, None
        if self._loading is not None:
            await stop_task(self._loading)
            self._loading = None
        if gallery is not None:
            await gallery.stop()
        if writer is None:
            return
        try:
            await writer.stop(final_checkpoint=checkpoint, moved=not closing)
            if checkpoint:
                await self.lease.release()
        except Unavailable as exc:
            telemetry.REDIS_ERROR["writer"].inc()
            log.warning("%s: final checkpoint failed (%s); the log keeps it", self.name, exc)
        finally:
            self.lease.token = None
            self.telemetry.not_learning()
            self._logged = max(self._logged, writer.logged_seq)

    async def close(self) -> None:
        """The model is deleted: stop without a checkpoint; waiters get NotFound."""
        self.closed = True
        self._room.set()
        async with self.placing:
            await self.deactivate(checkpoint=False, closing=True)

    async def wait_newer(self, seen: Snapshot) -> Snapshot:
        """The first snapshot after ``seen`` (ModelClosed when the model goes or moves)."""
        return await self._writer().board.wait_newer(seen)

    def status(self) -> ModelStatus:
        """The model's status as of its latest snapshot (NotServedHere elsewhere)."""
        w = self._writer()
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
            certificate=w.latest_certificate,
            **operating.observed(w, self.config.operating_point),
        )

    # -- progress of the learner (for admission control) --------------------------------------

    def backlog(self) -> int:
        """Logged samples the learner has not applied (:class:`~service.engine.admission.
        Progress`): our writer's position, or the one the owner publishes in Redis."""
        w = self.writer
        if w is not None:
            return w.logged_seq - w.board.current.version
        return self._logged - self._applied_elsewhere

    async def wait_changed(self, timeout: float) -> None:
        """Wait for the backlog to move: a new snapshot here; elsewhere, an append of ours
        finishing or, polled every few ms, the owner's published progress."""
        if self.closed:
            raise ModelClosed()
        w = self.writer
        if w is not None:
            await w.board.wait_changed(timeout)
            return
        self._room.clear()
        await wait_event(self._room, min(timeout, FOLLOWER_POLL_S))
        self._logged, self._applied_elsewhere = await self.store.progress(self.name)

    # -- operations ----------------------------------------------------------------------------

    async def ingest(
        self,
        X: Array,
        keys: list[str],
        *,
        holdout: Flags | None = None,
        idempotency_field: str = "",
        wait: bool = False,
    ) -> IngestResult:
        """Append validated samples (rows of ``X``, their class keys, the ``holdout`` flags of
        those the caller holds out) atomically to the log, and with ``wait`` wait until they
        are applied."""
        token = self.results.want(self.snapshot.version) if wait else None  # needs the learner
        try:
            logged = self.submit(X, keys, holdout, idempotency_field)  # room now: no suspension
            if logged is None:
                logged = await self.submit_when_room(X, keys, holdout, idempotency_field)
            appended = await logged
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

    def submit(
        self, X: Array, keys: list[str], holdout: Flags | None = None, idempotency_field: str = ""
    ) -> asyncio.Future[Appended] | None:
        """Start appending validated samples (as :meth:`ingest`, without ``wait``) without
        suspending, if admission control has room for them now (the common case): their group
        is queued for the log before this returns, so calls are logged in call order. The
        future gives what was logged (:class:`Appended`), or raises NotFound, LimitExceeded,
        Conflict or Unavailable; cancelling it before the group is sent leaves the samples
        out of the log. None: no room now (:meth:`submit_when_room` waits for it)."""
        if not self.admission.try_room(len(keys)):
            return None
        return self._submit(X, keys, holdout, idempotency_field)

    async def submit_when_room(
        self, X: Array, keys: list[str], holdout: Flags | None = None, idempotency_field: str = ""
    ) -> asyncio.Future[Appended]:
        """:meth:`submit`, after waiting (bounded, in call order) for room if there is none;
        Unavailable when none came in time (nothing is logged)."""
        s = self.settings
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
        # No await between the room and the queueing: calls are logged in call order.
        return self._submit(X, keys, holdout, idempotency_field)

    def _submit(
        self, X: Array, keys: list[str], holdout: Flags | None, idempotency_field: str
    ) -> asyncio.Future[Appended]:
        """Queue the admitted samples' group for the log (see :meth:`submit`)."""
        try:
            if self.closed:
                raise NotFound(f"model {self.name!r} was deleted")
            x = block_bytes(X)  # hashed and logged: the same bytes
            group = Group(
                x, keys, idempotency_field, fingerprint(x, keys, holdout), encode_flags(holdout)
            )
            append = PendingAppend(self, group, (X, keys, holdout))
        except BaseException:
            self.release_room(len(keys))
            raise
        self.appender.submit(append)  # settles it, which frees the room
        return append.answer

    def logged_here(self, appended: Appended, group: Group, decoded: Decoded) -> None:
        """``group``, appended by this process, is in the log as ``appended``."""
        if self.writer is not None:  # it may apply them without reading them back
            self.writer.offer(appended, group, decoded)
        self._notify_logged(appended.last_seq)  # before the room is freed: no gap

    def refusal(self, exc: BaseException) -> BaseException:
        """What a failed append raises to its caller: the store's refusals in the domain's
        terms, anything else (Unavailable: the store failed) as it is."""
        if isinstance(exc, NoSuchModel):
            return NotFound(f"model {self.name!r} does not exist")
        if isinstance(exc, TooManyClasses):
            return LimitExceeded(
                f"the model has {exc.have} classes; at most {self.settings.max_classes} per "
                "model (OPML_MAX_CLASSES)"
            )
        return exc

    def release_room(self, samples: int) -> None:
        """Admitted samples are logged now, or will not be: free their room."""
        if self.admission.done(samples):  # a failed append frees room without progress
            self._wake_admission()

    def _notify_logged(self, last_seq: int) -> None:
        self._logged = max(self._logged, last_seq)
        if self.writer is not None:
            self.writer.notify_logged(last_seq)

    def _wake_admission(self) -> None:
        if self.writer is not None:
            self.writer.board.wake()
        self._room.set()

    async def _reached(self, target: StreamId, timeout: float) -> bool:
        """Wait (bounded) until log entry ``target`` is applied; NotFound if the model goes,
        NotServedHere if its learning moves to another process meanwhile."""
        try:
            return await self._writer().board.wait_applied(target, timeout)
        except ModelClosed as exc:
            if exc.moved:
                raise NotServedHere(self.name) from None
            raise NotFound(f"model {self.name!r} was deleted") from None

    async def _wait_applied(self, target: StreamId, first: int, last: int) -> None:
        if not await self._reached(target, self.settings.apply_wait_s):
            raise NotAppliedYet(first, last, self.settings.apply_wait_s)

    async def put_metric(self, L: Array) -> None:
        """Log a metric replacement after every sample logged so far; wait until applied."""
        self._writer()  # only the process that learns the model takes it
        try:
            entry = await self.store.append_metric(self.name, encode_vector(L))
        except NoSuchModel:
            raise NotFound(f"model {self.name!r} does not exist") from None
        self._notify_logged(entry[0])
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
                f"{self.snapshot.version}, logged {self._writer().logged_seq})",
                retry_after=1,
                version=self.snapshot.version,
            )
        return self.snapshot

    async def recent_samples(
        self, min_version: int | None, count: int
    ) -> tuple[Snapshot, Array, list[str]]:
        """The latest snapshot (after waiting, bounded, for ``min_version``) and up to
        ``count`` of the latest samples applied to it with their class keys (the writer's
        in-memory window: empty after a restart until samples arrive)."""
        await self.read(min_version)
        return self._writer().recent_samples(count)

    async def certificate(
        self, min_version: int | None, delta: float, method: Method, threshold: float | None
    ) -> Certificate:
        """The certificate of the latest snapshot (after waiting, bounded, for
        ``min_version``); arguments already validated (:mod:`service.engine.certify`)."""
        await self.read(min_version)
        return await self._writer().certificate(delta, method, threshold)
