"""``gamma="auto"``: the learner picks its step size from the stream, for as long as it learns.

A user of 128- or 512-d embeddings cannot know which step size their data need, and the best
step changes along a stream: early on the largest step ranks best, after some thousands of
samples a smaller one overtakes it (a longer stream rewards a step that settles). So the
learner keeps racing:

* **Candidates.** At the first learned sample the served ``L`` is copied into
  :data:`CANDIDATES` tracks (:class:`~service.core.tracks.Tracks`) with step sizes a factor of
  two apart around the leader, initially ``DEFAULT_GAMMA / 2``, :data:`DEFAULT_GAMMA` and
  ``2 DEFAULT_GAMMA``. All learn from the same triplets (same buffer, same uniform draws), each
  its own ``L``, differing only in ``gamma``.
* **Score.** Prequential: every triplet's ``d_pos`` and ``d_neg`` are measured by each candidate
  *before* its update, so they are honest out-of-sample measurements. The stream is cut into
  blocks of ``auto_warmup / 2`` triplets; a candidate's block score is the ROC AUC of its
  positive against its negative distances, ``P(d_pos < d_neg')`` over every pair of the
  block's triplets (ties count one half): a verification measure with one global threshold,
  scale-free (it ignores the scale of ``L``, which differs between step sizes). Its running
  score forgets exponentially: ``score <- (1 - FORGET) score + FORGET block_auc``.
* **Leader, with hysteresis.** The served track (the *leader*) changes only when another
  candidate's running score beats the leader's by more than :data:`HYSTERESIS` (or the
  leader's divergence monitor tripped and the other's did not): a metric that is as good is
  not swapped for another. Until the first block ends :data:`DEFAULT_GAMMA`'s candidate is
  served.
* **Re-centring.** When the leader has the smallest or the largest step of the candidates,
  the candidate farthest from it is replaced by a copy of the leader (its ``L``, monitor,
  calibrator and running score) with the next step a factor two beyond it, within
  [:data:`LOWEST`, :data:`HIGHEST`]: the grid follows the leader along the stream.
* **CPU.** Every learned sample costs one step per candidate: 3x a fixed step's CPU and 3x
  the memory of ``L`` for as long as the model learns (the bound the race is designed to;
  block scoring adds O(block log block) per block). The CPU column of
  ``benchmarks/results/batch_compare.md`` has it per fit.

The block boundaries count samples that form a triplet, fixed by the stream before anything is
learned, so the race is the same however the stream is batched, and :meth:`Race.to_state` /
:meth:`Race.from_state` (with the tracks) resume it exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.core._validation import Array
from service.core.steps import DEFAULTS
from service.core.tracks import Tracks
from service.core.update import TRIPS

#: The default step size of ``step="scaled"`` (served until the first block ends).
DEFAULT_GAMMA = DEFAULTS["scaled"][0]
#: The first candidates (``step="scaled"`` units), factors of 2 around the default.
GRID = (DEFAULT_GAMMA / 2, DEFAULT_GAMMA, 2 * DEFAULT_GAMMA)
#: Candidates raced at any time (the race's CPU and memory factor).
CANDIDATES = len(GRID)
#: The range the candidates' steps stay in: on the digits 0.3 already cost several points of
#: 5-NN error on some splits and 1.0 wrecked every data set tried.
LOWEST, HIGHEST = DEFAULT_GAMMA / 8, DEFAULT_GAMMA * 8
#: Weight of the newest block in a running score (a horizon of about two blocks).
FORGET = 0.5
#: AUC margin by which a candidate must beat the leader to take over.
HYSTERESIS = 0.002
#: Blocks kept in the report's ``rounds``.
HISTORY = 8


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
    """The continuing race of step sizes (see the module docstring).

    ``alive`` indexes the candidates, in the order of the learner's tracks; ``gammas`` their
    step sizes, ``scores`` their running scores (None before their first block),
    ``leader`` the served one; ``pairs[:, :filled]`` the current block's ``(d_pos, d_neg)``
    per candidate (NaN where a candidate's step was skipped).

    >>> race = Race(warmup=100)
    >>> race.block, race.boundary(), race.alive, race.pairs.shape, race.done
    (50, 50, [0, 1, 2], (3, 50, 2), False)
    """

    def __init__(self, warmup: int, grid: tuple[float, ...] = GRID) -> None:
        self.warmup = int(warmup)
        self.block = max(5, self.warmup // 2)
        self.gammas = [float(g) for g in grid]
        self.scores: list[float | None] = [None] * len(self.gammas)
        self.leader = self.gammas.index(DEFAULT_GAMMA) if DEFAULT_GAMMA in self.gammas else 0
        self.blocks = 0
        self.triplets = 0
        self.switches = 0
        self.started = False
        self.history: list[dict[str, Any]] = []
        self._new_block()

    def _new_block(self) -> None:
        self.pairs: Array = np.full((len(self.gammas), self.block, 2), np.nan)
        self.filled = 0

    @property
    def done(self) -> bool:
        """Never: the race goes on for as long as the model learns."""
        return False

    @property
    def alive(self) -> list[int]:
        return list(range(len(self.gammas)))

    def start(self, tracks: Tracks) -> None:
        """Copy the served track once per candidate; serve the default step's."""
        tracks.expand(list(self.gammas), self.leader)
        self.started = True

    def boundary(self) -> int:
        """Triplets (since the race began) at which the current block ends."""
        return (self.blocks + 1) * self.block

    def cuts(self, forms: Any) -> list[int]:
        """Where to cut a batch (exclusive ends) so that every block ends at a cut; ``forms``
        marks the batch's samples that form a triplet."""
        ends: list[int] = []
        seen = np.cumsum(forms)
        total = int(seen[-1]) if len(seen) else 0
        need = self.boundary() - self.triplets
        while need <= total:
            ends.append(int(np.searchsorted(seen, need)) + 1)  # first sample reaching it
            need += self.block
        if not ends or ends[-1] != len(forms):
            ends.append(len(forms))
        return ends

    def record(self, tracks: Tracks, forms: Any, values: Array) -> None:
        """Book a segment's triplets (``values`` as returned by ``Tracks.learn``); at a block's
        end, update the scores, the leader and the candidates."""
        n = int(np.count_nonzero(forms))
        if n == 0:
            return
        self.pairs[:, self.filled : self.filled + n] = values[forms][:, :, 1:3].transpose(1, 0, 2)
        self.filled += n
        self.triplets += n
        if self.triplets >= self.boundary():
            self._end_block(tracks)

    def _end_block(self, tracks: Tracks) -> None:
        k = len(self.gammas)
        aucs = []
        for j in range(k):
            pos, neg = self.pairs[j, : self.filled, 0], self.pairs[j, : self.filled, 1]
            block = auc(pos[np.isfinite(pos)], neg[np.isfinite(neg)])
            aucs.append(block)
            old = self.scores[j]
            if block is not None:
                self.scores[j] = block if old is None else (1 - FORGET) * old + FORGET * block
        tripped = [bool(tracks.state[j, TRIPS] > 0) for j in range(k)]

        def rank(j: int) -> tuple[bool, float]:
            score = self.scores[j]
            return (not tripped[j], -1.0 if score is None else score)

        best = max(range(k), key=rank)
        lead = self.leader
        lead_score, best_score = rank(lead)[1], rank(best)[1]
        if best != lead and (
            (tripped[lead] and not tripped[best]) or best_score > lead_score + HYSTERESIS
        ):
            self.leader = lead = best
            self.switches += 1
        self.blocks += 1
        self.history.append(
            {
                "rung": self.blocks,
                "triplets": self.triplets,
                "candidates": [
                    {"gamma": self.gammas[j], "score": aucs[j], "tripped": tripped[j]}
                    for j in range(k)
                ],
                "kept": [self.gammas[lead]],
            }
        )
        del self.history[:-HISTORY]
        order = sorted(range(k), key=lambda j: self.gammas[j])
        gamma = self.gammas[lead]
        if lead == order[0] and gamma / 2 >= LOWEST:
            self._replace(tracks, order[-1], gamma / 2)
        elif lead == order[-1] and gamma * 2 <= HIGHEST:
            self._replace(tracks, order[0], gamma * 2)
        tracks.served = lead
        self._new_block()

    def _replace(self, tracks: Tracks, j: int, gamma: float) -> None:
        """Candidate ``j`` becomes a copy of the leader with step ``gamma``."""
        tracks.copy(self.leader, j, gamma)
        self.gammas[j] = gamma
        self.scores[j] = self.scores[self.leader]

    def report(self, tracks: Tracks | None = None) -> dict[str, Any]:
        """JSON-safe figures for the model document: state (always ``racing``), the
        candidates' steps (``grid``), the block size (``warmup``: two blocks), progress, the
        served step, the last blocks' scores (``rounds``) and the candidates' health."""
        out: dict[str, Any] = {
            "state": "racing",
            "grid": sorted(self.gammas),
            "warmup": self.warmup,
            "triplets": self.triplets,
            "rung": self.blocks,
            "rungs": self.blocks + 1,
            "winner": None,
            "rounds": [dict(r) for r in self.history],  # a copy: a report outlives the next
            "serving": self.gammas[self.leader] if self.started else None,
        }
        if tracks is not None:
            out["candidates"] = [
                {"gamma": float(tracks.gammas[j]), **tracks.health(j)} for j in range(len(tracks))
            ]
        return out

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> tuple[Array, dict[str, Any]]:
        """The current block's pairs so far (k, m, 2) and JSON-safe metadata."""
        meta = {
            "warmup": self.warmup,
            "gammas": list(self.gammas),
            "scores": list(self.scores),
            "leader": self.leader,
            "blocks": self.blocks,
            "triplets": self.triplets,
            "switches": self.switches,
            "started": self.started,
            "history": self.history,
        }
        return self.pairs[:, : self.filled].copy(), meta

    @classmethod
    def from_state(cls, pairs: Array, meta: dict[str, Any]) -> Race:
        """Inverse of :meth:`to_state`; ValueError if they do not fit together. The state of
        the warm-up race that preceded this one (it has ``alive``, no ``gammas``) restarts the
        race from the served metric at the next learned sample."""
        if "gammas" not in meta and "alive" in meta:
            return cls(int(meta["warmup"]))
        gammas = tuple(float(g) for g in meta["gammas"])
        race = cls(int(meta["warmup"]), gammas)
        race.scores = [None if s is None else float(s) for s in meta["scores"]]
        race.leader = int(meta["leader"])
        if len(race.scores) != len(gammas) or not 0 <= race.leader < len(gammas):
            raise ValueError("state: race candidates do not fit together")
        race.blocks = int(meta["blocks"])
        race.triplets = int(meta["triplets"])
        race.switches = int(meta["switches"])
        race.started = bool(meta["started"])
        race.history = list(meta["history"])
        got = np.asarray(pairs, dtype=np.float64).reshape(len(gammas), -1, 2)
        if got.shape[1] > race.block:
            raise ValueError("state: race pairs exceed the block")
        race.pairs[:, : got.shape[1]] = got
        race.filled = got.shape[1]
        return race
