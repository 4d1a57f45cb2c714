"""The numerics of the certificates (docs/algorithms/certificates.md): binary relative entropy, its
inversions, Langford's binomial test-set bound and Maurer's ``xi``. Pure and vectorised (elementwise
over broadcast arguments); the inversions return the conservative end of their final bracket, so a
bound is never reported tighter than it is. :func:`hoeffding_upper` is a reference only, never
used for a certificate.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from service.core._validation import Array

#: Bisection tolerance of the kl and binomial inversions (docs/algorithms/certificates.md).
TOL = 1e-12
#: Most halvings: enough to reach any double from 1 (a lower inverse near 0 can be ~1e-300).
MAX_ITER = 1100


def kl(q: ArrayLike, p: ArrayLike) -> Array:
    """Binary relative entropy ``kl(q || p) = q ln(q/p) + (1-q) ln((1-q)/(1-p))``.

    ``0 ln 0 = 0``; ``+inf`` when ``p`` is 0 or 1 and ``q`` differs from it.

    >>> import math
    >>> float(kl(0.1, 0.1)), float(kl(0.0, 0.5)) == math.log(2), float(kl(0.5, 1.0))
    (0.0, True, inf)
    """
    q, p = np.asarray(q, dtype=np.float64), np.asarray(p, dtype=np.float64)
    out: Array = special.rel_entr(q, p) + special.rel_entr(1.0 - q, 1.0 - p)
    return out


def _check_kl_args(q: ArrayLike, c: ArrayLike) -> tuple[Array, Array]:
    qa, ca = np.broadcast_arrays(np.asarray(q, dtype=np.float64), np.asarray(c, dtype=np.float64))
    if not ((qa >= 0.0) & (qa <= 1.0)).all():
        raise ValueError("q: must lie in [0, 1]")
    if not (ca >= 0.0).all():  # NaN fails too
        raise ValueError("c: must be >= 0 (inf allowed)")
    return qa.astype(np.float64), ca.astype(np.float64)


def _bisect(
    q: Array,
    c: Array,
    lo: Array,
    hi: Array,
    done: NDArray[np.bool_],
    upper: bool,
    tol: float,
    max_iter: int,
) -> Array:
    """Shrink ``[lo, hi]`` around the end of ``{p : kl(q || p) <= c}`` on one side of ``q``;
    returns the outer end (``hi`` for the upper inverse, ``lo`` for the lower: conservative).

    It stops when the bracket is narrower than ``tol`` times the distance of the outer end to
    the nearest of 0 and 1 (so ``kl`` there exceeds ``c`` by at most ~``tol``, however steep it
    is), or when it cannot shrink (adjacent doubles), or after ``max_iter`` halvings.
    """
    shape = q.shape
    q, c, done = q.ravel(), c.ravel(), done.ravel()
    lo, hi = lo.astype(np.float64).ravel(), hi.astype(np.float64).ravel()  # copies
    idx = np.flatnonzero(~done)  # the elements still bisected (few after ~50 halvings)
    with np.errstate(divide="ignore"):
        for _ in range(max_iter):
            a, b = lo[idx], hi[idx]
            room = np.minimum(1.0 - b if upper else a, 1.0)
            mid = a + (b - a) / 2.0
            going = (b - a > tol * room) & (mid > a) & (mid < b)  # else: narrow, or stuck
            idx, a, b, mid = idx[going], a[going], b[going], mid[going]
            if not len(idx):
                break
            outside = kl(q[idx], mid) > c[idx]  # mid is beyond the answer
            shrink_hi = outside if upper else ~outside
            hi[idx] = np.where(shrink_hi, mid, b)
            lo[idx] = np.where(shrink_hi, a, mid)
    out: Array = (hi if upper else lo).reshape(shape)
    return out


def kl_inv_upper(q: ArrayLike, c: ArrayLike, tol: float = TOL, max_iter: int = MAX_ITER) -> Array:
    """``sup{p in [q, 1] : kl(q || p) <= c}``, elementwise (docs/algorithms/certificates.md).

    Bisection inside ``[q, min(q + sqrt(c/2), q + c + sqrt(c^2 + 2qc), 1)]`` (from ``kl >=
    2 (p-q)^2`` and ``kl >= (p-q)^2 / (2p)``), returning the upper end (conservative); ``q = 0``
    has the closed form ``1 - exp(-c)``, ``c = 0`` or ``q = 1`` give ``q``, ``c = inf`` 1.

    >>> import math
    >>> round(float(kl_inv_upper(0.1, math.log(200) / 1000)), 5)
    0.13368
    >>> float(kl_inv_upper(0.3, 0.0)), float(kl_inv_upper(0.3, math.inf))
    (0.3, 1.0)
    """
    qa, ca = _check_kl_args(q, c)
    with np.errstate(invalid="ignore", over="ignore"):
        hi = np.minimum.reduce(
            [qa + np.sqrt(ca / 2.0), qa + ca + np.sqrt(ca * ca + 2.0 * qa * ca), np.ones_like(qa)]
        )
    closed = (ca == 0.0) | (qa == 1.0) | (qa == 0.0) | np.isinf(ca)
    hi = np.where(np.isnan(hi) | np.isinf(ca), 1.0, hi)
    hi = np.where(qa == 0.0, -np.expm1(-ca), hi)
    hi = np.where((ca == 0.0) | (qa == 1.0), qa, hi)
    return _bisect(qa, ca, qa.copy(), hi, closed, True, tol, max_iter)


def kl_inv_lower(q: ArrayLike, c: ArrayLike, tol: float = TOL, max_iter: int = MAX_ITER) -> Array:
    """``inf{p in [0, q] : kl(q || p) <= c}``, elementwise; returns the lower end
    (conservative). Bracket ``[max(0, q - min(sqrt(c/2), sqrt(2qc))), q]`` (``kl >= 2 (p-q)^2``
    and ``kl >= (p-q)^2 / (2q)`` for ``p <= q``); ``q = 1`` has the closed form ``exp(-c)``.

    >>> float(kl_inv_lower(0.0, 0.3)), float(kl_inv_lower(0.3, 0.0)), float(kl_inv_lower(1, 1))
    (0.0, 0.3, 0.36787944117144233)
    >>> float(kl_inv_lower(0.5, 0.1)) < 0.5 < float(kl_inv_upper(0.5, 0.1))
    True
    """
    qa, ca = _check_kl_args(q, c)
    with np.errstate(invalid="ignore", over="ignore"):
        lo = np.maximum(0.0, qa - np.minimum(np.sqrt(ca / 2.0), np.sqrt(2.0 * qa * ca)))
    closed = (ca == 0.0) | (qa == 0.0) | (qa == 1.0) | np.isinf(ca)
    lo = np.where(np.isnan(lo) | np.isinf(ca), 0.0, lo)
    lo = np.where(qa == 1.0, np.exp(-ca), lo)
    lo = np.where((ca == 0.0) | (qa == 0.0), qa, lo)
    return _bisect(qa, ca, lo, qa.copy(), closed, False, tol, max_iter)


def _check_counts(m: ArrayLike, k: ArrayLike, delta: ArrayLike) -> tuple[Array, Array, Array]:
    ma, ka, da = np.broadcast_arrays(
        np.asarray(m, dtype=np.float64),
        np.asarray(k, dtype=np.float64),
        np.asarray(delta, dtype=np.float64),
    )
    if not ((ma >= 1) & (ma == np.floor(ma))).all():
        raise ValueError("m: must be a whole number >= 1")
    if not ((ka >= 0) & (ka <= ma) & (ka == np.floor(ka))).all():
        raise ValueError("k: must be a whole number in [0, m]")
    if not ((da > 0.0) & (da < 1.0)).all():
        raise ValueError("delta: must lie in (0, 1)")
    return ma.astype(np.float64), ka.astype(np.float64), da.astype(np.float64)


def bin_inv_upper(m: ArrayLike, k: ArrayLike, delta: ArrayLike) -> Array:
    """Langford's test-set bound ``max{p : P[Bin(m, p) <= k] >= delta}`` (one-sided
    Clopper-Pearson), elementwise (docs/algorithms/certificates.md).

    ``k = 0``: ``1 - delta^(1/m)``; ``k = m``: 1; else the inverse regularised incomplete beta
    function, checked with ``bdtr`` (``|P[Bin <= k] - delta| <= 1e-9 delta``); where the check
    fails, bisection on ``bdtr`` inside ``[k/m, kl_inv_upper(k/m, ln(1/delta)/m)]``, returning
    the upper end.

    >>> round(float(bin_inv_upper(1000, 50, 0.05)), 6)
    0.062863
    >>> float(bin_inv_upper(10, 10, 0.05))
    1.0
    """
    ma, ka, da = _check_counts(m, k, delta)
    inner = (ka > 0) & (ka < ma)
    out = np.where(ka >= ma, 1.0, -np.expm1(np.log(da) / ma))
    if not inner.any():
        return out
    mi, ki, di = ma[inner], ka[inner], da[inner]
    # P[Bin(m, p) <= k] = 1 - I_p(k + 1, m - k) = delta: the complementary inverse keeps its
    # precision for small delta (1 - delta would round).
    p: Array = np.asarray(special.betainccinv(ki + 1.0, mi - ki, di), dtype=np.float64)
    bad = ~(np.abs(_tail(ki, mi, p) - di) <= 1e-9 * di)
    if bad.any():
        p[bad] = _bin_inv_bisect(mi[bad], ki[bad], di[bad])
    out[inner] = p
    return out


def _tail(k: Array, m: Array, p: Array) -> Array:
    """``P[Bin(m, p) <= k]`` (``bdtr`` takes whole counts)."""
    out: Array = np.asarray(special.bdtr(k.astype(np.int64), m.astype(np.int64), p), np.float64)
    return out


def _bin_inv_bisect(m: Array, k: Array, delta: Array) -> Array:
    """Bisection on the (decreasing in p) binomial tail ``bdtr(k, m, p) = delta``."""
    lo: Array = k / m
    hi = kl_inv_upper(lo, np.log(1.0 / delta) / m)  # the Chernoff bound is above the exact one
    for _ in range(200):
        if not (hi - lo > TOL).any():
            break
        mid = lo + (hi - lo) / 2.0
        above = _tail(k, m, mid) > delta  # the tail is still above delta: p* > mid
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return hi


def hoeffding_upper(m: ArrayLike, k: ArrayLike, delta: ArrayLike) -> Array:
    """``k/m + sqrt(ln(1/delta) / (2m))``: Hoeffding's bound, for reference only (it is never
    tighter than :func:`kl_inv_upper`, and never used for a certificate).

    >>> round(float(hoeffding_upper(100, 0, 0.05)), 6)
    0.122387
    """
    ma, ka, da = _check_counts(m, k, delta)
    out: Array = ka / ma + np.sqrt(np.log(1.0 / da) / (2.0 * ma))
    return out


def xi(m: int) -> float:
    """Maurer's ``xi(m) = sum_j C(m, j) (j/m)^j (1 - j/m)^(m-j)``, exactly (log-sum-exp);
    ``sqrt(m) <= xi(m) <= 2 sqrt(m)``. It enters the PAC-Bayes-kl bound as ``ln(xi(m)/delta)``.

    >>> xi(1), round(xi(8), 5), round(xi(1000), 5)
    (2.0, 4.24502, 40.30321)
    """
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise ValueError(f"m: must be an integer >= 1, got {m!r}")
    j = np.arange(m + 1, dtype=np.float64)
    terms = (
        special.gammaln(m + 1.0)
        - special.gammaln(j + 1.0)
        - special.gammaln(m - j + 1.0)
        + special.xlogy(j, j / m)
        + special.xlogy(m - j, 1.0 - j / m)
    )
    return float(np.exp(special.logsumexp(terms)))
