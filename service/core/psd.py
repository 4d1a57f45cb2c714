"""Projected online SGD on ``M = L^T L`` (M-SGD, ``seed-specs.md`` 1.4-1.5): the convex setting
of seed 000 (Chen et al., AAAI 2023), with its sign error fixed (1.2.1).

The parameter is the symmetric matrix ``M``; the loss ``l_mu(<M, A> + margin)`` (1.3, with
``A = a a^T - b b^T``) is convex in ``M``, ``||A||_F``-Lipschitz and ``||A||_F^2 / (4 mu)``-smooth
(``mu > 0``). One step (1.5) with seed 000's regulariser ``lam ||M||_F^2``::

    z = a^T M a - b^T M b + margin,   q = sigma(z / mu)   (q = 1[z > 0] for mu = 0)
    M <- Pi_PSD( (1 - 2 eta lam) M - eta_t q A ),    Pi_PSD(W) = V max(Lambda, 0) V^T

Projecting onto the PSD cone after every active step is what the theory covers (a lazy
projection would be an approximation); it is non-expansive, so seed 000's Lemma 2 recursion is
unchanged. Step rules and ``kappa`` as in :mod:`service.core.sgd` (``descent``:
``eta_t q lambda_+ <= kappa / 2``; the decay uses the rule's step).

Cost: **O(d^3) per active step** (one ``L^T L`` product and one symmetric eigendecomposition,
~9 d^3 flops: d = 64 ~ 2 Mflop, d = 512 ~ 1.2 Gflop); passive steps cost O(d^2) (``z``) plus
O(d^2) for the decay when ``lam > 0``. Use it for small ``d`` or where the convex theory is the
point; ``sgd`` is the O(d^2) learner.

Serving needs a factor of ``M`` (1.4): the learner's state is ``L = Lambda_+^{1/2} V^T``, read off
the projection's eigendecomposition at no extra cost, and ``M = L^T L`` is rebuilt from it at the
next active step (the same O(d^3) as keeping ``M``, and one state for queries and checkpoints).
Guards as in :mod:`service.core.sgd`; besides, a step whose projected ``M`` would have an
eigenvalue above :data:`~service.core._validation.MAX_ABS_ENTRY` is ``skipped``, so every entry of
``M`` stays below it and every entry of ``L`` below its square root.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from service.core._validation import MAX_ABS_ENTRY, Array
from service.core.sgd import DESCENT, STEP_RULES, _single, rule_step, slope, spectrum
from service.core.update import _JIT, PASSIVE, SGD_UPDATE, SKIPPED, StepResult


@njit(**_JIT)  # type: ignore[untyped-decorator]
def psd_triplet(
    L: Array,
    ab: Array,
    bound: float,
    t: int,
    eta: float,
    mu: float,
    kappa: float,
    lam: float,
    rule: int,
    margin: float,
    out: Array,
) -> tuple[int, float, float]:
    """One M-SGD step with PSD projection, on the factor ``L`` (``M = L^T L``) in place.

    Writes ``z, d_pos, d_neg, eta_t`` to ``out`` (NaN where none); returns the outcome code,
    the new bound of ``max |L_ij|`` and ``||A||_F^2``.
    """
    out[:] = np.nan
    PT = np.dot(ab, L.T)  # rows L a, L b: a^T M a = ||L a||^2
    d_pos = np.dot(PT[0], PT[0])
    d_neg = np.dot(PT[1], PT[1])
    if not (math.isfinite(d_pos) and math.isfinite(d_neg)):
        return SKIPPED, bound, math.nan
    z = margin + d_pos - d_neg
    a, b = ab[0], ab[1]
    _, _, _, plus, minus = spectrum(a, b)
    fro2 = plus * plus + minus * minus
    out[0], out[1], out[2] = z, d_pos, d_neg
    if not (math.isfinite(z) and math.isfinite(fro2)):
        return SKIPPED, bound, fro2
    eta_r = rule_step(rule, eta, t)
    c = 1.0 - 2.0 * eta_r * lam
    q = slope(z, mu)
    if q == 0.0:  # no loss gradient: M <- c M, i.e. L <- sqrt(c) L (PSD is kept)
        if lam > 0.0:
            r = math.sqrt(c)
            for i in range(L.shape[0]):
                row = L[i]
                for j in range(L.shape[1]):
                    row[j] *= r
            bound *= r
            out[3] = eta_r
        return PASSIVE, bound, fro2
    eta_t = eta_r
    if rule == DESCENT and plus > 0.0:
        eta_t = min(eta_r, kappa / (2.0 * q * plus))
    h = eta_t * q
    W = np.dot(L.T, L)  # M
    n = W.shape[0]
    for i in range(n):
        ai, bi = h * a[i], h * b[i]
        row = W[i]
        for j in range(n):
            row[j] = c * row[j] - (ai * a[j] - bi * b[j])
    w, V = np.linalg.eigh(W)  # ascending eigenvalues, orthonormal eigenvectors in columns
    if not (np.isfinite(w).all() and np.isfinite(V).all()) or w[-1] > MAX_ABS_ENTRY:
        return SKIPPED, bound, fro2
    for i in range(n):  # L = max(Lambda, 0)^{1/2} V^T: the projection's factor
        r = math.sqrt(max(w[i], 0.0))
        row = L[i]
        for j in range(n):
            row[j] = r * V[j, i]
    out[3] = eta_t
    return SGD_UPDATE, math.sqrt(max(w[-1], 0.0)), fro2


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
    """One M-SGD step (1.5, no decay) on the C-contiguous factor ``L`` of ``M`` in place.

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
