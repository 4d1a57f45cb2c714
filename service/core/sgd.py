"""Online SGD on the triplet margin loss for the linear ``L``: OPML's explicit twin.

Equation numbers ``(1.x)`` are sections of ``seed-specs.md`` (seeds 000, Chen et al., AAAI 2023,
and 002, Jaffe 2020); ``Eq. n`` without a section are the OPML paper's.

The loss (1.3) of a triplet with ``z = ||L a||^2 - ||L b||^2 + margin`` (Eq. 4's hinge argument)::

    l_mu(z) = mu * softplus(z / mu)        mu > 0   (002's LogSumExp smoothing; 000's corrected
    l_0(z)  = max(0, z)                    mu = 0    logistic loss is mu = 1; OPML's hinge)

Seed 000's Eq. (6) has the sign flipped (``log(1 + exp(-z))`` rewards wrong orderings, 1.2.1);
this module implements ``softplus(+z)``. Its gradient is ``grad_L l = 2 q L A`` with
``A = a a^T - b b^T`` and ``q = sigma(z / mu)`` (``q = 1[z > 0]`` for the hinge), so one step
(1.5) with the decay ``lam`` of the regulariser ``lam ||L||_F^2`` is the rank-two update

    L <- (1 - 2 eta lam) L - s (L a) a^T + s (L b) b^T,      s = 2 eta_t q,

computed like OPML's (Eq. 16): one BLAS pass for ``[L a, L b]`` and one fused pass adding both
rank-one terms: O(d^2), no ``d x d`` temporary, the same memory traffic as the OPML step.
With ``mu = 0``, ``lam = 0`` and ``2 eta = gamma`` it equals OPML's ``L (I + gamma A)^{-1}`` to
first order in ``gamma`` (1.6): OPML is the implicit (backward-Euler) step, this the explicit one.

Step-size rules (1.6; ``t`` is the sample's 1-based position in the stream, so the rule does
not depend on how samples are batched):

* ``constant``: ``eta_t = eta``;
* ``invsqrt``: ``eta_t = eta / sqrt(t)`` (seed 000's Corollary 1 schedule);
* ``descent`` (default): ``eta_t = min(eta, kappa / (2 q lambda_+))`` with ``lambda_+`` the
  largest eigenvalue of ``A`` (O(1), Lemma 2's closed form). Then ``s lambda_+ <= kappa`` and
  the triplet's ``z`` does not increase (002's descent condition, derived for the ``d x d``
  case in 1.6). ``kappa = 1`` is 002's greedy step, which makes ``I - s A`` singular: one step
  deletes a direction of ``L`` (1.2.6); ``kappa`` is therefore limited to ``(0, 0.5]``, where
  ``I - s A`` keeps every eigenvalue on ``span{a, b}`` at or above 1/2.

The decay factor ``c = 1 - 2 eta lam`` uses the rule's step (before the descent cap), so it does
not depend on the data; it is applied lazily: ``L = scale * L~``, ``scale <- c scale`` costs
O(1), and the rank-two term is added to ``L~`` divided by ``c`` (1.5 step 5). When ``scale``
falls below :data:`MIN_SCALE`, ``L~`` is renormalised (O(d^2), once every
``ln(1/MIN_SCALE) / (2 eta lam)`` steps). The spec suggests 1e-100; 1e-16 keeps ``L~`` within
16 orders of magnitude of the served ``L``, so the overflow guard below, which bounds ``L~``,
never refuses a step that the served ``L`` could take.

Cold start (1.8): while one class has been seen, COPML's pair step (Eq. 20) has the explicit
twin ``L <- L - s (L delta) delta^T`` with ``s = gamma_pair`` (``2 eta = gamma_1``), under the
same rule (``descent``: ``s ||delta||^2 <= kappa``) and decay.

Guards (the same policy as :mod:`service.core.update`): a step whose squared distances, or
whose ``||A||_F^2 = lambda_+^2 + lambda_-^2``, overflow float64 is ``skipped`` (differences of
norm beyond ~1e77, e.g. samples of magnitude 1e100), as is a step that could push an entry of
``L~`` past :data:`~service.core._validation.MAX_ABS_ENTRY`; ``L`` is untouched then. ``q`` is
``expit(z / mu)``, which never overflows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from service.core._validation import Array
from service.core.update import (
    _JIT,
    PAIR_UPDATE,
    PASSIVE,
    SGD_UPDATE,
    SKIPPED,
    StepResult,
    StepResults,
    _admit,
    eigenvalues,
)

#: The step-size rules, in the order of their integer codes.
STEP_RULES = ("constant", "descent", "invsqrt")
CONSTANT, DESCENT, INVSQRT = range(3)

#: The lazy decay scale is folded into ``L~`` when it falls below this (see the docstring).
MIN_SCALE = 1e-16


def triplet_loss(z: Any, mu: float) -> Array:
    """``l_mu(z) = mu * softplus(z / mu)`` (``mu > 0``), ``max(0, z)`` (``mu = 0``) (1.3).

    Evaluated as ``max(z, 0) + mu * log1p(exp(-|z| / mu))``: no overflow for any ``z``.

    >>> triplet_loss([-1.0, 0.0, 2.0], 0.0).tolist()
    [0.0, 0.0, 2.0]
    >>> bool(triplet_loss(0.0, 0.1) == 0.1 * np.log(2))
    True
    """
    zs = np.asarray(z, dtype=np.float64)
    if mu == 0.0:
        out: Array = np.maximum(zs, 0.0)
        return out
    with np.errstate(over="ignore"):  # |z| / mu = inf: exp(-inf) = 0, the hinge
        out = np.maximum(zs, 0.0) + mu * np.log1p(np.exp(-np.abs(zs) / mu))
    return out


@njit(**_JIT)  # type: ignore[untyped-decorator]
def expit(u: float) -> float:
    """``1 / (1 + e^{-u})`` without overflow (``q`` of 1.5 with ``u = z / mu``)."""
    if u >= 0.0:
        return 1.0 / (1.0 + math.exp(-u))
    e = math.exp(u)
    return e / (1.0 + e)


@njit(**_JIT)  # type: ignore[untyped-decorator]
def slope(z: float, mu: float) -> float:
    """``q = l_mu'(z)``: ``sigma(z / mu)``, or ``1[z > 0]`` for the hinge (1.3, 1.5)."""
    if mu == 0.0:
        return 1.0 if z > 0.0 else 0.0
    q: float = expit(z / mu)
    return q


