"""The read-only view of one metric ``L``: the queries (Eqs. 1, 2, and the restricted distance
of the BRM paper) and nothing that learns.

A :class:`MetricView` is what a published snapshot holds for its queries, and what a
:class:`~service.core.learner.Learner` answers its own queries with (a view of its current ``L``,
dropped when ``L`` changes), so both compute the same numbers with the same arithmetic. It is
immutable: what it derives from ``L`` (the triangular factor of a one-to-many query, the
canonical factor of the restricted distance) is computed on first use and kept; concurrent
readers may both compute it, harmlessly.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
from scipy.linalg.blas import dtrmm

from service.core._threads import PINNED_WORK, blas
from service.core._validation import Array, check_matrix, check_metric, check_vector
from service.core.brm import canonical_factor, restricted_root, restricted_squared_norms
from service.core.config import LearnerConfig
from service.core.normalize import normalize_rows, normalized_minus

#: One-to-many queries go through the candidate rows ``B`` in blocks of this many rows, so that
#: a block of differences and its image stay in the core's L2 cache (one pass over ``B``).
_QUERY_BLOCK = 1024


def _quiet() -> np.errstate:
    """Enormous query inputs may overflow to inf, an honest answer: no numpy warning."""
    return np.errstate(over="ignore", invalid="ignore")


class MetricView:
    """The queries of the metric ``L`` under ``config`` (its dimension, its input
    normalisation, and for ``algorithm="brm"`` the restricted distance of its own ``L``).

    ``L`` is not copied: hand over an array that nobody changes afterwards (a snapshot's copy).
    ``check=False`` skips the O(d^2) validation of ``L`` for one already validated (the
    learner's own).

    >>> import numpy as np
    >>> view = MetricView(np.diag([2.0, 1.0]), LearnerConfig(dim=2))
    >>> view.squared_distance([1.0, 0.0], [0.0, 0.0]), view.distance([0.0, 3.0], [0.0, 0.0])
    (4.0, 3.0)
    >>> view.squared_distances([0.0, 0.0], [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]).tolist()
    [4.0, 1.0, 5.0]
    >>> view.transform([[1.0, 1.0]]).tolist()
    [[2.0, 1.0]]
    >>> round(view.restricted_squared_distance([0.0, 0.0], [0.0, 0.0]), 6)
    0.0
    >>> view.L[0, 0] = 5.0
    Traceback (most recent call last):
    ...
    ValueError: assignment destination is read-only
    >>> MetricView(np.full((2, 2), np.nan), LearnerConfig(dim=2))
    Traceback (most recent call last):
    ...
    ValueError: L: contains NaN or Inf
    """

    def __init__(self, L: Any, config: LearnerConfig, *, check: bool = True) -> None:
        self.config = config
        self._L: Array = check_metric(L, config.dim, "L") if check else L
        self._R: Array | None = None  # triangular factor of L for one-to-many (see _factor)
        self._canonical: Array | None = None  # L of the restricted distance (see brm)

    @property
    def L(self) -> Array:
        """The transformation matrix (a read-only view; copy it to keep it)."""
        view = self._L.view()
        view.flags.writeable = False
        return view

    @property
    def dim(self) -> int:
        return self.config.dim

    # -- the Mahalanobis distance (Eqs. 1, 2) ----------------------------------------------

    def _prepare(self, X: Any, name: str) -> Array:
        return normalize_rows(check_matrix(X, self.dim, name), self.config.normalize)

    def squared_distance(self, a: Any, b: Any) -> float:
        """``||L(a - b)||^2`` (Eq. 2)."""
        d = self.dim
        X = np.empty((2, d))
        X[0] = check_vector(a, d, "a")
        X[1] = check_vector(b, d, "b")
        X = normalize_rows(X, self.config.normalize)  # row by row: as for each one alone
        with _quiet():  # enormous inputs may overflow to inf: an honest answer
            z = self._L @ (X[0] - X[1])
            return float(z @ z)

    def distance(self, a: Any, b: Any) -> float:
        """``sqrt((a - b)^T M (a - b))`` with ``M = L^T L`` (Eq. 1)."""
        return math.sqrt(self.squared_distance(a, b))

    def squared_distances(self, a: Any, B: Any) -> Array:
        """``||L(a - b_i)||^2`` for every row ``b_i`` of ``B`` (one to many).

        ``B`` is processed in blocks of :data:`_QUERY_BLOCK` rows (normalise, subtract
        ``a``, map, square-sum while the block is in cache). A large ``B`` (at least 4d rows)
        is mapped by ``R``, the triangular factor of ``L = QR`` (``||L x|| = ||R x||``, ``Q``
        orthogonal): a triangular product (BLAS ``dtrmm``) is half the multiply-adds of
        ``x L^T``. ``R`` is computed once per ``L`` (O(d^3), amortised over those 4d rows and
        kept for the next query). Both ways agree to rounding (~1e-15 relative).
        """
        d = self.dim
        A = self._prepare(np.atleast_2d(check_vector(a, d, "a")), "a")
        Bs = check_matrix(B, d, "b")
        n = len(Bs)
        out: Array = np.empty(n)
        R = self._factor() if n >= 4 * d else None
        block = min(n, _QUERY_BLOCK)
        diff = np.empty((block, d))
        image = np.empty((block, d)) if R is None else diff
        LT = self._L.T
        pinned = blas().limit(limits=1, user_api="blas") if n * d * d >= PINNED_WORK else None
        with _quiet(), pinned or contextlib.nullcontext():
            for start in range(0, n, block):
                rows = Bs[start : start + block]
                k = len(rows)
                D = normalized_minus(rows, self.config.normalize, A, diff[:k])
                if R is None:
                    Z = np.matmul(D, LT, out=image[:k])
                    out[start : start + k] = np.einsum("ij,ij->i", Z, Z)
                else:  # in place on D^T (Fortran order): Z^T = R D^T
                    ZT = dtrmm(1.0, R, D.T, side=0, lower=0, trans_a=0, diag=0, overwrite_b=1)
                    out[start : start + k] = np.einsum("ij,ij->j", ZT, ZT)
        return out

    def _factor(self) -> Array:
        """``R`` of ``L = QR`` (upper triangular, Fortran order for BLAS), cached until ``L``
        changes. Concurrent readers of an unchanging ``L`` may both compute it: harmless."""
        R = self._R
        if R is None:
            R = self._R = np.asfortranarray(np.linalg.qr(self._L, mode="r"))
        return R

    def transform(self, X: Any) -> Array:
        """``X L^T``: rows mapped into the learned space (Euclidean there = Eq. 1 here)."""
        with _quiet():
            out: Array = self._prepare(X, "X") @ self._L.T
        return out

    # -- the restricted distance (the BRM paper, service.core.brm) ---------------------------

    def _restricted_factor(self) -> Array:
        """``brm``: its own ``L``; any other metric: the canonical factor of ``M``,
        computed once per ``L`` (O(d^3))."""
        if self.config.algorithm == "brm":
            return self._L
        if self._canonical is None:
            self._canonical = canonical_factor(self._L)
        return self._canonical

    def restricted_squared_distances(self, a: Any, B: Any) -> Array:
        """``D_R^2(a, b_i)`` in [0, 1) for every row ``b_i`` of ``B`` (the BRM paper's Eq. 7,
        Sigmoid, ``p = 2``): ``(1/d) sum_j tanh(|z_j| / 2)^2`` with ``z = L_R (a - b_i)``,
        ``L_R`` the learner's own ``L`` for ``brm`` and the canonical factor of ``M`` otherwise.

        Never NaN: each difference is scaled by its largest entry before it is mapped, so a
        coordinate beyond float64 is ``inf`` and saturates (``R = 1``).
        """
        d = self.dim
        A = self._prepare(np.atleast_2d(check_vector(a, d, "a")), "a")
        return self._restricted(A, self._prepare(check_matrix(B, d, "b"), "b"))

    def restricted_squared_pairs(self, A: Any, B: Any) -> Array:
        """``D_R^2(a_i, b_i)`` for the row pairs of ``A`` and ``B`` (same shape)."""
        As = self._prepare(A, "A")
        Bs = self._prepare(B, "B")
        if As.shape != Bs.shape:
            raise ValueError(f"B: expected shape {As.shape} (as A), got {Bs.shape}")
        return self._restricted(As, Bs)

    def _restricted(self, A: Array, B: Array) -> Array:
        """``D_R^2`` of the rows of ``B`` against ``A`` (one row, or one per row of ``B``), in
        blocks of :data:`_QUERY_BLOCK` rows that stay in cache."""
        LT = self._restricted_factor().T
        out: Array = np.empty(len(B))
        with _quiet():
            for start in range(0, len(B), _QUERY_BLOCK):
                rows = slice(start, start + _QUERY_BLOCK)
                half = 0.5 * B[rows] - 0.5 * (A if len(A) == 1 else A[rows])  # never overflows
                top = np.abs(half).max(axis=1, keepdims=True)
                top[top == 0.0] = 1.0
                Z = np.abs(np.divide(half, top, out=half) @ LT)
                Z *= top  # finite or inf, never inf * 0
                Z *= 2.0
                out[rows] = restricted_squared_norms(Z)
        return out

    def restricted_squared_distance(self, a: Any, b: Any) -> float:
        """``D_R^2(a, b)`` in [0, 1) (see :meth:`restricted_squared_distances`)."""
        row = check_vector(b, self.dim, "b")[None, :]
        return float(self.restricted_squared_distances(a, row)[0])

    def restricted_distance(self, a: Any, b: Any) -> float:
        """``D_R(a, b)`` in [0, 1) (the BRM paper's Eq. 7; a saturated distance reads as the largest
        double below 1)."""
        return float(restricted_root(self.restricted_squared_distance(a, b)))


class MetricQueries:
    """The distance queries of :class:`MetricView`, for a class that can make the view of its
    current metric (:meth:`_metric_view`): the learner answers its queries with the same
    arithmetic as a snapshot.

    >>> class Fixed(MetricQueries):
    ...     def _metric_view(self) -> MetricView:
    ...         return MetricView(np.diag([2.0, 1.0]), LearnerConfig(dim=2, normalize="none"))
    >>> Fixed().squared_distance([1.0, 0.0], [0.0, 0.0])
    4.0
    """

    def _metric_view(self) -> MetricView:
        raise NotImplementedError

    def squared_distance(self, a: Any, b: Any) -> float:
        """``||L(a - b)||^2`` (Eq. 2)."""
        return self._metric_view().squared_distance(a, b)

    def distance(self, a: Any, b: Any) -> float:
        """``sqrt((a - b)^T M (a - b))`` with ``M = L^T L`` (Eq. 1)."""
        return self._metric_view().distance(a, b)

    def squared_distances(self, a: Any, B: Any) -> Array:
        """``||L(a - b_i)||^2`` for every row ``b_i`` of ``B`` (one to many;
        :meth:`MetricView.squared_distances`)."""
        return self._metric_view().squared_distances(a, B)

    def transform(self, X: Any) -> Array:
        """``X L^T``: rows mapped into the learned space (Euclidean there = Eq. 1 here)."""
        return self._metric_view().transform(X)

    def restricted_squared_distances(self, a: Any, B: Any) -> Array:
        """``D_R^2(a, b_i)`` in [0, 1) for every row ``b_i`` of ``B`` (the BRM paper's Eq. 7;
        :meth:`MetricView.restricted_squared_distances`)."""
        return self._metric_view().restricted_squared_distances(a, B)

    def restricted_squared_pairs(self, A: Any, B: Any) -> Array:
        """``D_R^2(a_i, b_i)`` for the row pairs of ``A`` and ``B`` (same shape)."""
        return self._metric_view().restricted_squared_pairs(A, B)

    def restricted_squared_distance(self, a: Any, b: Any) -> float:
        """``D_R^2(a, b)`` in [0, 1)."""
        return self._metric_view().restricted_squared_distance(a, b)

    def restricted_distance(self, a: Any, b: Any) -> float:
        """``D_R(a, b)`` in [0, 1) (the BRM paper's Eq. 7)."""
        return self._metric_view().restricted_distance(a, b)
