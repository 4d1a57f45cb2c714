"""The learner's per-batch helpers that depend only on their inputs: the negative-class draw
of each sample (compiled) and the step-mass accounting a configuration implies."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from numba import njit

from service.core import steps
from service.core._validation import Array
from service.core.config import GRADIENT_ALGORITHMS, LearnerConfig
from service.core.gradient import CONSTANT, STEP_RULES
from service.core.race import DEFAULT_GAMMA
from service.core.stability import StabilityTracker


@njit(cache=True, error_model="numpy")
def negative_slots(uniforms: Array, known: Any, slots: Any) -> Any:
    """Per sample, the slot of its negative class, drawn by its uniform among the ``known``
    classes other than its own (``slots``): ``floor(u (known - 1))``, that slot skipped. The
    arithmetic of ``(u * max(known - 1, 0)).astype(int64)`` then ``+= (negative >= slot)``,
    in one compiled pass that keeps the GIL (see :func:`~service.core._validation.all_finite`:
    those were five NumPy calls)."""
    n = uniforms.shape[0]
    negatives = np.empty(n, dtype=np.int64)
    for t in range(n):
        others = max(known[t] - 1, 0)
        negative = np.int64(uniforms[t] * others)
        if negative >= slots[t]:
            negative += 1
        negatives[t] = negative
    return negatives


def tracker_for(config: LearnerConfig) -> StabilityTracker:
    """The step-mass accounting of ``config``'s algorithm (nominal steps, see its module).

    OPML / COPML: ``gamma`` and ``gamma_pair`` in their step rule's units (the learner sets
    the triplet step to the served track's ``gamma`` before each batch: the race's leader
    under ``gamma="auto"``)."""
    if config.algorithm == "lda":  # no steps: nothing is observed
        return StabilityTracker(0.0, 0.0, CONSTANT, mu=None, lam=0.0)
    if config.algorithm in GRADIENT_ALGORITHMS:
        assert config.eta is not None and config.step is not None  # set by LearnerConfig
        return StabilityTracker(
            eta_triplet=config.eta,
            eta_pair=0.5 * cast(float, config.gamma_pair),  # sgd's pair step s = 2 eta
            rule=STEP_RULES.index(config.step),
            mu=config.mu,
            lam=config.lam or 0.0,
            convex=config.algorithm == "sgd_psd",
        )
    gamma = DEFAULT_GAMMA if config.gamma == steps.AUTO else cast(float, config.gamma)
    return StabilityTracker(gamma, cast(float, config.gamma_pair), CONSTANT, mu=None, lam=0.0)
