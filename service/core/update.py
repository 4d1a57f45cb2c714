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
``g = alpha beta_b - kappa^2`` (taken as ``alpha ||b - (kappa/alpha) a||^2``, which stays exact
for nearly colinear ``a, b`` where the naive difference cancels). ``lambda_+ >= 0 >= lambda_-``.

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
  ``skipped``. A cheap running upper bound of ``max |L_ij|`` (O(d) per step; an exact O(d^2)
  re-measure only when the bound nears the limit) decides this, so ``L`` never holds NaN or Inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg.blas import dgemm, dger

from service.core._validation import MAX_ABS_ENTRY, Array

#: Smallest eigenvalue allowed for ``I + gamma A_t`` (see the module docstring).
MIN_EIGENVALUE = 0.1


@dataclass(frozen=True, slots=True)
class Eigen:
    """Eigenvalues of ``A = a a^T - b b^T`` on the span of ``a, b`` (Lemma 2)."""

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
    t = alpha - beta_b
    disc = math.hypot(t, 2.0 * math.sqrt(gram))
    if t >= 0.0:
        plus = 0.5 * (t + disc)
        minus = -gram / plus if plus > 0.0 else 0.0
    else:
        minus = 0.5 * (t - disc)
        plus = -gram / minus
    return Eigen(plus, minus)


def _bounded_increment(P: Array, Q: Array) -> float:
    """An upper bound of ``max |(P Q^T)_ij|`` for ``d x 2`` matrices ``P``, ``Q``."""
    p = np.abs(P).max(axis=0)
    q = np.abs(Q).max(axis=0)
    return float(p[0] * q[0] + p[1] * q[1])


@dataclass(slots=True)
class Step:
    """What one step measured and did; distances are squared and measured before the update."""

    outcome: str
    hinge: float | None = None
    d_pos: float | None = None
    d_neg: float | None = None
    gamma: float | None = None


class EntryBound:
    """A running upper bound of ``max |L_ij|`` that keeps ``L`` below :data:`MAX_ABS_ENTRY`."""

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


def triplet_step(
    L: Array, ab: Array, gamma: float, margin: float, bound: EntryBound
) -> Step:
    """One OPML step on ``L`` in place; ``ab`` is the ``2 x d`` array ``[a; b]``.

    ``a = x_t - x_p`` (positive difference), ``b = x_t - x_q`` (negative difference).
    """
    PT = ab @ L.T  # rows: L a, L b -- one pass over L
    if not np.isfinite(PT).all():
        return Step("skipped")
    La, Lb = PT[0], PT[1]
    d_pos = float(La @ La)
    d_neg = float(Lb @ Lb)
    if not (math.isfinite(d_pos) and math.isfinite(d_neg)):
        return Step("skipped")
    hinge = margin + d_pos - d_neg  # Eq. 4
    if hinge <= 0.0:
        return Step("passive", hinge, d_pos, d_neg)

    a, b = ab[0], ab[1]
    alpha = float(a @ a)
    kappa = float(a @ b)
    beta_b = float(b @ b)
    if not (math.isfinite(alpha) and math.isfinite(beta_b)):
        return Step("skipped", hinge, d_pos, d_neg)
    if alpha > 0.0:
        r = b - (kappa / alpha) * a
        gram = alpha * float(r @ r)
    else:
        gram = 0.0
    eig = eigenvalues(alpha, beta_b, gram)
    outcome = "triplet_update"
    if 1.0 + gamma * eig.minus < MIN_EIGENVALUE:  # Lemma 2: I + gamma A near singular
        gamma = (1.0 - MIN_EIGENVALUE) / -eig.minus
        outcome = "shrunk_update"
    det = (1.0 + gamma * eig.plus) * (1.0 + gamma * eig.minus)  # eta + beta, Eqs. 15-16
    s = gamma / det
    # Eq. 16 regrouped: u = -s [(1 - gamma beta_b) a + gamma kappa b],
    #                   v =  s [(1 + gamma alpha) b - gamma kappa a].
    QT = np.empty_like(ab)
    np.multiply(a, -s * (1.0 - gamma * beta_b), out=QT[0])
    QT[0] -= (s * gamma * kappa) * b
    np.multiply(b, s * (1.0 + gamma * alpha), out=QT[1])
    QT[1] -= (s * gamma * kappa) * a
    if not np.isfinite(QT).all() or not bound.admits(L, _bounded_increment(PT.T, QT.T)):
        return Step("skipped", hinge, d_pos, d_neg)
    # L^T += [u v] [La Lb]^T, i.e. L += La u^T + Lb v^T, in place on the Fortran view L^T.
    dgemm(1.0, QT.T, PT.T, beta=1.0, c=L.T, trans_b=1, overwrite_c=1)
    return Step(outcome, hinge, d_pos, d_neg, gamma)


def pair_step(L: Array, delta: Array, gamma: float, bound: EntryBound) -> Step:
    """One COPML pair step on ``L`` in place (Eq. 20, Sherman-Morrison).

    ``L <- L - gamma (L delta) delta^T / (1 + gamma delta^T delta)``; ``d_pos`` is
    ``||L delta||^2`` before the update.
    """
    Ld = L @ delta
    d_pos = float(Ld @ Ld)
    dd = float(delta @ delta)
    if not (math.isfinite(d_pos) and math.isfinite(dd)):
        return Step("skipped")
    coef = gamma / (1.0 + gamma * dd)
    increment = float(np.abs(Ld).max() * np.abs(delta).max() * coef) if Ld.size else 0.0
    if not bound.admits(L, increment):
        return Step("skipped", None, d_pos)
    # L^T += (-coef delta) (L delta)^T, in place on the Fortran view L^T.
    dger(-coef, delta, Ld, a=L.T, overwrite_a=1)
    return Step("pair_update", None, d_pos, None, gamma)
