"""Admission control of one model's appends: learner backpressure.

Acknowledging is cheaper than learning, so unchecked a flood would let the log run ahead of the
learner: queries would answer from a state seconds old and the log (trimmed only behind
checkpoints of applied samples) would grow without bound. So a request or frame waits, before
it is appended, while more than ``limit`` samples are logged (or being appended) but not yet
applied. Waiters pass in arrival order (a FIFO lock), and a caller that finds room with nobody
waiting returns without suspending, so appends that are admitted first are still logged in
call order. Past the caller's timeout the answer is "no room" (the API answers 503 and logs
nothing).

The default bound (``OPML_MAX_UNAPPLIED = 0``) is two learner batches' worth, at most
:data:`AUTO_UNAPPLIED`: about constant learning time, hence lag, at any dimension (and at any
``rehearsal``: a batch holds ``1 / (1 + rehearsal)`` as many samples).

Where the learner is depends on who learns the model: this process (its writer's position), or
another one, which publishes its applied seq in Redis after every batch; a :class:`Progress`
(the model's runtime) says which, and wakes the waiters when it moves.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from prometheus_client import Histogram

#: A batch holds at most about BATCH_WORK / d^2 samples (the O(d^2) step makes that ~constant
#: learning time: 4096 samples at d = 64, 64 at d = 512), so a snapshot is published every few
#: tens of milliseconds whatever the dimension; but never fewer than MIN_BATCH.
BATCH_WORK = 1 << 24
MIN_BATCH = 32
#: Most unapplied samples under the automatic backpressure bound (OPML_MAX_UNAPPLIED = 0): two
#: batches of the default OPML_BATCH_MAX, so that at d <= 64 too the writer finds its next full
#: batch logged when it finishes one (a cap of 2048 kept its batches at half size and left it
#: waiting for appends: binary frames of 256 at d = 64, 147k -> 171k samples/s and lag p99
#: 25 -> 67 ms, measured ad hoc at commit 9e2ebf0).
AUTO_UNAPPLIED = 8192


def samples_per_batch(dim: int, batch_max: int, steps: int = 1) -> int:
    """Samples the writer applies per batch at dimension ``dim``: ``batch_max`` (OPML_BATCH_MAX),
    fewer at large d (about ``BATCH_WORK / d^2``, never fewer than ``MIN_BATCH``), divided by
    ``steps``, the learner's steps per sample (``1 + rehearsal``).

    >>> samples_per_batch(64, 4096), samples_per_batch(512, 4096), samples_per_batch(64, 4096, 3)
    (4096, 64, 1365)
    """
    return max(MIN_BATCH, min(batch_max, BATCH_WORK // (dim * dim * steps)))


def unapplied_limit(dim: int, batch_max: int, max_unapplied: int, steps: int = 1) -> int:
    """The backpressure bound: ``max_unapplied`` (OPML_MAX_UNAPPLIED), or automatically two
    batches, at most :data:`AUTO_UNAPPLIED` (8192 samples at d = 64, 2048 at d = 128, 128 at
    d = 512; ``steps`` as in :func:`samples_per_batch`).

    >>> unapplied_limit(64, 4096, 0), unapplied_limit(512, 4096, 0), unapplied_limit(64, 4096, 7)
    (8192, 128, 7)
    """
    return max_unapplied or min(
        AUTO_UNAPPLIED, max(MIN_BATCH, 2 * samples_per_batch(dim, batch_max, steps))
    )


class Progress(Protocol):
    """Where the learner of a model stands."""

    def backlog(self) -> int:
        """Samples logged that the learner has not applied yet (as far as known here)."""

    async def wait_changed(self, timeout: float) -> None:
        """Return when the backlog may have changed (at most ``timeout`` seconds); raise
        :class:`~service.engine.snapshot.ModelClosed` if the model is gone."""


class Admission:
    """Backpressure of one model: :meth:`wait_room` before an append, :meth:`done` after.

    Samples admitted but not yet logged are counted here, the rest by ``progress``.
    """

    def __init__(self, limit: int, progress: Progress, waited: Histogram | None = None) -> None:
        self.limit = limit
        self._progress = progress
        self._waited = waited
        self._lock = asyncio.Lock()
        self._waiters = 0
        self._appending = 0  # samples admitted whose append has not returned

    @property
    def unapplied(self) -> int:
        """Samples logged (or being appended) that the learner has not applied yet."""
        return self._progress.backlog() + self._appending

    async def wait_room(self, samples: int, timeout: float) -> bool:
        """Wait while more than :attr:`limit` samples are unapplied (False if ``timeout`` runs
        out); on True, ``samples`` count as unapplied until the caller's :meth:`done`."""
        if self._waiters == 0 and self.unapplied <= self.limit:
            self._appending += samples
            return True
        started = time.monotonic()
        deadline = started + timeout
        self._waiters += 1
        try:
            async with self._lock:
                while self.unapplied > self.limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    await self._progress.wait_changed(remaining)
                self._appending += samples
                return True
        finally:
            self._waiters -= 1
            if self._waited is not None:
                self._waited.observe(time.monotonic() - started)

    def done(self, samples: int) -> bool:
        """The append admitted by :meth:`wait_room` finished (logged: the backlog counts it
        now; or failed). True when someone waits for room (the caller wakes them)."""
        self._appending -= samples
        return self._waiters > 0
