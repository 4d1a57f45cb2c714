"""Online calibration of the verification threshold at the equal-error-rate point.

Before every triplet step the learner measures, with the metric as it then is, the squared
distance of a positive pair ``(x_t, x_p)`` and of a negative pair ``(x_t, x_q)``. Those are
honest held-out measurements (prequential: measured before the sample is learned), so a recent
window of them estimates how the current metric separates same from different.

The threshold a verification uses, and the one a certificate certifies by default, follows one
rule from that window (:func:`served_threshold`): the caller's, else the calibrated EER
threshold, else a fallback that the answer names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from service.core._validation import Array, check_threshold

#: Pairs of each kind needed before the threshold counts as calibrated.
MIN_PAIRS = 20


@njit(cache=True)
def _ring_write(pairs: Array, count: int, d_pos: Array, d_neg: Array) -> None:
    """``pairs[(count + i) % window] = (d_pos[i], d_neg[i])`` for every ``i``: one compiled
    loop that keeps the GIL (see :func:`~service.core._validation.all_finite`)."""
    window = pairs.shape[0]
    for i in range(d_pos.shape[0]):
        r = (count + i) % window
        pairs[r, 0] = d_pos[i]
        pairs[r, 1] = d_neg[i]


@njit(cache=True)
def _eer(pos: Array, neg: Array, pairs: Array) -> tuple[float, float, float]:
    """The equal-error-rate point of ``pairs`` (rows ``(d_pos, d_neg)``, at least one; ``pos``
    and ``neg`` its columns sorted): its threshold, error rate, and the triplet accuracy (share
    with ``d_pos < d_neg``).

    Every observed distance is a candidate threshold, the positives' in ascending order, then
    the negatives'. At ``c``: ``frr = 1 - #{pos <= c} / n``, ``far = #{neg <= c} / n``; the
    first candidate with the least ``|far - frr| + 1e-12 (far + frr)`` wins (ties: fewer
    errors). The counts come from walking both sorted lists alongside the candidates (they
    ascend), O(n) after the sorts, where ``searchsorted`` per candidate was O(n log n) and a
    dozen NumPy calls (NumPy still sorts: faster than a compiled sort): computed for every
    new snapshot that a verify or an ``/events`` frame reads."""
    n = pairs.shape[0]
    best_gap, threshold, eer = np.inf, 0.0, 0.0
    for sorted_candidates in (pos, neg):
        i = j = 0  # #{pos <= c}, #{neg <= c}: c ascends within each list
        for c in sorted_candidates:
            while i < n and pos[i] <= c:
                i += 1
            while j < n and neg[j] <= c:
                j += 1
            frr = 1.0 - i / n
            far = j / n
            gap = abs(far - frr) + 1e-12 * (far + frr)
            if gap < best_gap:
                best_gap, threshold, eer = gap, c, (far + frr) / 2
    correct = 0
    for t in range(n):
        if pairs[t, 0] < pairs[t, 1]:
            correct += 1
    return threshold, eer, correct / n


@dataclass(frozen=True, slots=True)
class Calibration:
    """The window's verdict: EER threshold (squared units), its error rate, triplet accuracy.

    >>> Calibration(threshold=2.5, eer=0.1, accuracy=0.9, pairs=50, calibrated=True).eer
    0.1
    """

    threshold: float | None
    eer: float | None
    accuracy: float | None
    pairs: int
    calibrated: bool


class ThresholdCalibrator:
    """A ring buffer of recent (positive, negative) squared distances and their EER threshold.

    ``same`` is decided as ``squared_distance <= threshold``. At threshold ``theta`` the false
    reject rate is the share of positives above it and the false accept rate the share of
    negatives at or below it; the calibrated ``theta`` is the observed distance where the two
    are closest (the equal error rate point), ``eer`` their mean there. ``accuracy`` is the
    prequential triplet accuracy: the share of windowed triplets with ``d_pos < d_neg``.

    >>> cal = ThresholdCalibrator(window=100)
    >>> for i in range(30):
    ...     cal.observe(d_pos=1.0 + i % 3, d_neg=10.0 + i % 5)
    >>> c = cal.calibration()
    >>> (c.calibrated, c.threshold, c.eer, c.accuracy)
    (True, 3.0, 0.0, 1.0)
    """

    def __init__(self, window: int = 1000) -> None:
        if int(window) < 1:
            raise ValueError(f"window: must be >= 1, got {window!r}")
        self.window = int(window)
        self._pairs = np.zeros((self.window, 2))
        self._count = 0  # total pairs ever observed; the ring position is count % window
        self._cached: tuple[int, Calibration] | None = None

    def observe(self, d_pos: float, d_neg: float) -> None:
        """Record one triplet's positive and negative squared distances."""
        row = self._pairs[self._count % self.window]
        row[0] = d_pos
        row[1] = d_neg
        self._count += 1

    def observe_many(self, d_pos: Array, d_neg: Array) -> None:
        """Record several triplets, in order (as many :meth:`observe` calls)."""
        n = len(d_pos)
        if n >= self.window:  # only the newest ``window`` pairs survive
            d_pos, d_neg = d_pos[n - self.window :], d_neg[n - self.window :]
            self._count += n - self.window
            n = self.window
        _ring_write(self._pairs, self._count, d_pos, d_neg)
        self._count += n

    def restart(self) -> None:
        """Forget the window: the served metric changed units (a preconditioned learner's
        first ``W`` arrived), and distances measured before are not comparable.

        >>> cal = ThresholdCalibrator(window=10)
        >>> cal.observe(1.0, 2.0)
        >>> cal.restart()
        >>> cal.calibration().pairs
        0
        """
        self._pairs[:] = 0.0
        self._count = 0
        self._cached = None

    def _window(self) -> Array:
        return self._pairs[: min(self._count, self.window)]

    def calibration(self) -> Calibration:
        """The EER threshold of the current window (cached until the next observation)."""
        if self._cached is not None and self._cached[0] == self._count:
            return self._cached[1]
        pairs = self._window()
        n = len(pairs)
        if n == 0:
            result = Calibration(None, None, None, 0, False)
        else:
            threshold, eer, accuracy = _eer(np.sort(pairs[:, 0]), np.sort(pairs[:, 1]), pairs)
            result = Calibration(
                threshold=threshold, eer=eer, accuracy=accuracy, pairs=n, calibrated=n >= MIN_PAIRS
            )
        self._cached = (self._count, result)
        return result

    def ring(self) -> tuple[Array, int]:
        """A copy of the window as held (a ring buffer, not oldest first) and the count of
        pairs seen: :meth:`to_state`'s window is ``in_order(ring, count, self.window)``,
        made when needed (copying is cheap; ordering allocates twice).

        >>> cal = ThresholdCalibrator(window=2)
        >>> for p in (1.0, 2.0, 3.0):
        ...     cal.observe(p, 10 * p)
        >>> ring, count = cal.ring()
        >>> ring[:, 0].tolist(), in_order(ring, count, cal.window)[:, 0].tolist()
        ([3.0, 2.0], [2.0, 3.0])
        """
        return self._window().copy(), self._count

    def to_state(self) -> tuple[Array, dict[str, Any]]:
        """The window (oldest first) and JSON-safe metadata."""
        return in_order(self._window(), self._count, self.window), {
            "window": self.window,
            "count": self._count,
        }

    @classmethod
    def from_state(cls, pairs: Array, meta: dict[str, Any]) -> ThresholdCalibrator:
        """Inverse of :meth:`to_state`."""
        window, count = int(meta["window"]), int(meta["count"])
        pairs = np.asarray(pairs, dtype=np.float64).reshape(-1, 2)
        start = count % window if count > window else 0
        return cls.from_ring(np.roll(pairs, start, axis=0), count, window)

    @classmethod
    def from_ring(cls, ring: Array, count: int, window: int) -> ThresholdCalibrator:
        """Inverse of :meth:`ring` (``window``: its size): no reordering needed."""
        cal = cls(window)
        if len(ring) != min(count, cal.window):
            raise ValueError("calibration: window length does not match its count")
        cal._pairs[: len(ring)] = ring
        cal._count = count
        return cal


