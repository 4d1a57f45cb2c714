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
(Sec. III-A), in one compiled loop. It is compiled with numba: the step is O(d^2) arithmetic,
but for the d of face or re-identification embeddings (64-512) a numpy transcription spends
most of its time in per-sample Python overhead (about ten numpy calls a step); the compiled
loop is 3-10x faster there and as fast as the memory bandwidth allows at large d
(``benchmarks/core_timing.py``). The matrix-vector products still go to BLAS (numba's
``np.dot``). The kernels release the GIL, so a service thread running them does not block
the event loop.

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
* **Skip.** If the step's arithmetic would overflow float64 (enormous inputs), or would push an
  entry of ``L`` past :data:`MAX_ABS_ENTRY`, ``L`` is left untouched and the outcome is
  ``skipped``. A running upper bound of ``max |L_ij|`` decides this: a correction ``p q^T``
  changes no entry by more than ``||p|| ||q||``, known in O(1) from the step's scalars, and the
  bound is re-measured exactly, in O(d^2), only when it nears the limit. So ``L`` never holds
  NaN or Inf.
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
def _triplet(
    L: Array, ab: Array, gamma: float, margin: float, bound: float, out: Array
) -> tuple[int, float]:
    """One OPML step on ``L`` in place; ``ab = [a; b]`` with ``a = x_t - x_p``, ``b = x_t - x_q``.

    Writes ``hinge, d_pos, d_neg, gamma used`` to ``out`` (NaN where none) and returns the
    outcome code and the new bound of ``max |L_ij|``.
    """
    out[:] = np.nan
    PT = np.dot(ab, L.T)  # rows: L a, L b -- one BLAS pass over L
    d_pos = np.dot(PT[0], PT[0])
    d_neg = np.dot(PT[1], PT[1])
    if not (math.isfinite(d_pos) and math.isfinite(d_neg)):  # overflow (or inf - inf)
        return SKIPPED, bound
    hinge = margin + d_pos - d_neg  # Eq. 4
    out[0], out[1], out[2] = hinge, d_pos, d_neg
    if hinge <= 0.0:
        return PASSIVE, bound

    a, b = ab[0], ab[1]
    alpha = np.dot(a, a)
    kappa = np.dot(a, b)
    beta_b = np.dot(b, b)
    if not (math.isfinite(alpha) and math.isfinite(beta_b)):
        return SKIPPED, bound
    gram = alpha * beta_b - kappa * kappa
    if gram < 0.25 * alpha * beta_b and alpha > 0.0:  # nearly colinear: it cancels; project
        r = b - (kappa / alpha) * a
        gram = alpha * np.dot(r, r)
    plus, minus = eigenvalues(alpha, beta_b, gram)
    code = TRIPLET_UPDATE
    if 1.0 + gamma * minus < MIN_EIGENVALUE:  # Lemma 2: I + gamma A near singular
        gamma = (1.0 - MIN_EIGENVALUE) / -minus
        code = SHRUNK_UPDATE
    det = (1.0 + gamma * plus) * (1.0 + gamma * minus)  # eta + beta, Eqs. 15-16
    s = gamma / det
    # Eq. 16 regrouped: u = -s [(1 - gamma beta_b) a + gamma kappa b],
    #                   v =  s [(1 + gamma alpha) b - gamma kappa a].
    ua, ub = -s * (1.0 - gamma * beta_b), -s * gamma * kappa
    va, vb = ub, s * (1.0 + gamma * alpha)
    norm_u = math.sqrt(max(ua * ua * alpha + 2.0 * ua * ub * kappa + ub * ub * beta_b, 0.0))
    norm_v = math.sqrt(max(va * va * alpha + 2.0 * va * vb * kappa + vb * vb * beta_b, 0.0))
    new_bound = _admit(L, bound, math.sqrt(d_pos) * norm_u + math.sqrt(d_neg) * norm_v)
    if new_bound < 0.0:
        return SKIPPED, bound
    u = ua * a + ub * b
    v = va * a + vb * b
    La, Lb = PT[0], PT[1]
    for i in range(L.shape[0]):  # L += (L a) u^T + (L b) v^T: both rank-one updates, one pass
        p, q = La[i], Lb[i]
        row = L[i]
        for j in range(L.shape[1]):
            row[j] += p * u[j] + q * v[j]
    out[3] = gamma
    return code, new_bound


