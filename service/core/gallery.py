"""Identification (1:N): a gallery kept transformed, ``Z = G L^T``, and its exact top-k search.

Ranking the gallery rows ``g_i`` by ``||L(q - g_i)||^2`` (Eq. 2) from scratch maps every
difference by ``L``: O(n d^2) per query. With the gallery kept transformed, ``z_i = L g_i``, a
query maps itself once (O(d^2)) and ranks the expanded square
``||z_i||^2 - 2 z_i . L q + ||L q||^2``: one matrix-vector product over ``Z``, O(n d).

Keeping ``Z`` up to date (:meth:`TransformedGallery.refreshed`)
---------------------------------------------------------------
* **full**: ``Z = G L^T``, one matrix product, O(n d^2), taken in float32 from float32 copies
  of ``G`` (kept beside it) and ``L``: half the cost of the float64 product (10,000 x 128 on
  one thread: 3.1 against 7.2 ms) and half the memory for ``Z``. Its rounding (operands
  rounded to float32, a d-term float32 dot product per entry, underflow included:
  :func:`_f32_product_err`) is carried in the error bound below, ~1.6e-5 ``||L||_F`` per unit
  of ``||g_i||`` at d = 128; the bound stage reads ``Z`` in float32 anyway (below), so the
  answers are unchanged. Past :data:`F32_SAFE` (rows or ``L`` too large for float32's range)
  the product is float64;
* **incremental**: every learner step changes ``L`` by a rank-two correction
  ``p u^T + q v^T`` (Eq. 16; rank one for a COPML pair step, Eq. 20), so between two versions
  ``L' - L`` has rank at most ``r`` = 2 x (triplet steps) + (pair steps), known from the step
  counts. It is factorised as ``Q B`` (``Q`` d x r' orthonormal, by a randomised range finder
  with ``r' = r + OVERSAMPLE`` columns, O(d^2 r')), and ``Z' = Z + (G B^T) Q^T`` in float64:
  O(n d r') instead of O(n d^2), in one compiled pass over the rows (:func:`_low_rank_update`).
  The factorisation's residual ``||L' - L - Q B||_F`` is measured and carried in the error
  bound below, so nothing is assumed about it; past :func:`max_relative_err` (twice the
  float32 product's bound) the refresh is full instead.

The incremental form is taken when ``32 r' <= d`` and the gallery has more than ``d`` rows,
else the full one (:func:`refresh_method`). The float32 product runs at BLAS speed and the
incremental pass is bound by memory traffic (three n x d streams), so the incremental form
pays only for small changes of large matrices (``benchmarks/results/identify.md`` has both
costs by ``d``, ``n`` and ``r'``). At d = 128 that is one triplet step per refresh: a learner
publishing batches of hundreds of steps (20,000 samples/s) gets full refreshes; the
incremental form is for the slow stream of a step or a few per version at larger d.

Exact answers (:meth:`TransformedGallery.nearest`)
--------------------------------------------------
``Z`` held incrementally and the expanded square are not the arithmetic of the brute force, so
taken alone they could swap two nearly tied rows. The search therefore has two stages:

1. **bounds** -- every rounding and drift error is bounded with the standard floating-point
   bounds (``gamma_n = n u / (1 - n u)``, ``u = 2^-53``; Higham, *Accuracy and Stability of
   Numerical Algorithms*, Ch. 3), times a safety factor of 2:
   ``||z_i - L g_i|| <= err ||g_i|| + err_abs`` for the stored rows (tracked through
   refreshes; ``err_abs`` is float32's underflow), the query's own image, the
   expanded square, and the brute force's own rounding. Together, with the largest row norms of
   the view, they give ``delta``: every row's brute-force value is within ``delta`` of its
   expanded square ``e_i``. A row among the k smallest brute-force values therefore has
   ``e_i <= (k-th smallest e) + 2 delta``;
2. **exact** -- every such row is recomputed as the brute force does it (``q - g_i``, mapped
   by ``L``, squared and summed; a compiled loop that gives equal rows equal values).

The rows returned hold every row whose brute-force value is at most the k-th smallest one
(ties included), so sorting them by (value, id) is exactly the brute force's top k with ties
by id.

The bound stage's one pass over ``Z`` (the matrix-vector product, bound by memory traffic)
reads ``Z`` in float32, half the bytes (the values themselves after a full refresh, else a
float32 copy kept beside the float64 values): the products ``z_i . L q`` are
taken in float32 and their rounding (operands rounded to float32, a d-term float32 dot
product, underflow included: :func:`_f32_dot_error`) is added to ``delta``. That widens the
window to ~1e-5 of the squared distances at d = 128 (from ~1e-13): the second stage still
recomputes k rows plus the rare near-tie, and the answer is unchanged. Past
:data:`F32_SAFE` (rows or queries too large for float32's range) the product is float64.

Rows are stored in blocks with spare capacity: enrolling appends rows in place (rows an older
view reads never change), deleting marks a row dead (``alive``), :meth:`compacted` drops dead
rows. Nothing here is thread-safe: one writer makes new views; any number of readers may use
views already made, from any thread.

>>> L = np.diag([2.0, 1.0])
>>> gallery, first = TransformedGallery.empty(L).with_rows(np.array([[0.0, 0.0], [1.0, 0.0],
...                                                                  [0.0, 1.0]]))
>>> rows, values = gallery.nearest(np.array([[0.9, 0.0]]), k=2)[0]
>>> [(int(r), round(float(v), 6)) for r, v in sorted(zip(rows, values), key=lambda t: t[1])]
[(1, 0.04), (0, 3.24)]
>>> gallery, method = gallery.refreshed(np.eye(2), rank=None)
>>> method, gallery.size
('full', 3)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

from service.core._threads import PINNED_WORK, blas
from service.core._validation import Array

#: Unit roundoff of float64.
U = 2.0**-53
#: Unit roundoff of float32, and half its smallest subnormal (the absolute error of a value
#: rounded to float32 in the underflow range).
U32 = 2.0**-24
ETA32 = 2.0**-150
#: The float32 bound stage is used while the largest row image and the query's are below this
#: (their products and sums then stay far inside float32's range, ~3.4e38).
F32_SAFE = 1e18
#: Every error bound is multiplied by this (room for the bounds' own rounding).
SAFETY = 2.0
#: Extra columns of the range finder beyond the rank bound (robustness to rounding noise).
OVERSAMPLE = 2
#: Distances computed per block of the bound stage (``n`` rows x queries), about 8 MB.
_BLOCK_VALUES = 1 << 20
#: A new block's capacity is at least this many rows (then doubling).
_MIN_CAPACITY = 64

Bools = NDArray[np.bool_]
Ints = NDArray[np.int64]


def _gamma(n: int, u: float = U) -> float:
    """``gamma_n = n u / (1 - n u)``: the relative error bound of an n-term dot product."""
    return n * u / (1.0 - n * u)


def _f32_dot_error(d: int, z_norm: Any, q_norm: Any) -> Any:
    """A bound on ``|z . q - fl32(fl32(z) . fl32(q))|`` for d-vectors of norms at most
    ``z_norm`` and ``q_norm`` (floats or arrays; below :data:`F32_SAFE`).

    Each operand rounds to float32 with ``|z~_j - z_j| <= U32 |z_j| + ETA32`` (ETA32 in the
    underflow range), and the float32 dot product of the rounded operands errs by at most
    ``gamma_d sum |z~_j q~_j|`` (float32's ``gamma``) plus ``ETA32`` per product or sum that
    underflows. With ``sum |z_j q_j| <= ||z|| ||q||`` and ``sum |z_j| <= sqrt(d) ||z||``
    (Cauchy-Schwarz) that is at most ``(2 U32 + U32^2 + gamma_d (1 + U32)^2) ||z|| ||q||``
    plus ``ETA32 (2 sqrt(d) (||z|| + ||q||) + 3 d)`` (generously: every cross term of order
    ``ETA32 U32`` or ``ETA32^2`` is folded in).
    """
    absolute = ETA32 * (2.0 * math.sqrt(d) * (z_norm + q_norm) + 3.0 * d)
    return _f32_relative(d) * z_norm * q_norm + absolute


def _f32_relative(d: int) -> float:
    """The relative part of :func:`_f32_dot_error`: ``2 U32 + U32^2 + gamma_d (1 + U32)^2``."""
    return 2.0 * U32 + U32 * U32 + _gamma(d, U32) * (1.0 + U32) ** 2


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _brute_force(G: Array, rows: Any, q: Array, L: Array, out: Array) -> None:
    """``out[c] = ||L (q - G[rows[c]])||^2`` (Eq. 2), the textbook way.

    One compiled loop with a fixed operation order for a given ``d`` (reassociation only lets
    the compiler use SIMD; the difference is copied to one buffer first), so equal rows get
    bit-equal values and ties are real ties.
    """
    d = q.shape[0]
    diff = np.empty(d)
    for c in range(rows.shape[0]):
        g = G[rows[c]]
        for j in range(d):
            diff[j] = q[j] - g[j]
        total = 0.0
        for i in range(d):
            Li = L[i]
            s = 0.0
            for j in range(d):
                s += Li[j] * diff[j]
            total += s * s
        out[c] = total


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _low_rank_update(
    G: Array, Z: Any, B: Array, QT: Array, out: Array, squares: Array, norms: Array
) -> None:
    """``out = Z + (G B^T) Q^T`` row by row, with each new row's squared norm and norm
    (``Z`` in float64 or float32, ``out`` in float64).

    One pass over the rows (read ``g_i`` and ``z_i``, write ``z'_i``): the products' operands
    ``B`` and ``Q^T`` (r' x d each) stay in cache, so the update costs the memory traffic of
    three n x d streams and 4 n d r' flops, without the temporaries and extra passes of the
    same arithmetic written as matrix products.
    """
    r = B.shape[0]
    d = G.shape[1]
    w = np.empty(r)
    for i in range(G.shape[0]):
        g, z, o = G[i], Z[i], out[i]
        for a in range(r):  # w = B g_i
            Ba = B[a]
            s = 0.0
            for j in range(d):
                s += Ba[j] * g[j]
            w[a] = s
        for j in range(d):
            o[j] = z[j]
        for a in range(r):  # z'_i = z_i + Q w
            wa, Qa = w[a], QT[a]
            for j in range(d):
                o[j] += wa * Qa[j]
        total = 0.0
        for j in range(d):
            total += o[j] * o[j]
        squares[i] = total
        norms[i] = math.sqrt(total)


@njit(cache=True, nogil=True)
def _measure32(rows32: Any, squares: Array, norms: Array) -> None:
    """The squared norms and norms of float32 rows, summed in float64."""
    for i in range(rows32.shape[0]):
        row = rows32[i]
        total = 0.0
        for j in range(row.shape[0]):
            v = np.float64(row[j])
            total += v * v
        squares[i] = total
        norms[i] = math.sqrt(total)


def warm_up() -> None:
    """Compile (or load from numba's cache) the compiled loops before they are needed."""
    out = np.empty(1)
    _brute_force(np.zeros((1, 2)), np.zeros(1, dtype=np.int64), np.ones(2), np.eye(2), out)
    rows = np.zeros((1, 2))
    _low_rank_update(rows, rows, np.eye(2), np.eye(2), np.empty((1, 2)), out, np.empty(1))
    rows32 = rows.astype(np.float32)
    _low_rank_update(rows, rows32, np.eye(2), np.eye(2), np.empty((1, 2)), out, np.empty(1))
    _measure32(rows32, out, np.empty(1))


def brute_force(G: Array, rows: Ints, q: Array, L: Array) -> Array:
    """``||L (q - G[r])||^2`` for each row index ``r`` of ``rows`` (see :func:`_brute_force`).

    >>> brute_force(np.array([[1.0, 1.0]]), np.array([0]), np.zeros(2), np.eye(2)).tolist()
    [2.0]
    """
    out = np.empty(len(rows))
    _brute_force(G, np.ascontiguousarray(rows, dtype=np.int64), np.ascontiguousarray(q),
                 np.ascontiguousarray(L), out)  # fmt: skip
    return out


def _one_blas_thread(work: int) -> contextlib.AbstractContextManager[Any]:
    """BLAS on one thread for ``work`` multiply-adds and more (as the learner's queries: a
    second thread loses more than it gains on a busy 2-core machine)."""
    if work >= PINNED_WORK:
        pinned: contextlib.AbstractContextManager[Any] = blas().limit(limits=1, user_api="blas")
        return pinned
    return contextlib.nullcontext()


def refresh_method(rank: int | None, n: int, d: int) -> str:
    """``"incremental"`` or ``"full"`` for a change of ``L`` of rank at most ``rank`` (None:
    unknown) over ``n`` rows of dimension ``d`` (see the module docstring).

    >>> refresh_method(2, 10_000, 128), refresh_method(4, 10_000, 128), refresh_method(2, 50, 128)
    ('incremental', 'full', 'full')
    """
    if rank is None or n <= d:
        return "full"
    return "incremental" if 32 * (rank + OVERSAMPLE) <= d else "full"


@dataclass
class _Block:
    """Rows with spare capacity and per-row norms; rows ``[0, used)`` are written and never
    change again (views made earlier read them while later rows are appended).

    Every block keeps its rows in float32 (``rows32``: the bound stage's operand for ``Z``,
    the float32 product's operand for ``G``; see ``nearest`` and ``refreshed``). ``rows``
    holds them in float64 too, except in a ``Z`` block made by the float32 product (None):
    its rows *are* the float32 values, and their norms are those of the float32 values.
    """

    rows: Array | None  # (capacity, d) float64, or None (a Z block held in float32 only)
    norms: Array  # (capacity,) ||row||
    squares: Array  # (capacity,) ||row||^2
    used: int
    rows32: NDArray[np.float32]  # (capacity, d)

    @classmethod
    def empty(cls, capacity: int, d: int, used: int = 0, f64: bool = True) -> _Block:
        rows = np.empty((capacity, d)) if f64 else None
        rows32 = np.empty((capacity, d), dtype=np.float32)
        return cls(rows, np.empty(capacity), np.empty(capacity), used, rows32)

    @classmethod
    def of(cls, rows: Array, capacity: int) -> _Block:
        block = cls.empty(capacity, rows.shape[1])
        block.put(rows)
        return block

    @property
    def capacity(self) -> int:
        return len(self.rows32)

    def f64(self, stop: int) -> Array:
        """Rows ``[0, stop)`` in float64 (a converted copy when held in float32 only)."""
        if self.rows is not None:
            return self.rows[:stop]
        return self.rows32[:stop].astype(np.float64)

    def taken(self, index: Any, capacity: int) -> _Block:
        """A new block holding rows ``index`` (a slice or indices) of this one, as held."""
        norms = self.norms[index]
        m = len(norms)
        block = _Block.empty(capacity, self.rows32.shape[1], m, f64=self.rows is not None)
        if self.rows is not None and block.rows is not None:
            block.rows[:m] = self.rows[index]
        block.rows32[:m] = self.rows32[index]
        block.norms[:m] = norms
        block.squares[:m] = self.squares[index]
        return block

    def put(self, rows: Array) -> None:
        """Write ``rows`` after the used ones (capacity must allow it); a block held in
        float32 only stores them rounded to float32 (``fits32`` must hold for them)."""
        start, stop = self.used, self.used + len(rows)
        if self.rows is not None:
            self.rows[start:stop] = rows
            self.measure(start, stop)
        else:
            self.rows32[start:stop] = rows
            _measure32(self.rows32[start:stop], self.squares[start:stop], self.norms[start:stop])
        self.used = stop

    def measure(self, start: int, stop: int, squares: bool = True) -> None:
        """The norms (and, with ``squares``, the squared norms) and float32 copies of the
        float64 rows ``[start, stop)`` as written."""
        assert self.rows is not None
        part = self.rows[start:stop]
        if squares:
            np.einsum("ij,ij->i", part, part, out=self.squares[start:stop])
            np.sqrt(self.squares[start:stop], out=self.norms[start:stop])
        with np.errstate(over="ignore"):  # a row past float32's range: never read (nearest)
            self.rows32[start:stop] = part

    @classmethod
    def product(cls, G: _Block, n: int, L: Array, capacity: int, f32: bool) -> _Block:
        """A ``Z`` block holding the rows of ``G L^T`` (into its own memory, no temporary):
        in float32 from the float32 copies of both (``f32``, half the cost), or in float64."""
        block = cls.empty(capacity, L.shape[0], n, f64=not f32)
        if block.rows is None:
            np.matmul(G.rows32[:n], L.T.astype(np.float32), out=block.rows32[:n])
            _measure32(block.rows32[:n], block.squares[:n], block.norms[:n])
        else:
            np.matmul(G.f64(n), L.T, out=block.rows[:n])
            block.measure(0, n)
        return block


@dataclass(frozen=True)
class TransformedGallery:
    """An immutable view of a gallery: normalised rows ``G`` (``[0, n)`` of ``_g``), their
    images ``Z`` under ``L`` (``[0, n)`` of ``_z``), which rows are ``alive``, and ``err``,
    ``err_abs``: ``||z_i - L g_i|| <= err ||g_i|| + err_abs`` for every row (see the module
    docstring; ``err_abs`` bounds float32's underflow, zero for a view made in float64).

    >>> view, first = TransformedGallery.empty(np.diag([2.0, 1.0])).with_rows(np.eye(2))
    >>> first, view.size, view.Z.tolist()
    (0, 2, [[2.0, 0.0], [0.0, 1.0]])
    >>> view.without(np.array([0])).size, view.size   # a new view; this one is unchanged
    (1, 2)
    """

    _g: _Block
    _z: _Block
    n: int
    alive: Bools
    L: Array
    err: float
    err_abs: float = 0.0

    # -- making views ----------------------------------------------------------------------

    @classmethod
    def empty(cls, L: Array) -> TransformedGallery:
        """No rows, under ``L``."""
        d = L.shape[0]
        L = _frozen(np.array(L, dtype=np.float64))
        block = _Block.of(np.empty((0, d)), _MIN_CAPACITY)
        return cls(block, _Block.of(np.empty((0, d)), _MIN_CAPACITY), 0,
                   np.zeros(0, dtype=bool), L, 0.0)  # fmt: skip

    @property
    def dim(self) -> int:
        return int(self.L.shape[0])

    @cached_property
    def size(self) -> int:
        """Rows alive."""
        return int(np.count_nonzero(self.alive))

    @property
    def G(self) -> Array:
        """The normalised rows (read-only view; dead rows included)."""
        return _frozen(self._g.f64(self.n))

    @property
    def Z(self) -> Array:
        """Their images ``G L^T`` as held, in float64 (read-only; dead rows included)."""
        return _frozen(self._z.f64(self.n))

    def with_rows(self, rows: Array) -> tuple[TransformedGallery, int]:
        """The view with ``rows`` (normalised, finite) appended, and the index of the first.

        In place when this is the latest view of its blocks and they have room (an older
        view never reads past its own ``n``); else the blocks are copied with doubled room.
        """
        m = len(rows)
        n = self.n
        with _one_blas_thread(m * self.dim**2):
            Z_new = rows @ self.L.T
        g, z = self._g, self._z
        err = max(self.err, _full_err(self.L))  # new rows carry the rounding of one product
        err_abs = self.err_abs
        if z.rows is None:  # Z held in float32 only: the new images are rounded to float32,
            if _fits32(float(np.linalg.norm(Z_new, axis=1).max(initial=0.0)), self.dim):
                f32, f32_abs = _f32_product_err(self.L)  # which is within this bound
                err, err_abs = max(err, f32), max(err_abs, f32_abs)
            else:  # or, past float32's range, Z is held in float64 from here on
                z = _Block.of(z.f64(n), max(_MIN_CAPACITY, 2 * (n + m)))
        if g.used != n or z.used != n or g.capacity < n + m or z.capacity < n + m:
            capacity = max(_MIN_CAPACITY, 2 * (n + m))
            g = g.taken(slice(0, n), capacity)
            z = z.taken(slice(0, n), capacity)
        g.put(rows)
        z.put(Z_new)
        alive = np.concatenate([self.alive, np.ones(m, dtype=bool)])
        view = replace(self, _g=g, _z=z, n=n + m, alive=alive, err=err, err_abs=err_abs)
        return view, n

    def without(self, rows: Ints) -> TransformedGallery:
        """The view with ``rows`` dead (they stay in memory until :meth:`compacted`)."""
        alive = self.alive.copy()
        alive[rows] = False
        return replace(self, alive=alive)

    def compacted(self) -> tuple[TransformedGallery, Ints]:
        """The view holding only the alive rows, and their indices in this one (new rows
        ``i`` is old row ``kept[i]``)."""
        kept = np.flatnonzero(self.alive)
        capacity = max(_MIN_CAPACITY, 2 * len(kept))
        g = self._g.taken(kept, capacity)
        z = self._z.taken(kept, capacity)
        return replace(self, _g=g, _z=z, n=len(kept), alive=np.ones(len(kept), dtype=bool)), kept

    def refreshed(self, L: Array, rank: int | None) -> tuple[TransformedGallery, str]:
        """The view under a new ``L`` and how it was made: ``"unchanged"`` (``L`` is
        bit-identical), ``"incremental"`` or ``"full"`` (:func:`refresh_method`; ``rank``
        bounds the rank of the change, None: unknown). Runs the products on one BLAS thread."""
        L = _frozen(np.array(L, dtype=np.float64))
        if self.n == 0:  # no row to transform: no product, no rounding (err is vacuous)
            return replace(self, L=L, err=0.0, err_abs=0.0), "full"
        if np.array_equal(L, self.L):
            return replace(self, L=L), "unchanged"
        n, d = self.n, self.dim
        method = refresh_method(rank, n, d)
        with _one_blas_thread(PINNED_WORK):
            if method == "incremental":
                assert rank is not None
                view = self._incremental(L, rank)
                if view is not None:
                    return view, method
            l_norm = float(np.linalg.norm(L))
            f32 = _fits32(self._scales[1] * l_norm, d) and _fits32(max(self._scales[1], l_norm), d)
            z = _Block.product(self._g, n, L, max(_MIN_CAPACITY, self._g.capacity), f32)
        err, err_abs = _f32_product_err(L) if f32 else (_full_err(L), 0.0)
        return replace(self, _z=z, L=L, err=err, err_abs=err_abs), "full"

    def _incremental(self, L: Array, rank: int) -> TransformedGallery | None:
        """``Z + (G B^T) Q^T`` with ``L - self.L ~ Q B``; None when the bound would grow past
        :func:`max_relative_err` (then a full refresh)."""
        n, d = self.n, self.dim
        Q, B, residual = difference_factors(self.L, L, rank)
        r = Q.shape[1]
        l_norm = float(np.linalg.norm(L))
        b_norm = float(np.linalg.norm(B))
        # Rounding of w = B g (a d-term dot per entry) and of z + Q w (r + 1 terms per entry;
        # ||Q||_F = sqrt r, |z'| <= (||L||_F + err) ||g||), per unit of ||g||.
        # z'_j = z_j + sum_a w_a Q_ja: r + 1 terms (gamma_{r+1}, relative to |z| + |Q||w|).
        rounding = b_norm * (_gamma(d) + _gamma(r + 1) * math.sqrt(r)) + _gamma(r + 1) * (
            l_norm + self.err
        )
        err = self.err + residual + SAFETY * rounding
        if err > max_relative_err(d) * l_norm:
            return None
        err_abs = self.err_abs * (1.0 + SAFETY * _gamma(r + 1))  # |z| <= ... ||g|| + err_abs
        base = self._z.rows if self._z.rows is not None else self._z.rows32
        z = _Block.empty(self._z.capacity, d, n)
        assert z.rows is not None
        _low_rank_update(self._g.f64(n), base[:n], B, np.ascontiguousarray(Q.T),
                         z.rows[:n], z.squares[:n], z.norms[:n])  # fmt: skip
        z.measure(0, n, squares=False)  # the float32 copies
        return replace(self, _z=z, L=L, err=err, err_abs=err_abs)

    # -- searching -------------------------------------------------------------------------

    @cached_property
    def _scales(self) -> tuple[float, float, float]:
        """``||L||_F``, the largest ``||g_i||`` and the largest ``||z_i||`` (once per view)."""
        n = self.n
        g_max = float(self._g.norms[:n].max()) if n else 0.0
        z_max = float(self._z.norms[:n].max()) if n else 0.0
        return float(np.linalg.norm(self.L)), g_max, z_max

    def nearest(self, Q: Array, k: int) -> list[tuple[Ints, Array]]:
        """For each (normalised) query row, the rows that can be among its ``k`` nearest by
        the brute force, with their brute-force values ``||L(q - g)||^2`` (Eq. 2).

        Every alive row whose brute-force value is at most the k-th smallest is returned
        (see the module docstring), so sorting the answer by (value, id) and keeping ``k`` is
        the brute force's top k. Needs ``1 <= k <= size``. A value that overflows float64 is
        ``inf`` (or NaN), never a wrong ranking. Runs BLAS on one thread (on a busy machine a
        second one costs far more than it gains on a product this small).

        The bound stage: with ``e_i`` the expanded square of row i, every row's brute-force
        value lies within ``delta`` of ``e_i`` (``delta`` from the largest row norms, so a few
        passes over the rows suffice); a row within the k smallest brute-force values then has
        ``e_i <= (k-th smallest e) + 2 delta``, and those rows are recomputed exactly.
        """
        if not 1 <= k <= self.size:
            raise ValueError(f"k: must be between 1 and the {self.size} rows, got {k}")
        n, d = self.n, self.dim
        L = self.L
        l_norm, g_max, z_max = self._scales
        dead = None if self.size == n else ~self.alive
        # Per unit of ||q|| + ||g||: the rounding of the brute force's own value (q - g, then
        # a d-term dot product per entry; the square sum adds its share relative to the value).
        brute = SAFETY * 2.0 * _gamma(d + 1) * l_norm
        # ||z_i - L g_i|| <= err ||g_i||, and the query's image rounds like one row of G L^T.
        row_slack = (self.err + brute) * g_max + self.err_abs
        query_slack = SAFETY * _gamma(d) * l_norm + brute
        grow = 1.0 + 2.0 * SAFETY * _gamma(d + 3)  # computed norms vs exact ones
        out: list[tuple[Ints, Array]] = []
        step = max(1, _BLOCK_VALUES // max(n, 1))
        # The bound stage's product in float32 while the scale allows (half the memory traffic
        # of float64 over Z, which dominates a query), its rounding bounded and added to delta.
        z32 = self._z.rows32 if z_max * grow < F32_SAFE else None
        G = self._g.f64(n)
        with np.errstate(over="ignore", invalid="ignore"), blas().limit(limits=1, user_api="blas"):
            ZQ = Q @ L.T
            for start in range(0, len(Q), step):
                zq = ZQ[start : start + step]  # (m, d)
                zq_norms = np.sqrt(np.einsum("ij,ij->i", zq, zq))
                block = Q[start : start + step]
                q_norms = np.sqrt(np.einsum("ij,ij->i", block, block))
                # e = ||z_i||^2 - 2 z_i . zq + ||zq||^2, as (n, m)
                if z32 is not None and float(zq_norms.max(initial=0.0)) * grow < F32_SAFE:
                    e = (z32[:n] @ zq.astype(np.float32).T).astype(np.float64)
                    dot_err = 2.0 * _f32_dot_error(d, z_max * grow, zq_norms * grow)
                else:
                    e = self._z.f64(n) @ zq.T
                    dot_err = 0.0
                e *= -2.0
                e += self._z.squares[:n, None]
                e += (zq_norms**2)[None, :]
                if dead is not None:
                    e[dead] = np.inf
                reach = (z_max + zq_norms) * grow  # >= every distance ||zq - z_i||, sqrt(e + eta)
                eta = SAFETY * _gamma(d + 3) * reach**2  # the expanded square's rounding
                slack = row_slack + query_slack * q_norms
                delta = eta + SAFETY * dot_err + 2.0 * slack * reach + slack**2
                kth = np.partition(e, k - 1, axis=0)[k - 1]
                for j in range(zq.shape[0]):
                    limit = kth[j] + 2.0 * delta[j]
                    if math.isfinite(limit):
                        rows = np.flatnonzero(e[:, j] <= limit)
                    else:  # an overflow: the exact stage decides over every alive row
                        rows = np.flatnonzero(self.alive)
                    out.append((rows, brute_force(G, rows, block[j], L)))
        return out


def difference_factors(L_old: Array, L_new: Array, rank: int) -> tuple[Array, Array, float]:
    """``(Q, B, bound)`` with ``L_new - L_old ~ Q B``, ``Q`` (d, r') orthonormal columns,
    ``B`` (r', d), and ``bound >= ||L_new - L_old - Q B||_F`` (measured, plus its rounding).

    A randomised range finder (Halko, Martinsson, Tropp 2011, Alg. 4.1) with ``r' = rank +
    OVERSAMPLE`` columns (at most d) and a fixed seed: for a difference of rank <= ``rank``
    (the learner's steps, Eqs. 16, 20) the residual is rounding noise.

    >>> L0 = np.eye(4); L1 = L0 + np.outer([1.0, 2, 0, 0], [0, 1.0, 0, 1])
    >>> Q, B, bound = difference_factors(L0, L1, 1)
    >>> Q.shape, bool(np.allclose(L1 - L0, Q @ B)), bound < 1e-12
    ((4, 3), True, True)
    """
    d = L_old.shape[0]
    r = min(rank + OVERSAMPLE, d)
    delta = L_new - L_old
    omega = np.random.default_rng(0).standard_normal((d, r))
    Q, _ = np.linalg.qr(delta @ omega)
    B = Q.T @ delta
    residual = float(np.linalg.norm(delta - Q @ B))
    # the subtraction L_new - L_old (u relative) and the product Q B (r terms) round too
    noise = U * float(np.linalg.norm(delta)) + _gamma(r) * math.sqrt(r) * float(np.linalg.norm(B))
    return Q, B, residual + SAFETY * noise


def _fits32(scale: float, d: int) -> bool:
    """Whether values of size up to ``scale`` (a product's bound, as computed) are safe to
    take in float32 (below :data:`F32_SAFE`, the rounding of the bound included)."""
    return scale * (1.0 + 2.0 * SAFETY * _gamma(d + 3)) < F32_SAFE


def _f32_product_err(L: Array) -> tuple[float, float]:
    """``(err, err_abs)`` right after ``Z = fl32(fl32(G) fl32(L)^T)`` (rows and ``L`` within
    :func:`_fits32`): each entry ``z_ij = L_j . g_i`` errs by at most
    :func:`_f32_dot_error` ``(d, ||L_j||, ||g_i||)``; the norm over ``j`` of those bounds
    (triangle inequality; ``sum_j ||L_j||^2 = ||L||_F^2``) is at most
    ``rel ||L||_F ||g_i|| + ETA32 (2 d ||g_i|| + 2 sqrt(d) ||L||_F + 3 d^1.5)``.

    It also covers a float64 image rounded to float32 afterwards (``U32 |z| + ETA32`` per
    entry on top of ``gamma_d ||L||_F``), what an enrol into a float32 view stores.
    """
    d = L.shape[0]
    l_norm = float(np.linalg.norm(L))
    err = SAFETY * (_f32_relative(d) * l_norm + 2.0 * d * ETA32)
    err_abs = SAFETY * ETA32 * (2.0 * math.sqrt(d) * l_norm + 3.0 * d**1.5)
    return err, err_abs


def max_relative_err(d: int) -> float:
    """Past ``err = max_relative_err(d) ||L||_F`` an incremental refresh is refused (a full
    one follows): twice the float32 product's own bound, so increments may follow a float32
    refresh, and a factorisation that missed part of the change (its measured residual in
    ``err``) is never carried."""
    return 2.0 * SAFETY * _f32_relative(d)


def _full_err(L: Array) -> float:
    """``err`` right after ``Z = G L^T``: a d-term dot per entry, ``gamma_d ||L||_F``."""
    return SAFETY * _gamma(L.shape[0]) * float(np.linalg.norm(L))


def _frozen(a: Array) -> Array:
    view = a.view()
    view.flags.writeable = False
    return view
