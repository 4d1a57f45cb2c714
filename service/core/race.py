"""``gamma="auto"``: the learner picks its step size from the stream itself.

A user of 128- or 512-d embeddings cannot know which step size their data need, and the step
that ranks best differs between data sets even in the scale-free units of ``step="scaled"``. So
the learner races a small grid of step sizes, :data:`GRID`, on the same samples and commits to
the winner:

* **Candidates.** At the first learned sample the served ``L`` is copied once per grid value
  (:class:`~service.core.tracks.Tracks`); all copies learn from the same triplets (same buffer,
  same uniform draws), differing only in ``gamma``.
* **Score.** Prequential: every triplet's ``d_pos`` and ``d_neg`` are measured by each
  candidate *before* its update, so they are honest out-of-sample measurements. A candidate's
  score over a rung is the ROC AUC of its positive against its negative distances,
  ``P(d_pos < d_neg')`` over every pair of the rung's triplets (ties count one half): a
  verification measure with one global threshold, scale-free (it ignores the scale of ``L``,
  which differs between step sizes). In an exploration on digits and optdigits (z-scored, 3
  splits each, steps 0.01 to 1) the first rung's AUC put the step with the best held-out
  verification AUC first in all 6 cases, the paired triplet accuracy ``P(d_pos < d_neg)`` in 4
  (twice it preferred a step three times too large).
* **Successive halving.** The warm-up of ``auto_warmup`` triplets is cut into
  ``ceil(log2(len(GRID)))`` equal rungs (2 for the 4 candidates). At the end of a rung the better
  half (by score; a candidate whose divergence monitor tripped ranks last; ties go to the smaller
  step) survives and the best becomes the served one; after the last rung only the winner is
  left and its ``L`` continues as the model's (the race is *done*). Until the first rung ends,
  :data:`DEFAULT_GAMMA`'s candidate (the non-auto default) is served.
* **CPU.** While racing, every sample costs one step per live candidate: 4x during the first
  half of the warm-up, 2x during the second, 3x averaged over the warm-up (and 4x the memory of
  ``L``); afterwards exactly the cost of a fixed step. The default warm-up (1,000 triplets) is
  3,000 step-equivalents: about 0.4 s of CPU at d = 512 (~130 us a step on this machine), the
  CPU column of ``benchmarks/results/scales.md`` has it per fit.

The rung boundaries count samples that form a triplet, fixed by the stream before anything is
learned, so the race is the same however the stream is batched, and :meth:`Race.to_state` /
:meth:`Race.from_state` (with the tracks) resume it exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.core._validation import Array
from service.core.steps import DEFAULTS
from service.core.tracks import Tracks
from service.core.update import TRIPS

#: The default step size of ``step="scaled"`` (served until the first rung ends).
DEFAULT_GAMMA = DEFAULTS["scaled"][0]
#: Candidate step sizes (``step="scaled"`` units), factors of 2 around the default: on the
#: digits the best verification AUC was at 0.1, the best 5-NN error below 0.05; 0.3 already
#: cost several points of 5-NN error on some splits and 1.0 was far worse on every data set.
GRID = (DEFAULT_GAMMA / 2, DEFAULT_GAMMA, 2 * DEFAULT_GAMMA, 4 * DEFAULT_GAMMA)


def auc(d_pos: Array, d_neg: Array) -> float | None:
    """``P(d_pos < d_neg')`` over all pairs, ties one half (None when either side is empty).

    >>> auc(np.array([1.0, 2.0]), np.array([3.0, 2.0]))
    0.875
    """
    if len(d_pos) == 0 or len(d_neg) == 0:
        return None
    neg = np.sort(d_neg)
    above = len(neg) - np.searchsorted(neg, d_pos, side="right")
    ties = np.searchsorted(neg, d_pos, side="right") - np.searchsorted(neg, d_pos, side="left")
    return float((above.sum() + 0.5 * ties.sum()) / (len(d_pos) * len(neg)))


class Race:
    """Successive halving over :data:`GRID` (see the module docstring).

    ``alive`` holds the grid indices of the live candidates, in the order of the learner's
    tracks; ``pairs[:, :filled]`` the current rung's ``(d_pos, d_neg)`` per live candidate (NaN
    where a candidate's step was skipped).

    >>> race = Race(warmup=100)
    >>> race.rungs, race.boundary(), race.alive, race.pairs.shape
    (2, 50, [0, 1, 2, 3], (4, 50, 2))
    """

    def __init__(self, warmup: int, grid: tuple[float, ...] = GRID) -> None:
        self.grid = tuple(grid)
        self.warmup = int(warmup)
        self.rungs = max(1, math.ceil(math.log2(len(self.grid))))
        self.rung = 0
        self.triplets = 0
        self.alive = list(range(len(self.grid)))
        self.started = False
        self.history: list[dict[str, Any]] = []
        self._new_rung()

    def _new_rung(self) -> None:
        start = self.warmup * self.rung // self.rungs
        size = self.boundary() - start if not self.done else 0
        self.pairs: Array = np.full((len(self.alive), size, 2), np.nan)
        self.filled = 0

    @property
    def done(self) -> bool:
        return self.rung >= self.rungs

    def start(self, tracks: Tracks) -> None:
        """Copy the served track once per candidate; serve the default step's."""
        tracks.expand(list(self.grid), self.grid.index(DEFAULT_GAMMA))
        self.started = True

    def boundary(self) -> int:
        """Triplets (since the race began) at which the current rung ends."""
        return self.warmup * (self.rung + 1) // self.rungs

    def cuts(self, forms: Any) -> list[int]:
        """Where to cut a batch (exclusive ends) so that every rung ends at a cut; ``forms``
        marks the batch's samples that form a triplet."""
        ends: list[int] = []
        if not self.done:
            seen = np.cumsum(forms)
            rung, done_at = self.rung, self.triplets
            while rung < self.rungs:
                need = self.warmup * (rung + 1) // self.rungs - done_at
                hit = int(np.searchsorted(seen, need))  # first sample reaching the boundary
                if hit >= len(seen):
                    break
                ends.append(hit + 1)
                rung += 1
        if not ends or ends[-1] != len(forms):
            ends.append(len(forms))
        return ends

    def record(self, tracks: Tracks, forms: Any, values: Array) -> None:
        """Book a segment's triplets (``values`` as returned by ``Tracks.learn``); at a rung's
        end, eliminate the worse half and serve the best (commit after the last rung)."""
        n = int(np.count_nonzero(forms))
        if self.done or n == 0:
            return
        self.pairs[:, self.filled : self.filled + n] = values[forms][:, :, 1:3].transpose(1, 0, 2)
        self.filled += n
        self.triplets += n
        if self.triplets >= self.boundary():
            self._end_rung(tracks)

    def _end_rung(self, tracks: Tracks) -> None:
        scores = []
        for j in range(len(self.alive)):
            pos, neg = self.pairs[j, : self.filled, 0], self.pairs[j, : self.filled, 1]
            scores.append(auc(pos[np.isfinite(pos)], neg[np.isfinite(neg)]))
        tripped = [bool(tracks.state[j, TRIPS] > 0) for j in range(len(self.alive))]
        rank = [-1.0 if score is None else -score for score in scores]
        order = sorted(range(len(self.alive)), key=lambda j: (tripped[j], rank[j], j))
        self.rung += 1
        keep = order[:1] if self.done else order[: math.ceil(len(order) / 2)]
        self.history.append(
            {
                "rung": self.rung,
                "triplets": self.triplets,
                "candidates": [
                    {"gamma": self.grid[g], "score": scores[j], "tripped": tripped[j]}
                    for j, g in enumerate(self.alive)
                ],
                "kept": [self.grid[self.alive[j]] for j in keep],
            }
        )
        tracks.keep(keep, served=0)
        self.alive = [self.alive[j] for j in keep]
        self._new_rung()

    def report(self, tracks: Tracks | None = None) -> dict[str, Any]:
        """JSON-safe figures for the model document: state, grid, warm-up, progress, the
        served / winning step, each rung's scores, and the live candidates' health."""
        out: dict[str, Any] = {
            "state": "done" if self.done else "racing",
            "grid": list(self.grid),
            "warmup": self.warmup,
            "triplets": self.triplets,
            "rung": self.rung,
            "rungs": self.rungs,
            "winner": self.grid[self.alive[0]] if self.done else None,
            "rounds": list(self.history),  # a copy: a report outlives the next rung
        }
        if tracks is not None:
            out["serving"] = float(tracks.gammas[tracks.served])
            out["candidates"] = [
                {"gamma": float(tracks.gammas[j]), **tracks.health(j)} for j in range(len(tracks))
            ]
        return out

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> tuple[Array, dict[str, Any]]:
        """The current rung's pairs so far (k, m, 2) and JSON-safe metadata."""
        meta = {
            "grid": list(self.grid),
            "warmup": self.warmup,
            "started": self.started,
            "rung": self.rung,
            "triplets": self.triplets,
            "alive": list(self.alive),
            "history": self.history,
        }
        return self.pairs[:, : self.filled].copy(), meta

    @classmethod
    def from_state(cls, pairs: Array, meta: dict[str, Any]) -> Race:
        """Inverse of :meth:`to_state`; ValueError if they do not fit together."""
        race = cls(int(meta["warmup"]), tuple(float(g) for g in meta["grid"]))
        race.started = bool(meta["started"])
        race.rung = int(meta["rung"])
        race.triplets = int(meta["triplets"])
        race.alive = [int(g) for g in meta["alive"]]
        race.history = list(meta["history"])
        race._new_rung()
        got = np.asarray(pairs, dtype=np.float64).reshape(len(race.alive), -1, 2)
        if got.shape[1] > race.pairs.shape[1]:
            raise ValueError("state: race pairs exceed the rung")
        race.pairs[:, : got.shape[1]] = got
        race.filled = got.shape[1]
        return race