@njit(**_JIT)  # type: ignore[untyped-decorator]
def rule_step(rule: int, eta: float, t: int) -> float:
    """The rule's step before any cap: ``eta``, or ``eta / sqrt(t)`` for ``invsqrt`` (1.6)."""
    if rule == INVSQRT:
        return eta / math.sqrt(t)
    return eta


@njit(**_JIT)  # type: ignore[untyped-decorator]
def spectrum(a: Array, b: Array) -> tuple[float, float, float, float, float]:
    """``s_a = a.a``, ``k = a.b``, ``s_b = b.b`` and the eigenvalues ``lambda_+ >= 0 >=
    lambda_-`` of ``A = a a^T - b b^T`` (Lemma 2), cancellation-free as in the OPML step."""
    s_a = np.dot(a, a)
    k = np.dot(a, b)
    s_b = np.dot(b, b)
    if not (math.isfinite(s_a) and math.isfinite(s_b)):
        return s_a, k, s_b, math.inf, -math.inf
    gram = s_a * s_b - k * k
    if gram < 0.25 * s_a * s_b and s_a > 0.0:  # nearly colinear: it cancels; project
        r = b - (k / s_a) * a
        gram = s_a * np.dot(r, r)
    plus, minus = eigenvalues(s_a, s_b, gram)
    return s_a, k, s_b, plus, minus


@njit(**_JIT)  # type: ignore[untyped-decorator]
def rank_two(L: Array, p: Array, u: Array, q: Array, v: Array) -> None:
    """``L += p u^T + q v^T`` in one pass over ``L`` (read once, written once)."""
    for i in range(L.shape[0]):
        pi, qi = p[i], q[i]
        row = L[i]
        for j in range(L.shape[1]):
            row[j] += pi * u[j] + qi * v[j]


@njit(**_JIT)  # type: ignore[untyped-decorator]
def decayed(L: Array, scale: float, bound: float, c: float) -> tuple[float, float]:
    """``scale * c`` (the lazy decay), folded into ``L~`` when below :data:`MIN_SCALE`."""
    scale *= c
    if scale < MIN_SCALE:
        for i in range(L.shape[0]):
            row = L[i]
            for j in range(L.shape[1]):
                row[j] *= scale
        bound *= scale
        scale = 1.0
    return scale, bound