@njit(**_JIT)  # type: ignore[untyped-decorator]
def _pair(L: Array, delta: Array, gamma: float, bound: float, out: Array) -> tuple[int, float]:
    """One COPML pair step on ``L`` in place (Eq. 20, Sherman-Morrison).

    ``L <- L - gamma (L delta) delta^T / (1 + gamma delta^T delta)``; ``out[2]`` (``d_pos``) is
    ``||L delta||^2`` before the update.
    """
    out[:] = np.nan
    Ld = np.dot(L, delta)
    d_pos = np.dot(Ld, Ld)
    dd = np.dot(delta, delta)
    if not (math.isfinite(d_pos) and math.isfinite(dd)):
        return SKIPPED, bound
    out[1] = d_pos
    coef = gamma / (1.0 + gamma * dd)
    new_bound = _admit(L, bound, math.sqrt(d_pos) * coef * math.sqrt(dd))
    if new_bound < 0.0:
        return SKIPPED, bound
    for i in range(L.shape[0]):
        p = coef * Ld[i]
        row = L[i]
        for j in range(L.shape[1]):
            row[j] -= p * delta[j]
    out[3] = gamma
    return PAIR_UPDATE, new_bound


@njit(**_JIT)  # type: ignore[untyped-decorator]
def learn_batch(
    L: Array,
    H: Array,
    X: Array,
    slots: Any,
    known: Any,
    uniforms: Array,
    copml: bool,
    gamma: float,
    gamma_pair: float,
    margin: float,
    bound: float,
    codes: Any,
    values: Array,
) -> float:
    """Learn the rows of ``X`` in order, in place on ``L`` and the buffer ``H``.

    ``slots[t]`` is the buffer row of sample ``t``'s class and ``known[t]`` the number of
    classes seen before it (a class seen first at ``t`` has ``slots[t] == known[t]``).
    ``uniforms[t]`` in [0, 1) picks the negative class uniformly among the ``known[t] - 1``
    others (Sec. III-A). Writes each step's outcome code to ``codes`` and its
    ``hinge, d_pos, d_neg, gamma`` to ``values`` (NaN where none); returns the new bound.
    """
    d = X.shape[1]
    ab = np.empty((2, d))
    for t in range(X.shape[0]):
        slot, c = slots[t], known[t]
        x, out = X[t], values[t]
        out[:] = np.nan
        if slot == c:
            codes[t] = NEW_CLASS
        elif c == 1:
            if copml:
                codes[t], bound = _pair(L, x - H[slot], gamma_pair, bound, out)
            else:
                codes[t] = SINGLE_CLASS
        else:
            j = int(uniforms[t] * (c - 1))
            if j >= slot:
                j += 1
            for k in range(d):
                ab[0, k] = x[k] - H[slot, k]
                ab[1, k] = x[k] - H[j, k]
            codes[t], bound = _triplet(L, ab, gamma, margin, bound, out)
        H[slot] = x
    return bound


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


def triplet_step(L: Array, ab: Array, gamma: float, margin: float) -> StepResult:
    """One OPML step (Eqs. 4, 16) on a C-contiguous ``L`` in place; ``ab = [a; b]``.

    >>> L = np.eye(2)
    >>> r = triplet_step(L, np.array([[0.0, 0.1], [1.0, 0.0]]), gamma=0.5, margin=1.0)
    >>> r.outcome, r.gamma, L.round(3).tolist()
    ('triplet_update', 0.5, [[2.0, 0.0], [0.0, 0.995]])
    """
    out = np.empty(4)
    code, _ = _triplet(
        L, np.ascontiguousarray(ab, dtype=np.float64), gamma, margin, float(np.abs(L).max()), out
    )
    return _single(code, out)


def pair_step(L: Array, delta: Array, gamma: float) -> StepResult:
    """One COPML pair step (Eq. 20) on a C-contiguous ``L`` in place.

    >>> L = np.eye(2)
    >>> pair_step(L, np.array([1.0, 0.0]), gamma=1.0).outcome, L.tolist()
    ('pair_update', [[0.5, 0.0], [0.0, 1.0]])
    """
    out = np.empty(4)
    code, _ = _pair(
        L, np.ascontiguousarray(delta, dtype=np.float64), gamma, float(np.abs(L).max()), out
    )
    return _single(code, out)
