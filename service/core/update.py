"""The closed-form updates of OPML and COPML, in place, in O(d^2), with no inverse.

Two kernels, both acting on a C-contiguous float64 ``L`` in place:

* :func:`triplet_step` -- the OPML step (Eqs. 4, 12, 16). The hinge (Eq. 4) is tested with
  the current ``L``; when active, ``L <- L (I + gamma A)^{-1}`` with ``A = a a^T - b b^T`` is
  applied as the rank-two correction ``L <- L + (L a) u^T + (L b) v^T`` of Theorem 1 (Eq. 16):
  one BLAS pass computes ``[L a, L b]`` and one in-place BLAS ``dgemm`` with inner size 2 adds
  the correction, so ``L`` is read twice and written once, and no ``d x d`` temporary exists.
* :func:`pair_step` -- the COPML cold-start step (Eq. 20, Sherman-Morrison), one matrix-vector
  product and one in-place rank-one ``dger``.

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
  below ``MIN_EIGENVALUE``. Under the paper's
  assumptions (``||x|| <= 1``, ``gamma < 1/4``, i.e. ``normalize="l2"``) ``lambda_- >= -4`` and
  no step with ``gamma <= 0.225`` is ever shrunk.
* **Skip.** If the step's arithmetic would overflow float64 (enormous inputs), or would push an
  entry of ``L`` past :data:`MAX_ABS_ENTRY`, ``L`` is left untouched and the outcome is
  ``skipped``. A cheap running upper bound of ``max |L_ij|`` (O(1) per step; an exact O(d^2)
  re-measure only when the bound nears the limit) decides this, so ``L`` never holds NaN or Inf.
  Callers may silence numpy's overflow warnings around a step: overflow is detected here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg.blas import dgemm, dger

from service.core._validation import MAX_ABS_ENTRY, Array

#: Smallest eigenvalue allowed for ``I + gamma A_t`` (see the module docstring).
MIN_EIGENVALUE = 0.1


@dataclass(frozen=True, slots=True)
class Eigen:
    """Eigenvalues of ``A = a a^T - b b^T`` on the span of ``a, b`` (Lemma 2).

    >>> Eigen(plus=2.0, minus=-1.0).minus
    -1.0
    """

    plus: float
    minus: float


def eigenvalues(alpha: float, beta_b: float, gram: float) -> Eigen:
    """Closed-form eigenvalues of ``a a^T - b b^T`` (Lemma 2), cancellation-free.

    ``lambda_{+/-} = [(alpha - beta_b) +/- sqrt((alpha - beta_b)^2 + 4 g)] / 2`` with
    ``g = alpha beta_b - kappa^2 >= 0`` (equal to the paper's form since
    ``(alpha + beta_b)^2 - 4 kappa^2 = (alpha - beta_b)^2 + 4 g``). The root of larger magnitude
    is computed directly and the other from ``lambda_+ lambda_- = -g``.

    >>> e = eigenvalues(alpha=4.0, beta_b=1.0, gram=0.0)   # b parallel to a: A = 3/4 a a^T
    >>> (e.plus, e.minus)
    (3.0, -0.0)
    """
    gram = max(gram, 0.0)  # >= 0 by Cauchy-Schwarz; rounding may say -0.0 or a hair less
    t = alpha - beta_b
    disc = math.hypot(t, 2.0 * math.sqrt(gram))
    if t >= 0.0:
        plus = 0.5 * (t + disc)
        minus = -gram / plus if plus > 0.0 else 0.0
    else:
        minus = 0.5 * (t - disc)
        plus = -gram / minus
    return Eigen(plus, minus)


@dataclass(frozen=True, slots=True)
class StepResult:
    """The result of learning one sample.

    ``hinge`` (Eq. 4), ``d_pos = ||L(x_t - x_p)||^2`` and ``d_neg = ||L(x_t - x_q)||^2`` are
    measured with ``L`` as it was before this sample's update; ``None`` where the step formed no
    such pair. ``gamma`` is the step size actually used (``None`` when ``L`` did not change).
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


class EntryBound:
    """A running upper bound of ``max |L_ij|`` that keeps ``L`` below :data:`MAX_ABS_ENTRY`.

    A correction ``p q^T`` changes no entry by more than ``max|p| max|q| <= ||p|| ||q||``, so
    the bound grows by that (O(1) from quantities the step already has) and is re-measured
    exactly, in O(d^2), only when it nears the limit.

    >>> L = np.eye(3)
    >>> bound = EntryBound(L)
    >>> bound.admits(L, 2.0), bound.value
    (True, 3.0)
    >>> bound.admits(L, 2 * MAX_ABS_ENTRY)   # re-measured exactly (1.0): still too much
    False
    """

    __slots__ = ("value",)

    def __init__(self, L: Array) -> None:
        self.value = float(np.abs(L).max()) if L.size else 0.0

    def admits(self, L: Array, increment: float) -> bool:
        """Whether adding a correction bounded by ``increment`` keeps ``L`` in range."""
        if not math.isfinite(increment):
            return False
        if self.value + increment <= MAX_ABS_ENTRY:
            self.value += increment
            return True
        self.value = float(np.abs(L).max())  # the bound drifted; measure exactly (rare)
        if self.value + increment <= MAX_ABS_ENTRY:
            self.value += increment
            return True
        return False


