"""The compiled kernels of the gradient learners ``sgd``, ``sgd_psd`` and ``brm``, and their loop.

What each step computes and why is documented with its learner: :mod:`service.core.sgd`
(L-SGD, the step rules, the lazy decay, the guards), :mod:`service.core.psd` (M-SGD with PSD
projection) and :mod:`service.core.brm` (online BRM-R). The numba code lives here, in one
file, on purpose: numba's on-disk cache of a function is invalidated only when *its own* file
changes, so a loop compiled together with step kernels from other files would keep running
their old machine code after an edit of those files (checked: a cached caller kept a callee's
old constant). The helpers imported from :mod:`service.core.update` (``_admit``,
``eigenvalues``, the outcome codes) are compiled in the same way: a change there needs this
file's cache cleared (any edit of this file does it).

The loop makes OPML's one-pass triplets (Sec. III-A): the positive is the class's latest
sample, the negative the latest sample of the class ``negatives[t]`` that the learner drew
for the sample (the same draw as OPML's loop), so the three learners see OPML's triplets for
the same stream and seed. While one class has been seen, ``sgd`` takes the explicit twin of
COPML's pair step; ``sgd_psd`` and ``brm`` buffer the sample (``single_class``). Each triplet
step is dispatched on ``kind``. Like OPML's loop it is compiled with numba (cached on disk)
and releases the GIL.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from service.core._validation import MAX_ABS_ENTRY, Array
from service.core.update import (
    _JIT,
    NEW_CLASS,
    PAIR_UPDATE,
    PASSIVE,
    SGD_UPDATE,
    SINGLE_CLASS,
    SKIPPED,
    _admit,
    eigenvalues,
)

# The kernels below compile these codes in: SGD_UPDATE became 8 when ``held_out`` took 7 (this
# comment also changed this file, so numba's cache of the old code is dropped).

#: The step-size rules, in the order of their integer codes.
STEP_RULES = ("constant", "descent", "invsqrt")
CONSTANT, DESCENT, INVSQRT = range(3)

#: The lazy decay scale is folded into ``L~`` when it falls below this (see ``sgd``).
MIN_SCALE = 1e-16

#: ``kind`` codes of :func:`learn_batch_gradient`, by algorithm name.
KINDS = {"sgd": 0, "sgd_psd": 1, "brm": 2}
SGD, SGD_PSD, BRM = range(3)


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
    """The rule's step before any cap: ``eta``, or ``eta / sqrt(t)`` for ``invsqrt``."""
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
    """One L-SGD step on ``L~`` in place (served ``L = scale * L~``); ``ab = [a; b]``.

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
        eta_t = min(eta_r, kappa / (2.0 * q * plus))  # s lambda_+ <= kappa
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
    """The explicit twin of COPML's pair step: ``L <- c L - s (L delta) delta^T``.

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


@njit(**_JIT)  # type: ignore[untyped-decorator]
def restrict(p: Array, scale: float, g: Array) -> float:
    """``D_R^2`` of the projected difference ``z = scale * p`` (Sigmoid, ``p = 2``); writes
    ``g(z)`` (Eq. 11's ``R R' sign``) into ``g``."""
    total = 0.0
    for i in range(p.shape[0]):
        r = math.tanh(0.5 * scale * p[i])  # R(|z|) sign(z): tanh is odd
        total += r * r
        g[i] = 0.5 * r * (1.0 - r * r)
    return float(total / p.shape[0])


