"""The closed-form updates of OPML and COPML, in place, in O(d^2), with no inverse.

Two steps, both acting on a C-contiguous float64 ``L`` in place:

* the OPML triplet step (Eqs. 4, 12, 16). The hinge (Eq. 4) is tested with the current ``L``;
  when active, ``L <- L (I + gamma A)^{-1}`` with ``A = a a^T - b b^T`` is applied as the
  rank-two correction ``L <- L + (L a) u^T + (L b) v^T`` of Theorem 1 (Eq. 16): one BLAS call
  computes both matrix-vector products ``[L a, L b]``, and one fused loop adds both rank-one
  corrections, so ``L`` is read twice and written once, and no ``d x d`` temporary exists;
* the COPML cold-start pair step (Eq. 20, Sherman-Morrison): one matrix-vector product and one
  rank-one correction.

:func:`learn_batch` runs a whole stream of steps, including the one-pass triplet construction
(Sec. III-A), in one compiled loop, on one or several copies of ``L`` ("tracks": the candidates
of a ``gamma="auto"`` race, :mod:`service.core.race`). It is compiled with numba: the step is
O(d^2) arithmetic, but for the d of face or re-identification embeddings (64-512) a numpy
transcription spends most of its time in per-sample Python overhead (about ten numpy calls a
step); the compiled loop is 3-10x faster there and as fast as the memory bandwidth allows at
large d (``benchmarks/core_timing.py``). The matrix-vector products still go to BLAS (numba's
``np.dot``). The kernels release the GIL, so a service thread running them does not block the
event loop.

Step size: ``step="scaled"`` (default) and ``step="paper"``
---------------------------------------------------------------
The paper's rule takes ``gamma`` and ``margin`` in the units of the input: under ``x -> c x``
every difference vector scales by ``c``, ``A_t`` by ``c^2``, so the same ``gamma`` is a step
``c^2`` times longer (Eq. 12) and the same ``margin`` is ``c^2`` times weaker next to the
squared distances of Eq. 4. Lemma 2's guarantee (``gamma < 1/4``) assumes ``||x|| <= 1``; on
z-scored 512-d inputs ``||b||^2 ~ 1000`` and ``gamma = 1e-3`` already leaves it.

``step="scaled"`` runs the paper's algorithm in normalised units. ``S_t`` is a running mean of
the squared norms of the difference vectors the stream has formed (``a`` and ``b`` of each
triplet, ``delta`` of each COPML pair; the current ones included, weights ``1/n`` up to
:data:`SCALE_HORIZON` observations, then exponential), i.e. the squared length of a typical
difference. With ``x~ = x / sqrt(S_t)``, the paper's step on ``x~`` with step size ``gamma``
and margin ``margin`` is, in input units,

    hinge (Eq. 4):    z~ = margin + ||L a~||^2 - ||L b~||^2
                         = (margin S_t + ||L a||^2 - ||L b||^2) / S_t
    update (Eq. 12):  L (I + gamma A~)^{-1} = L (I + (gamma / S_t) A)^{-1}
    pair (Eq. 20):    L (I + gamma d~ d~^T)^{-1} = L (I + (gamma / S_t) d d^T)^{-1}   (d = delta)

so it is the paper's step with ``gamma_t = gamma / S_t`` and ``margin_t = margin S_t``. Under
``x -> c x``, ``S_t -> c^2 S_t`` exactly (it is a mean of squared norms), hence ``gamma_t A_t``
and ``z~`` are unchanged: every hinge decision and every ``L_t`` is the same (bit for bit when
``c`` is a power of two, to rounding otherwise), and ``d_pos``, ``d_neg``, ``hinge`` and the
calibrated threshold scale by ``c^2``. The margin must be read in the same units for this: a
fixed margin next to ``c^2``-scaled distances would decide differently at every scale.
Lemma 2 in these units: ``lambda_-(A~) >= -||b~||^2``, so no step is shrunk while
``gamma ||b||^2 / S_t < 1 - MIN_EIGENVALUE``, i.e. for every triplet whose negative difference
is below ``0.9 / gamma`` times the typical squared difference (9x at ``gamma = 0.1``). The
paper's own condition (``||x|| <= 1``, ``gamma < 1/4``) is the special case ``S_t ~ 1``. The
kernel works on ``a~, b~`` directly (``a / sqrt(S_t)``), which keeps the scalars of the step near
1 whatever the input scale; with ``step="paper"`` the unit is 1 and the arithmetic is exactly the
paper's. ``StepResult.gamma`` is the ``gamma_t`` of Eq. 12 in input units either way.

Numerical policy (documented choice, paper Lemma 2)
---------------------------------------------------
``I + gamma A`` is symmetric with eigenvalue 1 off the span of ``a, b`` and
``1 + gamma lambda_{+/-}`` on it, where ``lambda_{+/-}`` (Lemma 2) are computed in O(1) from
``alpha = a.a``, ``kappa = a.b``, ``beta_b = b.b`` and the Gram determinant
``g = alpha beta_b - kappa^2`` (for nearly colinear ``a, b``, where that difference cancels,
taken as ``alpha ||b - (kappa/alpha) a||^2`` instead). ``lambda_+ >= 0 >= lambda_-``.

* **Shrink.** If ``1 + gamma lambda_- < MIN_EIGENVALUE`` (the step would break positive
  definiteness, or make ``eta + beta = det(I + gamma A)`` near zero), the step is taken with
  ``gamma' = (1 - MIN_EIGENVALUE) / (-lambda_-)``, the largest step size that keeps every
  eigenvalue of ``I + gamma' A`` at or above ``MIN_EIGENVALUE``; the outcome is
  ``shrunk_update``. One step therefore stretches ``L`` by at most ``1 / MIN_EIGENVALUE`` in
  any direction, and the divisor ``det = (1 + gamma lambda_+)(1 + gamma lambda_-)`` is never
  below ``MIN_EIGENVALUE``. Under the paper's assumptions (``||x|| <= 1``, ``gamma < 1/4``,
  i.e. ``normalize="l2"``) ``lambda_- >= -4`` and no step with ``gamma <= 0.225`` is shrunk.
  Shrunk steps are what lets ``L`` compound out of range, so the divergence monitor
  (:mod:`service.core.health`, :func:`record_update` below) watches their rate and the growth
  of ``||L||_F``, and cuts the step when either runs away.
* **Skip.** If the step's arithmetic would overflow float64 (enormous inputs: a squared norm of
  a difference, a distance or the hinge is not finite), or would push an entry of ``L`` past
  :data:`MAX_ABS_ENTRY`, ``L`` is left untouched and the outcome is ``skipped`` (the scale
  estimate does not see such a step either). A running upper bound of ``max |L_ij|`` decides
  this: a correction ``p q^T`` changes no entry by more than ``||p|| ||q||``, known in O(d) from
  the step's vectors, and the bound is re-measured exactly, in O(d^2), only when it nears the
  limit. So ``L`` never holds NaN or Inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from numba import njit

from service.core._validation import MAX_ABS_ENTRY, Array

#: Smallest eigenvalue allowed for ``I + gamma A_t`` (see the module docstring).
MIN_EIGENVALUE = 0.1

#: Difference vectors the scale estimate of ``step="scaled"`` averages over (module docstring).
SCALE_HORIZON = 1000

#: Every outcome a step can have, in the order of their integer codes. ``new_class``: first
#: sample of its class, buffered only. ``pair_update``: COPML cold-start pair step (Eq. 20).
#: ``triplet_update``: OPML step (Eq. 16). ``shrunk_update``: OPML step with gamma reduced to
#: keep ``I + gamma A`` positive definite. ``passive``: hinge <= 0, ``L`` untouched.
#: ``single_class``: OPML (no pre-stage) while one class has been seen, buffered only.
#: ``skipped``: the step would overflow float64; ``L`` untouched. ``held_out``: routed to the
#: certification reservoir, not learned (:mod:`service.core.holdout`; never produced here).
#: ``sgd_update``: a gradient step of the ``sgd``, ``sgd_psd`` or ``brm`` learners
#: (:mod:`service.core.gradient`); their passive, pair, new-class, single-class and skipped
#: steps share the codes above.
OUTCOMES = (
    "new_class",
    "pair_update",
    "triplet_update",
    "shrunk_update",
    "passive",
    "single_class",
    "skipped",
    "held_out",
    "sgd_update",
)
NEW_CLASS, PAIR_UPDATE, TRIPLET_UPDATE, SHRUNK_UPDATE, PASSIVE, SINGLE_CLASS, SKIPPED = range(7)
SGD_UPDATE = 8  # after ``held_out`` (7), which is the holdout module's
#: Outcomes of steps that formed a triplet and measured both of its distances (consecutive).
TRIPLET_CODES = (TRIPLET_UPDATE, SHRUNK_UPDATE, PASSIVE)

_JIT: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}


# -- divergence monitor (documented in service.core.health) -------------------------------

# Layout of one track's state vector (float64, updated in place by the compiled loop).
BOUND = 0  # an upper bound of max |L_ij| (see _admit)
STEP_SCALE = 1  # multiplier of the configured step sizes: 1, cut by every trip
FRO2 = 2  # ||L||_F^2, exact up to rounding
FRO2_START = 3  # ||L||_F^2 of the metric the track started from
FRO2_REF = 4  # ||L||_F^2 at the start of the current growth window
WINDOW_START = 5  # UPDATES at the start of the current growth window
UPDATES = 6  # steps that changed L (triplet, shrunk, pair)
ARMED = 7  # triplet updates since the monitor was (re-)armed
SHRUNK_RATE = 8  # running share of shrunk triplet updates since armed
TRIPS = 9  # times tripped
LAST_TRIP = 10  # STEPS at the last trip (-1: never)
GROWTH_RATE = 11  # log10 growth of ||L||_F over the last complete window
SYNCED = 12  # ||L||_F^2 when it was last measured in full
SHRUNK_N = 13  # shrunk triplet updates since armed ...
SHRUNK_LOG = 14  # ... and the sum of log(step used / step asked) over them
STEPS = 15  # triplet and pair steps that measured their distances (updates and passive ones)
STATE_SIZE = 16

#: Triplet updates the shrunk rate averages over.
SHRUNK_HORIZON = 100
#: Triplet updates needed after (re-)arming before the shrunk rate can trip.
MIN_TRIPLETS = 20
#: Largest tolerated share of shrunk triplet updates.
MAX_SHRUNK_RATE = 0.1
#: Updates per growth window.
GROWTH_WINDOW = 100
#: Largest tolerated growth of ||L||_F within one window.
MAX_GROWTH = 10.0
#: Factor applied to the step at each trip (or the shrunk steps' typical ratio, if smaller).
STEP_CUT = 0.5
#: ||L||_F^2 is re-measured in full every this many updates ...
RESYNC = 128
#: ... and whenever it fell below this fraction of its last full measurement, or of the
#: absolute size of the terms one step summed to get it (see record_update).
CANCELLATION = 1e-3

_MAX_GROWTH2 = MAX_GROWTH * MAX_GROWTH


def fresh(L: Array, step_scale: float = 1.0, trips: float = 0.0) -> Array:
    """The state vector of a track starting from ``L`` (a new model, or ``set_metric``)."""
    st = np.zeros(STATE_SIZE)
    fro2 = float(np.dot(L.ravel(), L.ravel()))
    st[BOUND] = float(np.abs(L).max()) if L.size else 0.0
    st[STEP_SCALE] = step_scale
    st[FRO2] = st[FRO2_START] = st[FRO2_REF] = st[SYNCED] = fro2
    st[TRIPS] = trips
    st[LAST_TRIP] = -1.0
    return st


@njit(**_JIT)  # type: ignore[untyped-decorator]
def record_update(
    st: Array, L: Array, fro2: float, terms: float, triplet: bool, ratio: float
) -> None:
    """Book one step that changed ``L`` (new ``||L||_F^2 = fro2``, the O(d) sum of terms whose
    absolute values add up to ``terms``; ``ratio`` = step used / step asked, below 1 for a
    shrunk step), and apply the policy."""
    updates = st[UPDATES] + 1.0
    st[UPDATES] = updates
    st[STEPS] += 1.0
    # The O(d) update carries its rounding error in absolute terms, relative to the size of
    # what it summed: once ||L||_F^2 has shrunk a lot since it was last measured, or this one
    # step's terms cancelled down to far less than their size (a step much larger than L, as
    # with a huge gamma), the error is large relative to the result: measure then.
    if updates % RESYNC == 0.0 or fro2 < CANCELLATION * max(st[SYNCED], terms):
        flat = L.ravel()
        fro2 = np.dot(flat, flat)
        st[SYNCED] = fro2
    st[FRO2] = max(fro2, 0.0)
    if triplet:
        armed = st[ARMED] + 1.0
        st[ARMED] = armed
        shrunk = ratio < 1.0
        st[SHRUNK_RATE] += ((1.0 if shrunk else 0.0) - st[SHRUNK_RATE]) / min(armed, SHRUNK_HORIZON)
        if shrunk:
            st[SHRUNK_N] += 1.0
            st[SHRUNK_LOG] += math.log(ratio)
    ref = st[FRO2_REF]
    grown = ref > 0.0 and st[FRO2] > _MAX_GROWTH2 * ref
    rate_high = st[ARMED] >= MIN_TRIPLETS and st[SHRUNK_RATE] > MAX_SHRUNK_RATE
    if grown or rate_high:
        cut = STEP_CUT
        if st[SHRUNK_N] > 0.0:  # the steps asked for were this much past Lemma 2's limit
            cut = min(cut, math.exp(st[SHRUNK_LOG] / st[SHRUNK_N]))
        st[STEP_SCALE] *= cut
        st[TRIPS] += 1.0
        st[LAST_TRIP] = st[STEPS]
        st[ARMED] = st[SHRUNK_RATE] = st[SHRUNK_N] = st[SHRUNK_LOG] = 0.0
        st[FRO2_REF] = st[FRO2]
        st[WINDOW_START] = updates
    elif updates - st[WINDOW_START] >= GROWTH_WINDOW:
        if ref > 0.0 and st[FRO2] > 0.0:
            st[GROWTH_RATE] = 0.5 * math.log10(st[FRO2] / ref)
        st[FRO2_REF] = st[FRO2]
        st[WINDOW_START] = updates


@njit(**_JIT)  # type: ignore[untyped-decorator]
def eigenvalues(alpha: float, beta_b: float, gram: float) -> tuple[float, float]:
    """``(lambda_+, lambda_-)`` of ``a a^T - b b^T`` in closed form (Lemma 2), cancellation-free.

    ``lambda_{+/-} = [(alpha - beta_b) +/- sqrt((alpha - beta_b)^2 + 4 g)] / 2`` with
    ``g = alpha beta_b - kappa^2 >= 0`` (equal to the paper's form since
    ``(alpha + beta_b)^2 - 4 kappa^2 = (alpha - beta_b)^2 + 4 g``). The root of larger magnitude
    is computed directly and the other from ``lambda_+ lambda_- = -g``.

    >>> eigenvalues(4.0, 1.0, 0.0)   # b parallel to a, |a| = 2 |b|: A = 3/4 a a^T
    (3.0, -0.0)
    """
    gram = max(gram, 0.0)  # >= 0 by Cauchy-Schwarz; rounding may say a hair less
    t = alpha - beta_b
    disc = math.hypot(t, 2.0 * math.sqrt(gram))
    if t >= 0.0:
        plus = 0.5 * (t + disc)
        minus = -gram / plus if plus > 0.0 else 0.0
    else:
        minus = 0.5 * (t - disc)
        plus = -gram / minus
    return plus, minus


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _admit(L: Array, bound: float, increment: float) -> float:
    """The new bound of ``max |L_ij|`` after a correction bounded by ``increment``, or -1.0
    when that could pass :data:`MAX_ABS_ENTRY` (then ``L`` must not be touched)."""
    if not math.isfinite(increment):
        return -1.0
    if bound + increment <= MAX_ABS_ENTRY:
        return bound + increment
    bound = np.abs(L).max()  # the bound drifted: measure exactly (rare)
    if bound + increment <= MAX_ABS_ENTRY:
        return bound + increment
    return -1.0


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _spectrum(ab: Array, alpha: float, kappa: float, beta_b: float) -> tuple[float, float]:
    """:func:`eigenvalues` of ``a a^T - b b^T`` for ``ab = [a; b]`` with the given dot products;
    for nearly colinear ``a, b``, where ``alpha beta_b - kappa^2`` cancels, the Gram
    determinant is taken as ``alpha ||b - (kappa/alpha) a||^2`` instead."""
    gram = alpha * beta_b - kappa * kappa
    if gram < 0.25 * alpha * beta_b and alpha > 0.0:
        r = ab[1] - (kappa / alpha) * ab[0]
        gram = alpha * np.dot(r, r)
    return eigenvalues(alpha, beta_b, gram)  # type: ignore[no-any-return]


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _observe_scale(stream: Array, squared_norm: float) -> None:
    """Add one difference vector's squared norm to the running mean ``stream[0]``
    (``stream[1]`` observations so far; weights ``1/n``, then ``1/SCALE_HORIZON``)."""
    n = stream[1] + 1.0
    stream[1] = n
    stream[0] += (squared_norm - stream[0]) / min(n, SCALE_HORIZON)


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _triplet(
    L: Array,
    ab: Array,
    alpha: float,
    kappa: float,
    beta_b: float,
    plus: float,
    minus: float,
    gamma: float,
    margin: float,
    unit: float,
    st: Array,
    out: Array,
) -> int:
    """One OPML step on ``L`` in place, in units where squared lengths are divided by ``unit``.

    ``ab = [a; b] / sqrt(unit)`` (``a = x_t - x_p``, ``b = x_t - x_q``); ``alpha, kappa,
    beta_b`` their dot products and ``plus, minus`` the eigenvalues of ``a a^T - b b^T``
    (Lemma 2), all in those units; ``gamma`` and ``margin`` likewise. ``unit`` is 1 for
    ``step="paper"``. Writes ``hinge, d_pos, d_neg, gamma`` in input units to ``out`` (NaN
    where none), updates the track state ``st`` (bound, monitor) and returns the outcome code.
    """
    PT = np.dot(ab, L.T)  # rows: L a, L b -- one BLAS pass over L
    d_pos = np.dot(PT[0], PT[0])
    d_neg = np.dot(PT[1], PT[1])
    hinge = margin + d_pos - d_neg  # Eq. 4
    out[0], out[1], out[2] = hinge * unit, d_pos * unit, d_neg * unit
    if not (math.isfinite(out[0]) and math.isfinite(out[1]) and math.isfinite(out[2])):
        out[:] = np.nan  # overflow (or inf - inf)
        return SKIPPED
    if hinge <= 0.0:
        st[STEPS] += 1.0
        return PASSIVE
    code = TRIPLET_UPDATE
    ratio = 1.0
    if 1.0 + gamma * minus < MIN_EIGENVALUE:  # Lemma 2: I + gamma A near singular
        shrunk = (1.0 - MIN_EIGENVALUE) / -minus
        ratio = shrunk / gamma
        gamma = shrunk
        code = SHRUNK_UPDATE
    det = (1.0 + gamma * plus) * (1.0 + gamma * minus)  # eta + beta, Eqs. 15-16
    s = gamma / det
    # Eq. 16 regrouped: u = -s [(1 - gamma beta_b) a + gamma kappa b],
    #                   v =  s [(1 + gamma alpha) b - gamma kappa a].
    ua, ub = -s * (1.0 - gamma * beta_b), -s * gamma * kappa
    va, vb = ub, s * (1.0 + gamma * alpha)
    u = ua * ab[0] + ub * ab[1]
    v = va * ab[0] + vb * ab[1]
    # Norms from the vectors, not from the scalars: ua^2 alpha underflows for inputs ~1e99.
    uu, vv, uv = np.dot(u, u), np.dot(v, v), np.dot(u, v)
    increment = math.sqrt(d_pos) * math.sqrt(uu) + math.sqrt(d_neg) * math.sqrt(vv)
    new_bound = _admit(L, st[BOUND], increment)
    used = gamma / unit  # the gamma of Eq. 12 in input units
    if new_bound < 0.0 or not math.isfinite(used):
        out[:] = np.nan
        return SKIPPED
    La, Lb = PT[0], PT[1]
    pq = np.dot(La, Lb)
    # ||L + p u^T + q v^T||_F^2 with L u = ua p + ub q, L v = va p + vb q (p = L a, q = L b).
    cross = ua * d_pos + (ub + va) * pq + vb * d_neg
    square = d_pos * uu + d_neg * vv + 2.0 * pq * uv
    fro2 = st[FRO2] + 2.0 * cross + square
    terms = st[FRO2] + 2.0 * (abs(ua) * d_pos + abs(ub + va) * abs(pq) + abs(vb) * d_neg)
    terms += d_pos * uu + d_neg * vv + 2.0 * abs(pq * uv)
    for i in range(L.shape[0]):  # L += (L a) u^T + (L b) v^T: both rank-one updates, one pass
        p, q = La[i], Lb[i]
        row = L[i]
        for j in range(L.shape[1]):
            row[j] += p * u[j] + q * v[j]
    st[BOUND] = new_bound
    out[3] = used
    record_update(st, L, fro2, terms, True, ratio)
    return code


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _pair(
    L: Array, delta: Array, dd: float, gamma: float, unit: float, st: Array, out: Array
) -> int:
    """One COPML pair step on ``L`` in place (Eq. 20, Sherman-Morrison), in the units of
    :func:`_triplet`: ``delta = (x_t - h_k) / sqrt(unit)``, ``dd = delta.delta``.

    ``L <- L - gamma (L delta) delta^T / (1 + gamma delta^T delta)``; ``out[1]`` (``d_pos``) is
    ``||L (x_t - h_k)||^2`` before the update.
    """
    Ld = np.dot(L, delta)
    d_pos = np.dot(Ld, Ld)
    out[1] = d_pos * unit
    if not math.isfinite(out[1]):
        out[:] = np.nan
        return SKIPPED
    coef = gamma / (1.0 + gamma * dd)
    new_bound = _admit(L, st[BOUND], math.sqrt(d_pos) * coef * math.sqrt(dd))
    used = gamma / unit
    if new_bound < 0.0 or not math.isfinite(used):
        out[:] = np.nan
        return SKIPPED
    # <L, Ld delta^T> = d_pos; (coef d_pos)(coef dd), as coef^2 alone may underflow.
    fro2 = st[FRO2] - 2.0 * coef * d_pos + (coef * d_pos) * (coef * dd)
    terms = st[FRO2] + 2.0 * coef * d_pos + (coef * d_pos) * (coef * dd)
    for i in range(L.shape[0]):
        p = coef * Ld[i]
        row = L[i]
        for j in range(L.shape[1]):
            row[j] -= p * delta[j]
    st[BOUND] = new_bound
    out[3] = used
    record_update(st, L, fro2, terms, False, 1.0)
    return PAIR_UPDATE


@njit(**_JIT)  # type: ignore[untyped-decorator]
def learn_batch(
    Ls: Array,
    tracks: Any,
    gammas: Array,
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
    state: Array,
    codes: Any,
    values: Array,
) -> None:
    """Learn the rows of ``X`` in order, in place on the tracks ``Ls[tracks]`` and the buffer ``H``.

    A track is one copy of ``L`` (``Ls[j]``) with its state ``state[j]`` (entry bound and
    divergence monitor, :mod:`service.core.health`) and triplet step size ``gammas[j]``; every
    track learns from the same triplets (one normally, the candidates of a ``gamma="auto"``
    race). ``slots[t]`` is the buffer row of sample ``t``'s class and ``known[t]`` the number of
    classes seen before it (a class seen first at ``t`` has ``slots[t] == known[t]``).
    ``uniforms[t]`` in [0, 1) picks the negative class uniformly among the ``known[t] - 1``
    others (Sec. III-A). ``stream = [S, n]`` is the running scale estimate. ``scaled`` selects
    ``step="scaled"``: gammas, ``gamma_pair`` and ``margin`` are then in units of ``S``.
    Writes each step's outcome code to ``codes[t, j]`` and its ``hinge, d_pos, d_neg, gamma``
    to ``values[t, j]`` (left untouched, i.e. NaN, where none).
    """
    d = X.shape[1]
    ab = np.empty((2, d))
    delta = np.empty(d)
    for t in range(X.shape[0]):
        slot, c = slots[t], known[t]
        x = X[t]
        if slot == c:
            for j in tracks:
                codes[t, j] = NEW_CLASS
        elif c == 1 and not copml:
            for j in tracks:
                codes[t, j] = SINGLE_CLASS
        elif c == 1:
            for k in range(d):
                delta[k] = x[k] - H[slot, k]
            dd = np.dot(delta, delta)
            if not math.isfinite(dd):
                for j in tracks:
                    codes[t, j] = SKIPPED
            else:
                _observe_scale(stream, dd)
                unit = 1.0
                if scaled and stream[0] > 0.0:
                    unit = stream[0]
                    delta *= 1.0 / math.sqrt(unit)
                    dd = dd / unit
                for j in tracks:
                    g = gamma_pair * state[j, STEP_SCALE]
                    codes[t, j] = _pair(Ls[j], delta, dd, g, unit, state[j], values[t, j])
        else:
            neg = int(uniforms[t] * (c - 1))
            if neg >= slot:
                neg += 1
            for k in range(d):
                ab[0, k] = x[k] - H[slot, k]
                ab[1, k] = x[k] - H[neg, k]
            alpha = np.dot(ab[0], ab[0])
            beta_b = np.dot(ab[1], ab[1])
            if not (math.isfinite(alpha) and math.isfinite(beta_b)):
                for j in tracks:
                    codes[t, j] = SKIPPED
            else:
                kappa = np.dot(ab[0], ab[1])
                _observe_scale(stream, alpha)
                _observe_scale(stream, beta_b)
                unit, m = 1.0, margin
                if scaled:
                    if stream[0] > 0.0:
                        unit = stream[0]
                        ab *= 1.0 / math.sqrt(unit)
                        alpha, kappa, beta_b = alpha / unit, kappa / unit, beta_b / unit
                    else:  # every difference so far is zero: so are a and b (passive)
                        m = 0.0
                plus, minus = _spectrum(ab, alpha, kappa, beta_b)
                for j in tracks:
                    g = gammas[j] * state[j, STEP_SCALE]
                    codes[t, j] = _triplet(
                        Ls[j],
                        ab,
                        alpha,
                        kappa,
                        beta_b,
                        plus,
                        minus,
                        g,
                        m,
                        unit,
                        state[j],
                        values[t, j],
                    )
        H[slot] = x


@dataclass(frozen=True, slots=True)
class StepResult:
    """The result of learning one sample.

    ``hinge`` (Eq. 4), ``d_pos = ||L(x_t - x_p)||^2`` and ``d_neg = ||L(x_t - x_q)||^2`` are
    measured with ``L`` as it was before this sample's update; ``None`` where the step formed no
    such pair. ``gamma`` is the step size actually used (``None`` when ``L`` did not change).

    >>> StepResult("passive", hinge=-0.5, d_pos=1.0, d_neg=2.5).to_dict()["outcome"]
    'passive'
    """

    outcome: str
    hinge: float | None = None
    d_pos: float | None = None
    d_neg: float | None = None
    gamma: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "hinge": self.hinge,
            "d_pos": self.d_pos,
            "d_neg": self.d_neg,
            "gamma": self.gamma,
        }


@njit(cache=True)
def nan_filled(shape: Any) -> Array:
    """A new float64 array of ``shape`` (a tuple) holding NaN, filled keeping the GIL (see
    :func:`~service.core._validation.all_finite`; ``np.full`` gives it up and waits for it
    again).

    >>> nan_filled((2,)).tolist()
    [nan, nan]
    """
    out = np.empty(shape)
    out[:] = np.nan
    return out


def _maybe(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


class StepResults(Sequence[StepResult]):
    """The results of a batch, as arrays; items are :class:`StepResult` made on demand.

    ``codes`` indexes :data:`OUTCOMES`; ``values`` holds ``hinge, d_pos, d_neg, gamma`` per
    step (NaN for ``None``).

    >>> r = StepResults(np.array([0, 4]), np.array([[np.nan] * 4, [-1.0, 2.0, 4.0, np.nan]]))
    >>> r[1], len(r), r.counts()["passive"]
    (StepResult(outcome='passive', hinge=-1.0, d_pos=2.0, d_neg=4.0, gamma=None), 2, 1)
    """

    __slots__ = ("codes", "values")

    def __init__(self, codes: Any, values: Array) -> None:
        self.codes = codes
        self.values = values

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, index: int) -> StepResult: ...

    @overload
    def __getitem__(self, index: slice) -> StepResults: ...

    def __getitem__(self, index: int | slice) -> StepResult | StepResults:
        if isinstance(index, slice):
            return StepResults(self.codes[index], self.values[index])
        hinge, d_pos, d_neg, gamma = self.values[index].tolist()
        return StepResult(
            OUTCOMES[self.codes[index]], _maybe(hinge), _maybe(d_pos), _maybe(d_neg), _maybe(gamma)
        )

    def __iter__(self) -> Iterator[StepResult]:
        return (self[i] for i in range(len(self)))

    def counts(self) -> dict[str, int]:
        """Steps by outcome (every outcome, zeros included)."""
        n = np.bincount(self.codes, minlength=len(OUTCOMES))
        return {name: int(n[i]) for i, name in enumerate(OUTCOMES)}


def _single(code: int, out: Array) -> StepResult:
    return StepResults(np.array([code]), out[None, :])[0]


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _one_triplet(L: Array, ab: Array, gamma: float, margin: float, st: Array, out: Array) -> int:
    alpha = np.dot(ab[0], ab[0])
    kappa = np.dot(ab[0], ab[1])
    beta_b = np.dot(ab[1], ab[1])
    plus, minus = _spectrum(ab, alpha, kappa, beta_b)
    return _triplet(  # type: ignore[no-any-return]
        L, ab, alpha, kappa, beta_b, plus, minus, gamma, margin, 1.0, st, out
    )


def triplet_step(L: Array, ab: Array, gamma: float, margin: float) -> StepResult:
    """One OPML step (Eqs. 4, 16) on a C-contiguous ``L`` in place; ``ab = [a; b]``; the
    paper's units (``step="paper"``).

    >>> L = np.eye(2)
    >>> r = triplet_step(L, np.array([[0.0, 0.1], [1.0, 0.0]]), gamma=0.5, margin=1.0)
    >>> r.outcome, r.gamma, L.round(3).tolist()
    ('triplet_update', 0.5, [[2.0, 0.0], [0.0, 0.995]])
    """
    out = np.full(4, np.nan)
    ab = np.array(ab, dtype=np.float64, order="C")
    code = _one_triplet(L, ab, gamma, margin, fresh(L), out)
    return _single(code, out)


def pair_step(L: Array, delta: Array, gamma: float) -> StepResult:
    """One COPML pair step (Eq. 20) on a C-contiguous ``L`` in place (the paper's units).

    >>> L = np.eye(2)
    >>> pair_step(L, np.array([1.0, 0.0]), gamma=1.0).outcome, L.tolist()
    ('pair_update', [[0.5, 0.0], [0.0, 1.0]])
    """
    out = np.full(4, np.nan)
    delta = np.array(delta, dtype=np.float64, order="C")
    code = _pair(L, delta, float(np.dot(delta, delta)), gamma, 1.0, fresh(L), out)
    return _single(code, out)
