"""What queries read: immutable snapshots of a model, and the board they are published on.

The writer (:mod:`service.engine.writer`) applies the log in batches and publishes a
:class:`Snapshot` after each one; queries only ever read the latest snapshot, so they never see
a half-applied batch, and each answer's ``version`` is the seq of the last sample applied to
that snapshot. :class:`SnapshotBoard` holds the current snapshot and wakes whoever waits for a
change (a ``min_version`` query, a ``?wait=true`` ingestion, an ``/events`` reader, an append
held back by admission control).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from service.core import Calibration, Learner, LearnerConfig, MetricView, Stability
from service.core._validation import Array
from service.core.calibration import ThresholdCalibrator, in_order
from service.engine.tasks import wait_event
from service.storage.codec import StreamId


class ModelClosed(Exception):
    """The model was deleted, or (``moved``) its learning moved to another process or the
    service is stopping, while a request waited on it."""

    def __init__(self, moved: bool = False) -> None:
        super().__init__("moved" if moved else "closed")
        self.moved = moved


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of a model after some applied log prefix.

    ``metric`` is a :class:`~service.core.MetricView` of a copy of ``L``; the queries call its
    methods, so their arithmetic is the core's own. ``frobenius_norm`` (``||L||_F``, O(d^2) on
    that copy) and ``hinge_loss`` (mean hinge of the calibration window, at the current margin
    in input units) are for telemetry. ``margin`` is the learner's margin in input units (the
    ``fallback:margin`` threshold; under ``step="scaled"`` it follows the stream's scale, so
    ``metric``, which learns nothing, cannot know it). ``health``, ``race`` and ``effective``
    are the learner's own reports (divergence monitor, ``gamma="auto"`` race, step sizes in
    input units; :class:`~service.core.Learner`; ``None`` for the gradient learners, which
    have their own step machinery), JSON-safe, made once per snapshot. ``stability``: the
    learner's step-mass diagnostics (not a bound).

    ``metric``, ``calibration``, ``frobenius_norm`` and ``hinge_loss``
    are made when first read, from the copies of ``L`` and of the calibration window (as the
    learner's ring holds it) taken here: the writer publishes a snapshot after every batch, and
    with one sample per request most are never read, while building them (checking L, sorting
    the window for the EER) costs more than learning the sample.

    >>> from service.core import LearnerConfig
    >>> snap = Snapshot.of(Learner(LearnerConfig(dim=2)), (0, 0), 0)
    >>> snap.metric.squared_distance([1, 0], [0, 0]), snap.calibration.pairs
    (1.0, 0)
    """

    version: int
    applied: StreamId
    counts: dict[str, int]
    classes: int
    metric_puts: int
    stability: Stability
    margin: float
    health: dict[str, Any] | None
    race: dict[str, Any] | None
    effective: dict[str, float | None] | None
    config: LearnerConfig
    L: Array = field(repr=False)
    #: The calibration window as the learner held it (a ring), the pairs seen, its size.
    ring: Array = field(repr=False)
    pairs_seen: int = field(repr=False)
    window_size: int = field(repr=False)

    @classmethod
    def of(cls, learner: Learner, applied: StreamId, metric_puts: int) -> Snapshot:
        """A snapshot of ``learner`` as of log position ``applied`` (copies ``L``)."""
        ring, seen = learner.calibrator.ring()
        return cls(
            version=learner.version,
            applied=applied,
            counts=learner.counts,
            classes=learner.n_classes,
            metric_puts=metric_puts,
            stability=learner.stability(),
            margin=learner.margin,
            health=learner.health,
            race=learner.race,
            effective=learner.effective,
            config=learner.config,
            L=learner.L.copy(),
            ring=ring,
            pairs_seen=seen,
            window_size=learner.calibrator.window,
        )

    @cached_property
    def frobenius_norm(self) -> float:
        """``||L||_F``."""
        return float(np.linalg.norm(self.L))

    @cached_property
    def hinge_loss(self) -> float | None:
        """Mean hinge ``max(0, margin + d_pos - d_neg)`` (Eq. 4) over the window (None: empty)."""
        window = in_order(self.ring, self.pairs_seen, self.window_size)  # summed oldest first
        hinge = np.maximum(self.margin + window[:, 0] - window[:, 1], 0.0)
        return float(hinge.mean()) if len(hinge) else None

    @cached_property
    def metric(self) -> MetricView:
        """The queries of this snapshot's ``L``."""
        return MetricView(self.L, self.config)

    @cached_property
    def calibration(self) -> Calibration:
        """The EER calibration of this snapshot's window."""
        return ThresholdCalibrator.from_ring(
            self.ring, self.pairs_seen, self.window_size
        ).calibration()


class SnapshotBoard:
    """The current snapshot of one model, and the waits on it.

    >>> from service.core import LearnerConfig
    >>> board = SnapshotBoard(Snapshot.of(Learner(LearnerConfig(dim=2)), (0, 0), 0))
    >>> board.current.version, board.closed
    (0, None)
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self.current = snapshot
        self.closed: ModelClosed | None = None
        self._changed = asyncio.Event()
        #: Callers in :meth:`wait_changed` or :meth:`wait_applied` (a ``min_version`` query,
        #: a ``?wait=true`` ingestion, an append held back by admission control), or in
        #: :meth:`urgent`: someone for whom the next snapshot is urgent (the writer then
        #: applies without delay).
        self.waiting = 0
        #: Called when such a wait begins (the writer: look at the log now).
        self.on_wait: Callable[[], None] | None = None

    def publish(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` the one queries read, and wake every waiter."""
        self.current = snapshot
        self.wake()

    def wake(self) -> None:
        """Wake everyone waiting for a change (new snapshot, room for appends, closing)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self, *, moved: bool) -> None:
        """No more snapshots: every waiter gets :class:`ModelClosed` (``moved``: the model
        still exists, another process will learn it)."""
        self.closed = ModelClosed(moved)
        self.wake()

    async def wait_changed(self, timeout: float | None) -> None:
        """Wait for the next :meth:`wake` (at most ``timeout`` seconds), counted in
        :attr:`waiting`."""
        with self.urgent():
            await self._wait(timeout)

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """Count the caller in :attr:`waiting` while inside (and tell :attr:`on_wait`)."""
        self.waiting += 1
        if self.on_wait is not None:
            self.on_wait()
        try:
            yield
        finally:
            self.waiting -= 1

    async def _wait(self, timeout: float | None) -> None:
        await wait_event(self._changed, timeout)

    async def wait_applied(self, target: StreamId, timeout: float) -> bool:
        """Wait until the log entry ``target`` is applied; False if ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        while self.current.applied < target:
            if self.closed is not None:
                raise self.closed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.wait_changed(remaining)
        return True

    async def wait_newer(self, seen: Snapshot) -> Snapshot:
        """The first snapshot published after ``seen`` (ModelClosed if the model closes)."""
        while self.current is seen and self.closed is None:
            await self._wait(None)  # not urgent: a reader of every change (events, gallery)
        if self.closed is not None:
            raise self.closed
        return self.current
