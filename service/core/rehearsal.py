"""Rehearsal: every learned sample is followed by ``rehearsal`` steps on reservoir samples.

One pass of COPML learns from each sample once; a batch method such as ITML iterates over the
whole set. On the digits the gap is measurable: with the test set's hindsight no step size of
one pass reaches ITML's verification ROC AUC on z-scored or l2-normalised inputs
(``benchmarks/results/step_ceiling.md``). Rehearsal (experience replay, named so here because
"replay" already means re-applying the log after a restart) revisits the stream: after every
learned sample (an *arrival*), the learner takes ``rehearsal`` further steps, each on a sample
drawn uniformly from a reservoir of past learned samples, through the same triplet construction
(Sec. III-A: the rehearsed sample is the anchor, its class's buffer entry the positive, a
uniformly drawn other class's entry the negative; the rehearsed sample then becomes its class's
buffer entry, as an arrival does). Each step is the algorithm's own (Eq. 16, or Eq. 20 while one
class is known), so every guard and the divergence monitor apply to it.

* **Reservoir.** Algorithm R (Vitter, 1985) over the arrivals: the first ``rehearsal_memory``
  arrivals fill it; arrival ``i`` (0-based) after that replaces a uniformly drawn slot with
  probability ``rehearsal_memory / (i + 1)``. So at any time the reservoir is a uniform sample
  of every arrival so far. It holds the normalised rows (``rehearsal_memory x d`` float64,
  checkpointed with the model: 1 MiB at d = 128 and the default 1,000) and their class slots.
  Held-out samples are never learned, so never enter it: certificates stay out-of-sample.
* **Draws.** Every arrival draws ``2 + 2 rehearsal`` uniforms from the learner's generator, in
  one fixed order (its own triplet draw, the reservoir's, then a pick and a negative per rehearsal),
  so the state does not depend on how the stream is batched and resumes exactly from a
  checkpoint. With ``rehearsal = 0`` an arrival draws one uniform, as it always did.
* **What sees rehearsal steps.** ``L``, the buffer, the running scale of ``step="scaled"`` and
  the divergence monitor (they are steps like any other). Not the verification calibrator, not the
  ``gamma="auto"`` race's scores or rung counts, not the per-sample outcome counts: those are
  the arrivals' only, measured before the arrival was learned (rehearsed samples have been
  learned from, so their distances are not out-of-sample).
* **Cost.** ``1 + rehearsal`` steps per arrival (CPU), plus the reservoir's memory.
* **Stability diagnostics.** The stability paper's step masses are kept per buffer entry;
  a rehearsed sample is a new entry, so with ``rehearsal > 0`` ``step_mass_max`` is per
  occurrence, not per sample (:mod:`service.core.stability`; OPML/COPML have no
  stability parameter either way).

Measured (``benchmarks/results/scales.md``, the ``auto_rehearsal`` column): ``gamma="auto"`` with
``rehearsal=2`` against batch ITML on the 64-d cells.

>>> r = Reservoir(dim=2, capacity=3)
>>> rows = np.arange(8.0).reshape(4, 2)
>>> draws = np.full((4, 4), 0.5)
>>> X, slots, known, u, arrival = r.expand(rows, np.array([0, 1, 0, 1]), np.array([0, 1, 2, 2]),
...                                        draws, 1)
>>> arrival.tolist()
[True, False, True, False, True, False, True, False]
>>> r.size, r.seen
(3, 4)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from service.core._validation import Array
from service.core.update import _JIT

#: Default reservoir size (samples).
DEFAULT_MEMORY = 1000


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _expand(
    rows: Array,
    slots: Any,
    known: Any,
    draws: Array,
    rehearsal: int,
    store: Array,
    store_slots: Any,
    seen: int,
    out_rows: Array,
    out_slots: Any,
    out_known: Any,
    out_uniforms: Array,
    arrival: Any,
) -> int:
    """Interleave each arrival with ``rehearsal`` reservoir draws (reservoir updated in place);
    returns the new count of arrivals seen."""
    capacity = store.shape[0]
    for t in range(rows.shape[0]):
        i = t * (1 + rehearsal)
        out_rows[i] = rows[t]
        out_slots[i] = slots[t]
        out_known[i] = known[t]
        out_uniforms[i] = draws[t, 0]
        arrival[i] = True
        # Algorithm R: fill, then replace a uniform slot with probability capacity / (seen + 1).
        j = seen if seen < capacity else int(draws[t, 1] * (seen + 1))
        if j < capacity:
            store[j] = rows[t]
            store_slots[j] = slots[t]
        seen += 1
        size = min(seen, capacity)
        after = known[t] + (1 if slots[t] == known[t] else 0)  # classes known after arrival t
        for r in range(rehearsal):
            p = min(int(draws[t, 2 + 2 * r] * size), size - 1)
            k = i + 1 + r
            out_rows[k] = store[p]
            out_slots[k] = store_slots[p]
            out_known[k] = after
            out_uniforms[k] = draws[t, 3 + 2 * r]
            arrival[k] = False
    return seen


class Reservoir:
    """A uniform sample of the learned rows, expanded into rehearsal steps (module docstring).

    >>> r = Reservoir(dim=3, capacity=10)
    >>> r.size, r.to_state()[1]
    (0, {'seen': 0, 'capacity': 10})
    """

    def __init__(self, dim: int, capacity: int) -> None:
        self.capacity = capacity
        self.seen = 0
        self._rows: Array = np.empty((0, dim))
        self._slots: Any = np.empty(0, dtype=np.int64)

    @property
    def size(self) -> int:
        """Samples held (``min(seen, capacity)``)."""
        return min(self.seen, self.capacity)

    @staticmethod
    def draws_per_arrival(rehearsal: int) -> int:
        """Uniforms each arrival draws: its triplet draw, then ``1 + 2 rehearsal`` for rehearsal."""
        return 2 + 2 * rehearsal

    def expand(
        self, rows: Array, slots: Any, known: Any, draws: Array, rehearsal: int
    ) -> tuple[Array, Any, Any, Array, Any]:
        """The stream to learn: each arrival followed by its ``rehearsal`` steps. Returns rows,
        class slots, classes known before each row, triplet uniforms and the arrival mask."""
        n, d = rows.shape
        need = min(self.capacity, self.seen + n)
        if need > len(self._rows):  # doubling (as the buffer H grows): O(1) copies per sample
            grow = min(self.capacity, max(need, 2 * len(self._rows)))
            rows_, slots_ = np.empty((grow, d)), np.empty(grow, dtype=np.int64)
            rows_[: len(self._rows)] = self._rows
            slots_[: len(self._slots)] = self._slots
            self._rows, self._slots = rows_, slots_
        m = n * (1 + rehearsal)
        out_rows = np.empty((m, d))
        out_slots = np.empty(m, dtype=np.int64)
        out_known = np.empty(m, dtype=np.int64)
        out_uniforms = np.empty(m)
        arrival = np.empty(m, dtype=np.bool_)
        self.seen = int(
            _expand(
                rows,
                np.ascontiguousarray(slots, dtype=np.int64),
                np.ascontiguousarray(known, dtype=np.int64),
                np.ascontiguousarray(draws),
                rehearsal,
                self._rows,
                self._slots,
                self.seen,
                out_rows,
                out_slots,
                out_known,
                out_uniforms,
                arrival,
            )
        )
        return out_rows, out_slots, out_known, out_uniforms, arrival

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """Arrays (``rehearsal_rows``, ``rehearsal_slots``) and JSON-safe metadata."""
        size = self.size
        arrays = {
            "rehearsal_rows": self._rows[:size].copy(),
            "rehearsal_slots": self._slots[:size].copy(),
        }
        return arrays, {"seen": self.seen, "capacity": self.capacity}

    def restore(self, arrays: dict[str, Array], meta: dict[str, Any], n_classes: int) -> None:
        """Inverse of :meth:`to_state`; ValueError if the state is inconsistent."""
        seen = int(meta["seen"])
        if seen < 0 or int(meta["capacity"]) != self.capacity:
            raise ValueError("state: rehearsal reservoir does not match rehearsal_memory")
        size = min(seen, self.capacity)
        d = self._rows.shape[1]
        rows = np.asarray(arrays.get("rehearsal_rows", np.empty((0, d))), dtype=np.float64)
        rows = rows.reshape(-1, d) if rows.size else np.empty((0, d))
        slots = np.asarray(arrays.get("rehearsal_slots", np.empty(0)), dtype=np.int64).reshape(-1)
        if len(rows) != size or len(slots) != size:
            raise ValueError("state: rehearsal reservoir rows do not match its count")
        if size and (not np.isfinite(rows).all() or slots.min() < 0 or slots.max() >= n_classes):
            raise ValueError("state: rehearsal reservoir holds an invalid row or class")
        self._rows, self._slots, self.seen = np.array(rows, order="C"), slots.copy(), seen
