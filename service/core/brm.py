"""Boundary-restricted metric (BRM: Chen et al., Mach. Learn. 2023, the BRM paper) and its online
BRM-R step. Equation numbers are the BRM paper's; in our words in docs/algorithms/brm.md.

Definition 1, Eq. (7), with ``phi(x) = L x`` (``h = d``) and ``p = 2``: for ``z = L (x - y)``,

    D_R(x, y) = sqrt( (1/d) sum_i R(|z_i|)^2 )          in [0, B)

for a smooth increasing restriction ``R: [0, inf) -> [0, B)`` (Table 1, :data:`RESTRICTIONS`).
The service uses the paper's default, the Sigmoid ``R(t) = 2/(1 + e^{-t}) - 1 = tanh(t/2)``
(``B = 1``), computed with ``tanh``, which saturates instead of overflowing. Squared
restricted distances ``D_R^2`` are in [0, 1): the service's squared-distance convention. In
float64 a saturated coordinate rounds to ``R = 1``; reported values are kept in the open interval
by rounding them down to the largest double below ``B`` (resp. ``B^2``), the nearest
representable value that keeps Theorem 2's range.

BRM is not a function of the Mahalanobis matrix ``M = L^T L``: it restricts each coordinate of
``L (x - y)``, so ``L`` and ``Q L`` (``Q`` orthogonal) give different ``D_R``. A ``brm``
learner uses its own ``L``; any other metric is measured with the canonical factor
``L_c = Lambda^{1/2} V^T`` of ``M = V Lambda V^T`` (:func:`canonical_factor`: principal axes,
orthogonal rows; it depends on ``M`` only, up to the order and signs of its rows, which
``D_R`` ignores; with tied eigenvalues any orthonormal basis of the tied space is as good).

Online BRM-R step (3.4; squared-``D`` form of the relative loss Eq. (3) with the hinge):

    ell = max(0, D_R^2(a) - D_R^2(b) + tau),      a = x_t - x_p,  b = x_t - x_q,
    L <- (1 - 2 eta lam) L - (2 eta / d) [g(L a) a^T - g(L b) b^T],
    g(z)_i = R(|z_i|) R'(|z_i|) sign(z_i) = tanh(z_i/2) (1 - tanh^2(z_i/2)) / 2   (Eq. 11),

the same fused rank-two kernel as OPML and L-SGD with left vectors ``g(L a), g(L b)``
(``|g_i| <= 1/(3 sqrt 3)``), O(d^2) per sample. The factor ``R'`` vanishes in saturation: far
pairs stop being pushed (the "restriction"). The margin ``tau`` must be below ``B^2 = 1`` (the
largest possible gap of ``D_R^2``); default 0.1. No closed form: the loss is not
quadratic in ``L``.

Step rules as in :mod:`service.core.sgd`. For ``descent`` (derived here): ``t -> tanh(t/2)^2``
has second derivative ``(1 - u)(1 - 3u)/2`` with ``u = tanh^2(t/2)``, in ``[-1/6, 1/2]``, so
``D_R^2(L a) - D_R^2(L b)`` is ``beta``-smooth in ``L`` (Frobenius norm) with
``beta = (||a||^2 + ||b||^2) / (2 d)``. A gradient step with ``eta beta <= 2`` does not increase
the loss (descent lemma); the rule takes ``eta_t = min(eta, kappa / beta)``, ``kappa <= 0.5``:
a quarter of that limit, the same fraction as L-SGD's ``s lambda_+ <= kappa`` of its limit 2.

What the BRM paper's theory is worth: Theorem 2 (``D_R`` is a pseudo-metric; tested) holds;
Theorems 1 and 4 are not certificates (asymptotic, resp. for a fixed ``phi``) and are not
reported.

The compiled step (:func:`~service.core.gradient.brm_triplet`) is in :mod:`service.core.gradient`
with the loop, for numba's cache (see there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from service.core._validation import Array
from service.core.gradient import STEP_RULES, brm_triplet
from service.core.update import StepResult, _single

#: The largest double below 1: saturated restricted distances are reported as this.
BELOW_ONE = float(np.nextafter(1.0, 0.0))

#: ISRU's ``omega`` (Table 1 leaves it free; 1 gives ``B = 1``).
ISRU_OMEGA = 1.0


def _softsign(t: Array) -> Array:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # unused branches
        out: Array = np.where(t > 1.0, 1.0 / (1.0 / t + 1.0), t / (1.0 + t))
    return out


def _isru(t: Array) -> Array:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # unused branches
        out: Array = np.where(
            t > 1.0,
            1.0 / np.sqrt(1.0 / (t * t) + ISRU_OMEGA),  # t^2 may overflow: divide through
            t / np.sqrt(1.0 + ISRU_OMEGA * t * t),
        )
    return out


#: Table 1 of the BRM paper: ``name -> (R, B = sup R, R'(0))`` for ``t >= 0`` (``t = inf`` allowed).
RESTRICTIONS: dict[str, tuple[Callable[[Array], Array], float, float]] = {
    "sigmoid": (lambda t: np.tanh(0.5 * t), 1.0, 0.5),
    "softsign": (_softsign, 1.0, 1.0),
    "arctan": (np.arctan, 0.5 * math.pi, 1.0),
    "tanh": (np.tanh, 1.0, 1.0),
    "isru": (_isru, 1.0 / math.sqrt(ISRU_OMEGA), 1.0),
}


def restricted_squared_norms(Z: Any, restriction: str = "sigmoid") -> Array:
    """``(1/d) sum_i R(|z_i|)^2`` for every row ``z`` of ``Z`` (Eq. 7 squared, ``p = 2``).

    ``Z`` may hold ``inf`` (a coordinate beyond float64: ``R = B``); values are in ``[0, B^2)``
    (see the module docstring on rounding).

    >>> restricted_squared_norms([[0.0, 0.0], [1e300, 0.0], [np.inf, np.inf]]).tolist()
    [0.0, 0.5, 0.9999999999999999]
    """
    R, B, _ = RESTRICTIONS[restriction]
    A = np.abs(np.atleast_2d(np.asarray(Z, dtype=np.float64)))
    r = R(A)
    out: Array = np.minimum(np.einsum("ij,ij->i", r, r) / A.shape[1], np.nextafter(B * B, 0.0))
    return out


def restricted_root(squared: Any) -> Array:
    """``D_R = sqrt(D_R^2)``, kept below 1 (the square root of the largest double below 1
    rounds to 1).

    >>> restricted_root([0.25, BELOW_ONE]).tolist()
    [0.5, 0.9999999999999999]
    """
    out: Array = np.minimum(np.sqrt(np.asarray(squared, dtype=np.float64)), BELOW_ONE)
    return out


def canonical_factor(L: Any) -> Array:
    """``L_c = Lambda^{1/2} V^T`` with ``L^T L = V Lambda V^T``, from the SVD of ``L``
    (``L = U S V^T`` gives ``Lambda = S^2`` without squaring ``L``'s condition number).

    >>> Q = np.array([[0.0, 1.0], [-1.0, 0.0]])
    >>> L = np.array([[2.0, 0.0], [0.0, 1.0]])
    >>> bool(np.allclose(np.abs(canonical_factor(Q @ L)), np.abs(canonical_factor(L))))
    True
    """
    _, s, Vt = np.linalg.svd(np.asarray(L, dtype=np.float64))
    out: Array = s[:, None] * Vt
    return out


def brm_step(
    L: Array,
    ab: Array,
    eta: float,
    margin: float = 0.1,
    step: str = "constant",
    kappa: float = 0.5,
    t: int = 1,
) -> StepResult:
    """One BRM-R step (3.4, no decay) on a C-contiguous ``L`` in place; ``ab = [a; b]``.

    ``d_pos`` / ``d_neg`` of the result are restricted squared distances ``D_R^2``.

    >>> L = np.eye(2)
    >>> r = brm_step(L, np.array([[0.0, 2.0], [2.0, 0.0]]), eta=0.5, margin=0.1)
    >>> r.outcome, r.hinge, bool(L[1, 1] < 1.0 < L[0, 0])
    ('sgd_update', 0.1, True)
    """
    out = np.empty(4)
    code, _, _, _ = brm_triplet(
        L,
        np.ascontiguousarray(ab, dtype=np.float64),
        1.0,
        float(np.abs(L).max()),
        t,
        eta,
        kappa,
        0.0,
        STEP_RULES.index(step),
        margin,
        out,
    )
    return _single(code, out)