@njit(**_JIT)  # type: ignore[untyped-decorator]
def brm_triplet(
    L: Array,
    ab: Array,
    scale: float,
    bound: float,
    t: int,
    eta: float,
    kappa: float,
    lam: float,
    rule: int,
    margin: float,
    out: Array,
) -> tuple[int, float, float, float]:
    """One online BRM-R step on ``L~`` in place (served ``L = scale * L~``).

    Writes ``ell``'s argument ``D_R^2(a) - D_R^2(b) + tau``, ``D_R^2(a)``, ``D_R^2(b)`` and
    ``eta_t`` to ``out`` (NaN where none); returns the outcome code, the new ``scale`` and bound
    of ``max |L~_ij|``, and ``||A||_F^2`` (for the stability diagnostics).
    """
    out[:] = np.nan
    d = L.shape[0]
    PT = np.dot(ab, L.T)  # rows: L~ a, L~ b -- one BLAS pass over L~
    if not np.isfinite(PT).all():
        return SKIPPED, scale, bound, math.nan
    ga = np.empty(d)
    gb = np.empty(d)
    d_pos = restrict(PT[0], scale, ga)
    d_neg = restrict(PT[1], scale, gb)
    a, b = ab[0], ab[1]
    s_a, _, s_b, plus, minus = spectrum(a, b)
    fro2 = plus * plus + minus * minus
    z = d_pos - d_neg + margin
    out[0], out[1], out[2] = z, d_pos, d_neg
    if not math.isfinite(fro2):
        return SKIPPED, scale, bound, fro2
    eta_r = rule_step(rule, eta, t)
    c = 1.0 - 2.0 * eta_r * lam
    if z <= 0.0:
        if lam > 0.0:
            scale, bound = decayed(L, scale, bound, c)
            out[3] = eta_r
        return PASSIVE, scale, bound, fro2
    eta_t = eta_r
    beta = (s_a + s_b) / (2.0 * d)  # smoothness of the restricted loss in L
    if rule == DESCENT and beta > 0.0:
        eta_t = min(eta_r, kappa / beta)
    coef = 2.0 * eta_t / (d * c * scale)  # in units of L~ after the decay
    norm_ga = math.sqrt(np.dot(ga, ga))
    norm_gb = math.sqrt(np.dot(gb, gb))
    new_bound = _admit(L, bound, coef * (norm_ga * math.sqrt(s_a) + norm_gb * math.sqrt(s_b)))
    if new_bound < 0.0:
        return SKIPPED, scale, bound, fro2
    rank_two(L, ga, -coef * a, gb, coef * b)
    scale, new_bound = decayed(L, scale, new_bound, c)
    out[3] = eta_t
    return SGD_UPDATE, scale, new_bound, fro2


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


@njit(**_JIT)  # type: ignore[untyped-decorator]
def learn_batch_gradient(
    kind: int,
    L: Array,
    H: Array,
    X: Array,
    slots: Any,
    known: Any,
    negatives: Any,
    t0: int,
    eta: float,
    gamma_pair: float,
    mu: float,
    kappa: float,
    lam: float,
    rule: int,
    margin: float,
    state: Array,
    codes: Any,
    values: Array,
    fro2: Array,
) -> None:
    """Learn the rows of ``X`` in order, in place on ``L~``, the buffer ``H`` and ``state``.

    ``slots``, ``known``, ``codes`` and ``values`` as in OPML's ``learn_batch``;
    ``negatives[t]`` is the buffer row of sample ``t``'s negative (used when it forms a
    triplet).
    ``t0`` is the number of samples learned before this batch (sample ``t`` of the batch is
    number ``t0 + t + 1`` of the stream, for ``invsqrt``). ``state = [scale, bound]``: the lazy
    decay scale (served ``L = scale * L~``) and the bound of ``max |L~_ij|``. ``fro2[t]``
    receives ``||A_t||_F^2`` of every step that formed a triplet or pair (NaN otherwise).
    """
    d = X.shape[1]
    ab = np.empty((2, d))
    scale, bound = state[0], state[1]
    for t in range(X.shape[0]):
        slot, c = slots[t], known[t]
        x, out = X[t], values[t]
        out[:] = np.nan
        fro2[t] = np.nan
        step = t0 + t + 1
        if slot == c:
            codes[t] = NEW_CLASS
        elif c == 1:
            if kind == SGD:
                codes[t], scale, bound, fro2[t] = sgd_pair(
                    L, x - H[slot], scale, bound, step, gamma_pair, kappa, lam, rule, out
                )
            else:
                codes[t] = SINGLE_CLASS
        else:
            j = negatives[t]
            for k in range(d):
                ab[0, k] = x[k] - H[slot, k]
                ab[1, k] = x[k] - H[j, k]
            if kind == SGD:
                codes[t], scale, bound, fro2[t] = sgd_triplet(
                    L, ab, scale, bound, step, eta, mu, kappa, lam, rule, margin, out
                )
            elif kind == SGD_PSD:
                codes[t], bound, fro2[t] = psd_triplet(
                    L, ab, bound, step, eta, mu, kappa, lam, rule, margin, out
                )
            else:
                codes[t], scale, bound, fro2[t] = brm_triplet(
                    L, ab, scale, bound, step, eta, kappa, lam, rule, margin, out
                )
        H[slot] = x
    state[0], state[1] = scale, bound
