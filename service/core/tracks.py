"""Copies of ``L`` learning side by side from one stream ("tracks").

A learner has one track; while a ``gamma="auto"`` race runs (:mod:`service.core.race`) it has
one per surviving candidate step size. Every track sees the same samples, the same buffer H and
the same triplets (one uniform draw per sample, shared), and has its own ``L``, triplet step
size, state vector (entry bound and divergence monitor, :mod:`service.core.health`), threshold
calibrator and outcome counts. One of them is *served*: its ``L`` answers queries and its
results are the learner's results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from service.core import health
from service.core._validation import Array
from service.core.calibration import ThresholdCalibrator
from service.core.update import OUTCOMES, STATE_SIZE, TRIPLET_CODES, learn_batch, nan_filled

#: ``observed`` of :func:`_triplet_distances` when every row is observed.
_EVERY: Any = np.ones(0, dtype=np.bool_)
_T0, _T1 = TRIPLET_CODES[0], TRIPLET_CODES[-1]


@njit(cache=True)
def _triplet_distances(
    codes: Any, values: Array, j: int, counts: Any, observed: Any
) -> tuple[Array, Array]:
    """Track ``j``'s outcomes added to ``counts``; and the (positive, negative) squared
    distances of its triplet steps, in order (only the rows ``observed`` marks; all of them
    when it is empty): one compiled pass that keeps the GIL (see
    :func:`~service.core._validation.all_finite`; this was a bincount, a mask and two fancy
    indexings)."""
    n = codes.shape[0]
    every = observed.shape[0] == 0
    d_pos = np.empty(n)
    d_neg = np.empty(n)
    m = 0
    for t in range(n):
        c = codes[t, j]
        counts[c] += 1
        if _T0 <= c <= _T1 and (every or observed[t]):
            d_pos[m] = values[t, j, 1]
            d_neg[m] = values[t, j, 2]
            m += 1
    return d_pos[:m], d_neg[:m]


class Tracks:
    """The tracks of one learner (see the module docstring).

    >>> t = Tracks(np.eye(2), [0.1, 0.3], window=10)
    >>> len(t), t.served, t.gammas.tolist()
    (2, 0, [0.1, 0.3])
    >>> t.keep([1]); len(t), t.gammas.tolist()
    (1, [0.3])
    """

    def __init__(self, L: Array, gammas: list[float], window: int) -> None:
        k = len(gammas)
        self.Ls: Array = np.repeat(np.asarray(L, dtype=np.float64)[None], k, axis=0)
        self.gammas: Array = np.array(gammas, dtype=np.float64)
        self.state: Array = np.repeat(health.fresh(self.Ls[0])[None], k, axis=0)
        self.calibrators = [ThresholdCalibrator(window) for _ in range(k)]
        self.counts: Any = np.zeros((k, len(OUTCOMES)), dtype=np.int64)
        self.served = 0
        self._indices: Any = np.arange(k)

    def __len__(self) -> int:
        return len(self.gammas)

    @property
    def L(self) -> Array:
        """The served ``L`` (writable: the learner hands out read-only views)."""
        out: Array = self.Ls[self.served]
        return out

    @property
    def calibrator(self) -> ThresholdCalibrator:
        return self.calibrators[self.served]

    def restart_calibration(self) -> None:
        """Every track's calibrator forgets its window (the metric's units changed)."""
        for calibrator in self.calibrators:
            calibrator.restart()

    def learn(
        self,
        H: Array,
        X: Array,
        slots: Any,
        known: Any,
        uniforms: Array,
        copml: bool,
        scaled: bool,
        gamma_pair: float,
        margin: float,
        stream: Array,
        observed: Any = None,
    ) -> tuple[Any, Array]:
        """Run the compiled loop on every track; each track's calibrator and counts take its
        own results (the calibrator only those of the rows ``observed`` marks, when given:
        rehearsal's arrivals). Returns ``codes`` ``(n, k)`` and ``values`` ``(n, k, 4)``."""
        n, k = len(X), len(self)
        codes = np.empty((n, k), dtype=np.int64)
        values = nan_filled((n, k, 4))
        learn_batch(
            self.Ls,
            self._indices,
            self.gammas,
            H,
            X,
            slots,
            known,
            uniforms,
            copml,
            scaled,
            gamma_pair,
            margin,
            stream,
            self.state,
            codes,
            values,
        )
        for j in range(k):
            code = codes[:, j]
            if n == 1 and observed is None:  # learn_one: spare it the bookkeeping below
                c = int(code[0])
                self.counts[j, c] += 1
                if TRIPLET_CODES[0] <= c <= TRIPLET_CODES[-1]:
                    self.calibrators[j].observe(float(values[0, j, 1]), float(values[0, j, 2]))
                continue
            d_pos, d_neg = _triplet_distances(
                codes, values, j, self.counts[j], _EVERY if observed is None else observed
            )
            self.calibrators[j].observe_many(d_pos, d_neg)
        return codes, values

    def expand(self, gammas: list[float], served: int) -> None:
        """Start a race: one copy of the served track per step size in ``gammas``."""
        j = self.served
        k = len(gammas)
        self.Ls = np.repeat(self.Ls[j : j + 1], k, axis=0)
        self.gammas = np.array(gammas, dtype=np.float64)
        self.state = np.repeat(self.state[j : j + 1], k, axis=0)
        window, meta = self.calibrators[j].to_state()
        self.calibrators = [ThresholdCalibrator.from_state(window, meta) for _ in range(k)]
        self.counts = np.repeat(self.counts[j : j + 1], k, axis=0)
        self.served = served
        self._indices = np.arange(k)

    def copy(self, src: int, dst: int, gamma: float) -> None:
        """Track ``dst`` becomes a copy of track ``src`` (``L``, monitor, calibrator, counts)
        with step size ``gamma``."""
        self.Ls[dst] = self.Ls[src]
        self.state[dst] = self.state[src]
        window, meta = self.calibrators[src].to_state()
        self.calibrators[dst] = ThresholdCalibrator.from_state(window, meta)
        self.counts[dst] = self.counts[src]
        self.gammas[dst] = gamma

    def keep(self, indices: list[int], served: int = 0) -> None:
        """Drop every track but ``indices`` (in that order); ``served`` indexes the kept ones."""
        self.Ls = np.ascontiguousarray(self.Ls[indices])
        self.gammas = self.gammas[indices]
        self.state = self.state[indices]
        self.calibrators = [self.calibrators[j] for j in indices]
        self.counts = self.counts[indices]
        self.served = served
        self._indices = np.arange(len(indices))

    def set_metric(self, L: Array) -> None:
        """Every track continues from ``L`` (bounds and monitors re-measured; steps kept)."""
        self.Ls[:] = L
        for j in range(len(self)):
            self.state[j] = health.restart(self.state[j], self.Ls[j])

    def health(self, j: int | None = None) -> dict[str, Any]:
        """:func:`service.core.health.report` of track ``j`` (default: the served one)."""
        return health.report(self.state[self.served if j is None else j])

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """The served track as ``L`` / ``calibration``; the others (during a race) as
        ``tracks_L`` (k, d, d) and ``tracks_calibration`` (k, window, 2, NaN-padded)."""
        window, cal_meta = self.calibrator.to_state()
        arrays = {"L": self.L.copy(), "calibration": window}
        meta: dict[str, Any] = {
            "gammas": self.gammas.tolist(),
            "state": self.state.tolist(),
            "counts": self.counts.tolist(),
            "served": self.served,
            "calibration": cal_meta,
        }
        if len(self) > 1:
            windows = [c.to_state() for c in self.calibrators]
            size = max(len(w) for w, _ in windows)
            padded = np.full((len(self), size, 2), np.nan)
            for j, (w, _) in enumerate(windows):
                padded[j, : len(w)] = w
            arrays["tracks_L"] = self.Ls.copy()
            arrays["tracks_calibration"] = padded
            meta["calibrations"] = [m for _, m in windows]
        return arrays, meta

    @classmethod
    def from_state(
        cls, arrays: dict[str, Array], meta: dict[str, Any], L: Array, dim: int
    ) -> Tracks:
        """Inverse of :meth:`to_state`; ``L`` is the validated served ``L``."""
        gammas = [float(g) for g in meta["gammas"]]
        k = len(gammas)
        served = int(meta["served"])
        if not 0 <= served < k:
            raise ValueError("state: served track out of range")
        tracks = cls(L, gammas, 1)
        state = np.array(meta["state"], dtype=np.float64).reshape(k, STATE_SIZE)
        if not np.isfinite(state).all():
            raise ValueError("state: track state is not finite")
        tracks.state = state
        tracks.counts = np.array(meta["counts"], dtype=np.int64).reshape(k, len(OUTCOMES))
        tracks.served = served
        if k == 1:
            tracks.calibrators = [
                ThresholdCalibrator.from_state(arrays["calibration"], meta["calibration"])
            ]
            return tracks
        Ls = np.array(arrays["tracks_L"], dtype=np.float64).reshape(k, dim, dim)
        if not np.isfinite(Ls).all() or not np.array_equal(Ls[served], L):
            raise ValueError("state: tracks_L does not hold the served L")
        tracks.Ls = np.ascontiguousarray(Ls)
        padded = np.asarray(arrays["tracks_calibration"], dtype=np.float64).reshape(k, -1, 2)
        tracks.calibrators = []
        for j, cal_meta in enumerate(meta["calibrations"]):
            n = min(int(cal_meta["count"]), int(cal_meta["window"]))
            tracks.calibrators.append(ThresholdCalibrator.from_state(padded[j, :n], cal_meta))
        return tracks
