"""No silent divergence: an O(1)-per-step blow-up indicator per copy of ``L``, and its policy.

Why it exists: on unnormalised inputs the paper's step (Eq. 12) can leave the region
of Lemma 2 on most triplets; the shrink guard of :mod:`service.core.update` keeps every step
defined, but each shrunk step may stretch ``L`` by up to ``1 / MIN_EIGENVALUE = 10``, and the
stretches compound (singular values of 1e87-1e107 after 2,000 samples were measured). Nothing
failed; the metric was silently useless.

What is measured (inside the compiled learning loop, per step that changes ``L``):

* ``shrunk_rate``: running share of triplet updates that needed the shrink guard (a mean over
  the last :data:`SHRUNK_HORIZON` of them, ``1/n`` weights until then). In the paper's regime
  (``||x|| <= 1``, ``gamma < 1/4``) and with ``step="scaled"`` at its default, it stays 0.
* ``||L||_F``: tracked exactly after every update in O(d) from the step's scalars (the rank-two
  correction ``L + p u^T + q v^T`` has ``<L, p u^T> = u.(L^T p)`` and ``L u`` is a combination
  of ``p = L a`` and ``q = L b``), and re-measured in full every :data:`RESYNC` updates, and
  whenever it shrank below 1/1000 of its last full measurement or of the absolute size of the
  terms one step summed (the O(d) update's rounding error is absolute: a step much larger than
  ``L``, with a huge ``gamma``, cancels down to far less than its terms), so that rounding
  cannot drift. ``growth`` is
  ``log10(||L||_F / ||L_0||_F)`` against the metric the track started from (the identity, or
  the last ``set_metric``); ``growth_rate`` the same over the last complete window of
  :data:`GROWTH_WINDOW` updates.

Policy. The monitor *trips* when, since it was last armed, at least :data:`MIN_TRIPLETS` triplet
updates were seen and ``shrunk_rate > MAX_SHRUNK_RATE``, or when ``||L||_F`` reached
:data:`MAX_GROWTH` times its value at the start of the current window. A trip cuts the step
multiplier ``step_scale`` (every later step of this copy of ``L`` uses ``step_scale * gamma``,
``gamma_pair`` too) by :data:`STEP_CUT`, or, when steps were shrunk since the monitor was armed,
by their geometric-mean ratio ``step used / step asked`` if that is smaller: the factor by which
the typical step overshot Lemma 2's limit, so one trip brings a step that is orders of magnitude
too large (the paper's ``gamma = 1e-3`` on inputs scaled by 1000) back in range instead of
halving twenty times while ``L`` compounds. A trip counts ``times_tripped`` and re-arms the
monitor (rate, shrink ratios and window start afresh), so a divergence that continues trips
again and cuts again. Nothing is undone: the metric learned so far is kept (it is usually still
ordered correctly; only its scale ran away). ``state`` is ``"ok"`` (never tripped),
``"diverging"`` (tripped within the last :data:`GROWTH_WINDOW` steps, passive ones included) or
``"stabilised"`` (tripped before, and that many steps have passed since without a trip). The
step multiplier never grows back: a stream that needed a smaller step once is taken to need it.
The thresholds are fixed (not hyperparameters): on the Table II data sets, the digits and the
Gaussian streams of ``benchmarks/scales.py``, healthy runs stay at a shrunk rate of 0 and grow
``||L||_F`` by far less than 10x per window (``benchmarks/results/scales.md``).

Everything here is a pure function of the stream in order: resuming from a checkpoint or
batching differently gives the same trips at the same samples. The compiled part (the state
layout, the thresholds and ``record_update``) lives in :mod:`service.core.update`, beside the
loop that calls it: numba's on-disk cache of a module does not notice edits to compiled code
it calls in another module.

>>> from service.core import Learner, LearnerConfig
>>> Learner(LearnerConfig(dim=2)).health["state"]
'ok'
"""

from __future__ import annotations

import math
from typing import Any

from service.core._validation import Array
from service.core.update import (
    CANCELLATION,
    FRO2,
    FRO2_START,
    GROWTH_RATE,
    GROWTH_WINDOW,
    LAST_TRIP,
    MAX_GROWTH,
    MAX_SHRUNK_RATE,
    MIN_TRIPLETS,
    RESYNC,
    SHRUNK_HORIZON,
    SHRUNK_RATE,
    STEP_CUT,
    STEP_SCALE,
    STEPS,
    TRIPS,
    UPDATES,
    WINDOW_START,
    fresh,
)

__all__ = [
    "CANCELLATION",
    "GROWTH_WINDOW",
    "MAX_GROWTH",
    "MAX_SHRUNK_RATE",
    "MIN_TRIPLETS",
    "RESYNC",
    "SHRUNK_HORIZON",
    "STEP_CUT",
    "fresh",
    "report",
    "restart",
]


def restart(st: Array, L: Array) -> Array:
    """``st`` after ``L`` was replaced: measurements start afresh, the step and trips stay."""
    out = fresh(L, st[STEP_SCALE], st[TRIPS])
    out[UPDATES] = st[UPDATES]
    out[STEPS] = st[STEPS]
    out[WINDOW_START] = st[UPDATES]
    out[LAST_TRIP] = st[LAST_TRIP]
    return out


def report(st: Array) -> dict[str, Any]:
    """The monitor's figures for one track, JSON-safe (see the module docstring).

    >>> import numpy as np
    >>> sorted(report(fresh(np.eye(2))))  # doctest: +NORMALIZE_WHITESPACE
    ['frobenius_norm', 'growth', 'growth_rate', 'shrunk_rate', 'state', 'step_scale',
     'times_tripped', 'updates']
    """
    trips = int(st[TRIPS])
    if trips == 0:
        state = "ok"
    elif st[LAST_TRIP] >= 0 and st[STEPS] - st[LAST_TRIP] < GROWTH_WINDOW:
        state = "diverging"
    else:
        state = "stabilised"
    start, now = float(st[FRO2_START]), float(st[FRO2])
    growth = 0.5 * math.log10(now / start) if start > 0.0 and now > 0.0 else None
    return {
        "state": state,
        "shrunk_rate": float(st[SHRUNK_RATE]),
        "growth": growth,
        "growth_rate": float(st[GROWTH_RATE]),
        "frobenius_norm": math.sqrt(now),
        "times_tripped": trips,
        "step_scale": float(st[STEP_SCALE]),
        "updates": int(st[UPDATES]),
    }