def triplet_step(L: Array, ab: Array, gamma: float, margin: float, bound: EntryBound) -> StepResult:
    """One OPML step on ``L`` in place; ``ab`` is the ``2 x d`` array ``[a; b]``.

    ``a = x_t - x_p`` (positive difference), ``b = x_t - x_q`` (negative difference).
    """
    PT = ab @ L.T  # rows: L a, L b -- one pass over L
    (d_pos, _), (_, d_neg) = np.dot(PT, PT.T).tolist()
    if not (math.isfinite(d_pos) and math.isfinite(d_neg)):  # overflow (or inf - inf)
        return StepResult("skipped")
    hinge = margin + d_pos - d_neg  # Eq. 4
    if hinge <= 0.0:
        return StepResult("passive", hinge, d_pos, d_neg)

    (alpha, kappa), (_, beta_b) = np.dot(ab, ab.T).tolist()
    if not (math.isfinite(alpha) and math.isfinite(beta_b)):
        return StepResult("skipped", hinge, d_pos, d_neg)
    gram = alpha * beta_b - kappa * kappa
    if gram < 0.25 * alpha * beta_b and alpha > 0.0:  # nearly colinear: it cancels; project
        r = ab[1] - (kappa / alpha) * ab[0]
        gram = alpha * float(r @ r)
    eig = eigenvalues(alpha, beta_b, gram)
    outcome = "triplet_update"
    if 1.0 + gamma * eig.minus < MIN_EIGENVALUE:  # Lemma 2: I + gamma A near singular
        gamma = (1.0 - MIN_EIGENVALUE) / -eig.minus
        outcome = "shrunk_update"
    det = (1.0 + gamma * eig.plus) * (1.0 + gamma * eig.minus)  # eta + beta, Eqs. 15-16
    s = gamma / det
    # Eq. 16 regrouped: u = -s [(1 - gamma beta_b) a + gamma kappa b],
    #                   v =  s [(1 + gamma alpha) b - gamma kappa a].
    ua, ub = -s * (1.0 - gamma * beta_b), -s * gamma * kappa
    va, vb = ub, s * (1.0 + gamma * alpha)
    norm_u = math.sqrt(max(ua * ua * alpha + 2.0 * ua * ub * kappa + ub * ub * beta_b, 0.0))
    norm_v = math.sqrt(max(va * va * alpha + 2.0 * va * vb * kappa + vb * vb * beta_b, 0.0))
    increment = math.sqrt(d_pos) * norm_u + math.sqrt(d_neg) * norm_v
    if not bound.admits(L, increment):
        return StepResult("skipped", hinge, d_pos, d_neg)
    QT = np.dot(np.array([[ua, ub], [va, vb]]), ab)  # rows: u, v
    # L^T += [u v] [La Lb]^T, i.e. L += La u^T + Lb v^T, in place on the Fortran view L^T.
    dgemm(1.0, QT.T, PT.T, beta=1.0, c=L.T, trans_b=1, overwrite_c=1)
    return StepResult(outcome, hinge, d_pos, d_neg, gamma)


def pair_step(L: Array, delta: Array, gamma: float, bound: EntryBound) -> StepResult:
    """One COPML pair step on ``L`` in place (Eq. 20, Sherman-Morrison).

    ``L <- L - gamma (L delta) delta^T / (1 + gamma delta^T delta)``; ``d_pos`` is
    ``||L delta||^2`` before the update.
    """
    Ld = L @ delta
    d_pos = float(Ld @ Ld)
    dd = float(delta @ delta)
    if not (math.isfinite(d_pos) and math.isfinite(dd)):
        return StepResult("skipped")
    coef = gamma / (1.0 + gamma * dd)
    if not bound.admits(L, math.sqrt(d_pos) * coef * math.sqrt(dd)):
        return StepResult("skipped", None, d_pos)
    # L^T += (-coef delta) (L delta)^T, in place on the Fortran view L^T.
    dger(-coef, delta, Ld, a=L.T, overwrite_a=1)
    return StepResult("pair_update", None, d_pos, None, gamma)