@njit(**_JIT)  # type: ignore[untyped-decorator]
def sgd_triplet(
    L: Array,
    ab: Array,
    scale: float,
    bound: float,
    t: int,
    eta: float,
    mu: float,
    kappa: float,
    lam: float,
    rule: int,
    margin: float,
    out: Array,
) -> tuple[int, float, float, float]:
    """One L-SGD step (1.5) on ``L~`` in place (served ``L = scale * L~``); ``ab = [a; b]``.

    Writes ``z, d_pos, d_neg, eta_t`` to ``out`` (NaN where none); returns the outcome code,
    the new ``scale`` and bound of ``max |L~_ij|``, and ``||A||_F^2``.
    """
    out[:] = np.nan
    PT = np.dot(ab, L.T)  # rows: L~ a, L~ b -- one BLAS pass over L~
    n_a = np.dot(PT[0], PT[0])
    n_b = np.dot(PT[1], PT[1])
    d_pos = scale * scale * n_a
    d_neg = scale * scale * n_b
    if not (math.isfinite(d_pos) and math.isfinite(d_neg)):
        return SKIPPED, scale, bound, math.nan
    z = margin + d_pos - d_neg  # Eq. 4's hinge argument
    a, b = ab[0], ab[1]
    s_a, _, s_b, plus, minus = spectrum(a, b)
    fro2 = plus * plus + minus * minus  # ||A||_F^2
    out[0], out[1], out[2] = z, d_pos, d_neg
    if not (math.isfinite(z) and math.isfinite(fro2)):
        return SKIPPED, scale, bound, fro2
    eta_r = rule_step(rule, eta, t)
    c = 1.0 - 2.0 * eta_r * lam
    q = slope(z, mu)
    if q == 0.0:  # no loss gradient: only the decay
        if lam > 0.0:
            scale, bound = decayed(L, scale, bound, c)
            out[3] = eta_r
        return PASSIVE, scale, bound, fro2
    eta_t = eta_r
    if rule == DESCENT and plus > 0.0:
        eta_t = min(eta_r, kappa / (2.0 * q * plus))  # s lambda_+ <= kappa (1.6)
    g = 2.0 * eta_t * q / c  # s / c: the rank-two term in units of L~ after the decay
    increment = g * (math.sqrt(n_a) * math.sqrt(s_a) + math.sqrt(n_b) * math.sqrt(s_b))
    new_bound = _admit(L, bound, increment)
    if new_bound < 0.0:
        return SKIPPED, scale, bound, fro2
    rank_two(L, PT[0], -g * a, PT[1], g * b)
    scale, new_bound = decayed(L, scale, new_bound, c)
    out[3] = eta_t
    return SGD_UPDATE, scale, new_bound, fro2


@njit(**_JIT)  # type: ignore[untyped-decorator]
def sgd_pair(
    L: Array,
    delta: Array,
    scale: float,
    bound: float,
    t: int,
    gamma_pair: float,
    kappa: float,
    lam: float,
    rule: int,
    out: Array,
) -> tuple[int, float, float, float]:
    """The explicit twin of COPML's pair step (1.8): ``L <- c L - s (L delta) delta^T``.

    ``s = gamma_pair`` under the step rule (``descent``: ``s ||delta||^2 <= kappa``); ``out[1]``
    is ``||L delta||^2`` before the step and ``out[3]`` the equivalent ``eta = s / 2``.
    """
    out[:] = np.nan
    P = np.dot(L, delta)
    n = np.dot(P, P)
    d_pos = scale * scale * n
    dd = np.dot(delta, delta)
    fro2 = dd * dd  # ||delta delta^T||_F^2
    if not (math.isfinite(d_pos) and math.isfinite(fro2)):
        return SKIPPED, scale, bound, fro2
    out[1] = d_pos
    s_r = rule_step(rule, gamma_pair, t)
    c = 1.0 - s_r * lam  # 1 - 2 eta lam with eta = s / 2
    s = s_r
    if rule == DESCENT and dd > 0.0:
        s = min(s_r, kappa / dd)
    g = s / c
    new_bound = _admit(L, bound, g * math.sqrt(n) * math.sqrt(dd))
    if new_bound < 0.0:
        return SKIPPED, scale, bound, fro2
    for i in range(L.shape[0]):
        p = g * P[i]
        row = L[i]
        for j in range(L.shape[1]):
            row[j] -= p * delta[j]
    scale, new_bound = decayed(L, scale, new_bound, c)
    out[3] = 0.5 * s
    return PAIR_UPDATE, scale, new_bound, fro2


def _single(code: int, out: Array) -> StepResult:
    return StepResults(np.array([code]), out[None, :])[0]


def sgd_step(
    L: Array,
    ab: Array,
    eta: float,
    margin: float = 1.0,
    mu: float = 0.0,
    step: str = "constant",
    kappa: float = 0.5,
    t: int = 1,
) -> StepResult:
    """One L-SGD step (1.5, no decay) on a C-contiguous ``L`` in place; ``ab = [a; b]``.

    >>> L = np.eye(2)
    >>> r = sgd_step(L, np.array([[0.0, 0.1], [1.0, 0.0]]), eta=0.25)   # s = 2 eta = 0.5
    >>> r.outcome, r.gamma, L.round(3).tolist()
    ('sgd_update', 0.25, [[1.5, 0.0], [0.0, 0.995]])
    """
    out = np.empty(4)
    code, _, _, _ = sgd_triplet(
        L,
        np.ascontiguousarray(ab, dtype=np.float64),
        1.0,
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
