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

from service.core import LearnerConfig

#: A batch holds at most about BATCH_WORK / :func:`sample_work` samples (the O(d^2) step makes
#: that ~constant learning time: 4096 samples at d = 64, 64 at d = 512), so a snapshot is
#: published every few tens of milliseconds whatever the dimension; but never fewer than
#: MIN_BATCH.
BATCH_WORK = 1 << 24
MIN_BATCH = 32
#: Most unapplied samples under the automatic backpressure bound (OPML_MAX_UNAPPLIED = 0): two
#: batches of the default OPML_BATCH_MAX, so that at d <= 64 too the writer finds its next full
#: batch logged when it finishes one; a smaller cap leaves it waiting for appends with
#: half-full batches (docs/design/single-writer-log.md).
AUTO_UNAPPLIED = 8192


def sample_work(config: LearnerConfig) -> int:
    """About the multiply-adds of learning one sample: ``d^2`` per step (Eq. 16), times the
    learner's steps per sample (``1 + rehearsal``); ``sgd_psd``'s eigendecomposition per step
    makes it ``4 d^3`` (~200x OPML's time per sample at d = 64:
    ``benchmarks/results/learners.md``).

    >>> sample_work(LearnerConfig(dim=64)), sample_work(LearnerConfig(dim=64, rehearsal=2))
    (4096, 12288)
    >>> sample_work(LearnerConfig(dim=64, algorithm="sgd_psd"))
    1048576
    """
    d = config.dim
    per_step = 4 * d**3 if config.algorithm == "sgd_psd" else d * d
    return per_step * config.steps_per_sample


def samples_per_batch(work: int, batch_max: int) -> int:
    """Samples the writer applies per batch when one costs ``work`` (:func:`sample_work`):
    ``batch_max`` (OPML_BATCH_MAX), fewer at large d (about ``BATCH_WORK / work``, never fewer
    than ``MIN_BATCH``).

    >>> samples_per_batch(64 * 64, 4096), samples_per_batch(512 * 512, 4096)
    (4096, 64)
    >>> samples_per_batch(sample_work(LearnerConfig(dim=64, rehearsal=2)), 4096)
    1365
    """
    return max(MIN_BATCH, min(batch_max, BATCH_WORK // work))


def unapplied_limit(work: int, batch_max: int, max_unapplied: int) -> int:
    """The backpressure bound: ``max_unapplied`` (OPML_MAX_UNAPPLIED), or automatically two
    batches, at most :data:`AUTO_UNAPPLIED` (8192 samples at d = 64, 2048 at d = 128, 128 at
    d = 512; ``work`` as in :func:`samples_per_batch`).

    >>> unapplied_limit(64 * 64, 4096, 0), unapplied_limit(512 * 512, 4096, 0)
    (8192, 128)
    >>> unapplied_limit(64 * 64, 4096, 7)
    7
    """
    return max_unapplied or min(
        AUTO_UNAPPLIED, max(MIN_BATCH, 2 * samples_per_batch(work, batch_max))
    )


class Progress(Protocol):
    """Where the learner of a model stands."""

    def backlog(self) -> int:
        """Samples logged that the learner has not applied yet (as far as known here)."""

    async def wait_changed(self, timeout: float) -> None:
        """Return when the backlog may have changed (at most ``timeout`` seconds); raise
        :class:`~service.engine.snapshot.ModelClosed` if the model is gone."""


class Admission:
    """Backpressure of one model: :meth:`try_room` or :meth:`wait_room` before an append,
    :meth:`done` after.

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

    def try_room(self, samples: int) -> bool:
        """Room now, with nobody waiting before: True, and ``samples`` count as unapplied until
        the caller's :meth:`done`; False (nothing counted) otherwise."""
        if self._waiters == 0 and self.unapplied <= self.limit:
            self._appending += samples
            return True
        return False

    async def wait_room(self, samples: int, timeout: float) -> bool:
        """Wait while more than :attr:`limit` samples are unapplied (False if ``timeout`` runs
        out); on True, ``samples`` count as unapplied until the caller's :meth:`done`."""
        if self.try_room(samples):
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
