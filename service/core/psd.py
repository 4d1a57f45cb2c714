"""Projected online SGD on ``M = L^T L`` (M-SGD, docs/algorithms/gradient.md): the convex setting
of the stability paper (Chen et al., AAAI 2023), with its sign error fixed.

The parameter is the symmetric matrix ``M``; the loss ``l_mu(<M, A> + margin)`` (with
``A = a a^T - b b^T``) is convex in ``M``, ``||A||_F``-Lipschitz and ``||A||_F^2 / (4 mu)``-smooth
(``mu > 0``). One step with the paper's regulariser ``lam ||M||_F^2``::

    z = a^T M a - b^T M b + margin,   q = sigma(z / mu)   (q = 1[z > 0] for mu = 0)
    M <- Pi_PSD( (1 - 2 eta lam) M - eta_t q A ),    Pi_PSD(W) = V max(Lambda, 0) V^T

Projecting onto the PSD cone after every active step is what the theory covers (a lazy
projection would be an approximation); it is non-expansive, so the paper's Lemma 2 recursion is
unchanged. Step rules and ``kappa`` as in :mod:`service.core.sgd` (``descent``:
``eta_t q lambda_+ <= kappa / 2``; the decay uses the rule's step).

Cost: **O(d^3) per active step** (one ``L^T L`` product and one symmetric eigendecomposition,
~9 d^3 flops: d = 64 ~ 2 Mflop, d = 512 ~ 1.2 Gflop); passive steps cost O(d^2) (``z``) plus
O(d^2) for the decay when ``lam > 0``. Use it for small ``d`` or where the convex theory is the
point; ``sgd`` is the O(d^2) learner.

Serving needs a factor of ``M``: the learner's state is ``L = Lambda_+^{1/2} V^T``, read off
the projection's eigendecomposition at no extra cost, and ``M = L^T L`` is rebuilt from it at the
next active step (the same O(d^3) as keeping ``M``, and one state for queries and checkpoints).
Guards as in :mod:`service.core.sgd`; besides, a step whose projected ``M`` would have an
eigenvalue above :data:`~service.core._validation.MAX_ABS_ENTRY` is ``skipped``, so every entry of
``M`` stays below it and every entry of ``L`` below its square root.

The compiled step (:func:`~service.core.gradient.psd_triplet`) is in :mod:`service.core.gradient`
with the loop, for numba's cache (see there).
"""

from __future__ import annotations

import numpy as np

from service.core._validation import Array
from service.core.gradient import STEP_RULES, psd_triplet
from service.core.update import StepResult, _single


def psd_step(
    L: Array,
    ab: Array,
    eta: float,
    margin: float = 1.0,
    mu: float = 0.0,
    step: str = "constant",
    kappa: float = 0.5,
    t: int = 1,
) -> StepResult:
    """One M-SGD step (no decay) on the C-contiguous factor ``L`` of ``M`` in place.

    >>> L = np.eye(2)
    >>> r = psd_step(L, np.array([[0.0, 0.1], [1.0, 0.0]]), eta=0.25)
    >>> M = L.T @ L                       # I - 0.25 A = diag(1.25, 0.9975)
    >>> r.outcome, M.round(4).tolist()
    ('sgd_update', [[1.25, 0.0], [0.0, 0.9975]])
    """
    out = np.empty(4)
    code, _, _ = psd_triplet(
        L,
        np.ascontiguousarray(ab, dtype=np.float64),
        float(np.abs(L).max()),
        t,
        eta,
        mu,
        kappa,
        0.0,
        STEP_RULES.index(step),
        margin,
        out,
    )
    return _single(code, out)