def in_order(ring: Array, count: int, window: int) -> Array:
    """The pairs of a window's ring (:meth:`ThresholdCalibrator.ring`), oldest first (a new
    array); ``count`` pairs were seen, at most ``window`` kept."""
    start = count % window if count > window else 0
    return np.roll(ring, -start, axis=0)


def served_threshold(
    calibration: Calibration, margin: float, given: float | None = None
) -> tuple[float, str]:
    """The verification threshold that is served, and where it comes from.

    The caller's (``"caller"``), else the calibrated EER threshold (``"calibrated"``), else
    (too few pairs to calibrate) the EER threshold of the partial window
    (``"fallback:window"``), else, with no pairs at all, the margin (``"fallback:margin"``: the
    loss, Eq. 4, asks negatives to be ``margin`` farther).

    >>> served_threshold(Calibration(2.5, 0.1, 0.9, 50, True), margin=1.0)
    (2.5, 'calibrated')
    >>> served_threshold(Calibration(None, None, None, 0, False), margin=1.0)
    (1.0, 'fallback:margin')
    """
    if given is not None:
        return check_threshold(given), "caller"
    if calibration.calibrated and calibration.threshold is not None:
        return calibration.threshold, "calibrated"
    if calibration.threshold is not None:
        return calibration.threshold, "fallback:window"
    return margin, "fallback:margin"
