"""Tool B: the PAC-Bayes-kl certificate of the Gibbs metric around ``L``
(docs/algorithms/certificates.md).

No samples are held out: the prior is centred at ``L`` frozen after a prefix of the training
stream, the posterior is an isotropic Gaussian around the current (Frobenius-normalised) ``L``,
and the Gibbs risk on post-prefix training samples is computed exactly (:func:`gibbs_triplet_error`,
:func:`gibbs_accept`: one quadrature or one non-central chi-square cdf per tuple, no
Monte-Carlo). This certifies the *randomised* metric, not the served one; the answer says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import special

from service.core._validation import Array, check_metric, check_threshold
from service.core.certificates import (
    CLASS_MIX,
    QUANTITIES,
    Bound,
    Certificate,
    NotEnoughHeldOut,
    check_certificate_args,
    check_metric_and_samples,
    summary,
)
from service.core.certificates.bounds import kl_inv_upper, xi
from service.core.certificates.tuples import MIN_TUPLES, build_tuples, check_enough, tuple_rng

#: Posterior scales, relative to the unit Frobenius norm of the normalised metric and divided
#: by ``d`` (docs/algorithms/certificates.md): fixed in advance, the confidence is split over them.
SIGMA_GRID = np.geomspace(1e-3, 1.0, 10)

#: Normalised thresholds ``2^(k/8)``, ``|k| <= 384`` (ratio 1.09, from 3.6e-15 to 2.8e14), fixed
#: in advance. The served threshold and ``||L||_F`` depend on the training stream, bound set
#: included, so a PAC-Bayes bound at ``theta / ||L||_F^2`` itself would not be valid; the false
#: accept rate is certified at the grid threshold just above it and the false reject rate at
#: the one just below (the Gibbs rates are monotone in the threshold, so these bound the rates
#: at ``theta``), with the grid in the union bound (``ln G = 6.6``).
THRESHOLD_GRID = np.exp2(np.arange(-384, 385) / 8.0)

#: Gauss-Legendre nodes of the 1-D quadrature of a triplet's exact Gibbs error.
QUADRATURE_NODES = 64

#: Added to every empirical Gibbs risk before the kl inversion: the quadrature error (below
#: 2e-11 against adaptive quadrature across the parameter range; tests/core/
#: test_certificates.py) and the screening slack, rounded up. Conservative.
GIBBS_TOLERANCE = 1e-9

#: Tuples far from the decision boundary (relative to the posterior noise) are settled by a
#: Gaussian tail bound instead of the quadrature; each is then counted as an error with
#: probability SCREEN_EPS more than it can be (or as a sure error).
SCREEN_EPS = 1e-12
#: ``P[||g|| >= sqrt(d) + r] <= exp(-r^2 / 2)`` for a standard normal g in R^d (the norm is
#: 1-Lipschitz, its mean <= sqrt(d)); two such events at ``SCREEN_EPS`` in all.
_SCREEN_R = math.sqrt(2.0 * math.log(2.0 / SCREEN_EPS))


@functools.cache
def _legendre(nodes: int) -> tuple[Array, Array]:
    x, w = np.polynomial.legendre.leggauss(nodes)
    return x, w


def _norms(A: Array) -> Array:
    out: Array = np.sqrt(np.einsum("ij,ij->i", A, A))
    return out


def _quadrature(lp: Array, lm: Array, nc_plus: Array, nc_minus: Array, dim: int) -> Array:
    """``P[lp X+ >= lm X-]`` for independent ``X+/- ~ chi'^2_dim(nc_+/-)``, ``lp, lm > 0``.

    Integrated over ``t = sqrt(X)`` of the variable with the smaller scale (``sqrt(lp)`` vs
    ``sqrt(lm)``) against the other's cdf, which then varies no faster than the density. ``T``
    (a non-central chi) has variance <= 1 and is a 1-Lipschitz function of a Gaussian, so
    ``[c - 13, c + 12]`` with ``c = sqrt(nc + dim) >= E T`` holds all but ``2 exp(-72)`` of its
    mass; Gauss-Legendre on it is exact to ~1e-11 (tests).
    """
    over_plus = lp <= lm  # P = E_{X+}[F_-(lp/lm X+)], else E_{X-}[1 - F_+(lm/lp X-)]
    nc_a = np.where(over_plus, nc_plus, nc_minus)[:, None]
    nc_b = np.where(over_plus, nc_minus, nc_plus)[:, None]
    ratio = np.where(over_plus, lp / lm, lm / lp)[:, None]
    c = np.sqrt(nc_a + dim)
    lo, hi = np.maximum(0.0, c - 13.0), c + 12.0
    x, w = _legendre(QUADRATURE_NODES)
    t = lo + (hi - lo) * (x + 1.0) / 2.0
    from scipy import stats  # here: importing scipy.stats costs ~0.5 s at start-up

    density = 2.0 * t * stats.ncx2.pdf(t * t, dim, nc_a)  # of T = sqrt(X)
    F = special.chndtr(ratio * t * t, dim, nc_b)
    G = np.where(over_plus[:, None], F, 1.0 - F)
    out: Array = np.clip(((hi - lo) / 2.0 * w * density * G).sum(axis=1), 0.0, 1.0)
    return out


def gibbs_triplet_error(L: Any, a: Any, b: Any, sigma: float) -> Array:
    """Per triplet, the exact probability that ``L~ = L + sigma E`` (``E`` with i.i.d. standard
    normal entries) errs: ``P[ ||L~ a||^2 >= ||L~ b||^2 ]``, ``a = x_a - x_p``, ``b = x_a - x_n``
    (docs/algorithms/certificates.md).

    With ``A = a a^T - b b^T = lambda+ w+ w+^T + lambda- w- w-^T`` (orthonormal ``w``, eigen
    decomposition on span{a, b}), ``||L~ a||^2 - ||L~ b||^2 = sigma^2 (lambda+ X+ - |lambda-|
    X-)`` with independent ``X+/- ~ chi'^2_d(||L w+/-||^2 / sigma^2)``; one 1-D quadrature
    per triplet. ``lambda- = 0`` (``b`` a shorter multiple of ``a``, or a tie): 1;
    ``lambda+ = 0``: 0. Triplets whose outcome the noise cannot change but with probability
    ``< 1e-12`` are settled by a tail bound (value ``1e-12``, or 1 for a sure error).

    >>> L = np.eye(3)
    >>> p = gibbs_triplet_error(L, [[0.1, 0.0, 0.0]], [[2.0, 0.0, 0.0]], sigma=0.01)
    >>> float(p[0]) <= 1e-12
    True
    >>> p = gibbs_triplet_error(L, [[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]], sigma=0.5)
    >>> round(float(p[0]), 9)   # |a| = |b|, a orthogonal to b: a fair coin by symmetry
    0.5
    """
    Lm = np.asarray(L, dtype=np.float64)
    A = np.atleast_2d(np.asarray(a, dtype=np.float64))
    B = np.atleast_2d(np.asarray(b, dtype=np.float64))
    # float64 overflow (enormous inputs) gives inf / NaN below: such a triplet counts as an
    # error (conservative), never as a NaN risk.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _gibbs_triplet_error(Lm, A, B, sigma)


def _gibbs_triplet_error(Lm: Array, A: Array, B: Array, sigma: float) -> Array:
    dim = Lm.shape[0]
    P, Q = A @ Lm.T, B @ Lm.T
    na, nb, nP, nQ = _norms(A), _norms(B), _norms(P), _norms(Q)
    s = sigma * (math.sqrt(dim) + _SCREEN_R)
    right = nP + s * na < nQ - s * nb  # ||L~ a|| < ||L~ b|| but with probability < SCREEN_EPS
    wrong = nP - s * na >= nQ + s * nb
    out = np.where(right, SCREEN_EPS, 1.0)
    hard = ~(right | wrong) & np.isfinite(na + nb + nP + nQ)
    if not hard.any():
        return out
    A, B, P, na, nb = A[hard], B[hard], P[hard], na[hard], nb[hard]
    exact = np.where(nb <= na, 1.0, 0.0)  # a = 0 or b parallel to a: decided by the lengths
    q1 = A / np.where(na > 0, na, 1.0)[:, None]
    r12 = np.einsum("ij,ij->i", q1, B)
    perp = B - r12[:, None] * q1  # the part of b off a, measured directly (no cancellation)
    r22 = _norms(perp)
    general = (na > 0) & (r22 > 0)
    if general.any():
        r11, r12, r22 = na[general], r12[general], r22[general]
        # A / |a|^2 on the orthonormal basis (q1, q2) of span{a, b}: R diag(1, -1) R^T with
        # R / |a| (the probability depends on the eigenvalues' ratio only; no overflow).
        u, v = r12 / r11, r22 / r11
        S = np.empty((len(r11), 2, 2))
        S[:, 0, 0] = 1.0 - u * u
        S[:, 0, 1] = S[:, 1, 0] = -u * v
        S[:, 1, 1] = -v * v
        finite = np.isfinite(S).all(axis=(1, 2))  # not: |b| / |a| beyond ~1e154
        S[~finite] = 0.0
        lam, V = np.linalg.eigh(S)  # ascending: lambda-, lambda+
        Lq1 = P[general] / r11[:, None]
        Lq2 = (perp[general] / r22[:, None]) @ Lm.T
        Lw_minus = Lq1 * V[:, 0, 0, None] + Lq2 * V[:, 1, 0, None]
        Lw_plus = Lq1 * V[:, 0, 1, None] + Lq2 * V[:, 1, 1, None]
        lp, lm = np.maximum(lam[:, 1], 0.0), np.maximum(-lam[:, 0], 0.0)
        # ties and sure errors (lambda- = 0); lp = 0: never; beyond float64: an error
        value = np.where((lm == 0.0) | ~finite, 1.0, 0.0)
        both = (lp > 0.0) & (lm > 0.0) & finite
        if both.any():
            value[both] = _quadrature(
                lp[both],
                lm[both],
                np.einsum("ij,ij->i", Lw_plus, Lw_plus)[both] / sigma**2,
                np.einsum("ij,ij->i", Lw_minus, Lw_minus)[both] / sigma**2,
                dim,
            )
        exact[general] = value
    out[hard] = np.where(np.isnan(exact), 1.0, exact)  # NaN (float64 limits): an error
    return out


def gibbs_accept(L: Any, diff: Any, threshold: float, sigma: float) -> tuple[Array, Array]:
    """Per pair with difference ``diff``, bounds ``(lower, upper)`` of the probability that
    ``L~ = L + sigma E`` accepts it, ``P[ ||L~ diff||^2 <= threshold ]``.

    ``||L~ diff||^2 = sigma^2 ||diff||^2 chi'^2_d(||L diff||^2 / (sigma^2 ||diff||^2))``: one
    non-central chi-square cdf per pair, so ``lower == upper`` except for pairs settled by a
    tail bound (there the two differ by 1e-12).

    >>> lo, up = gibbs_accept(np.eye(2), [[1.0, 0.0]], threshold=1.0, sigma=0.5)
    >>> bool(lo[0] == up[0]), round(float(up[0]), 4)   # Monte-Carlo (4e5 draws): 0.3962
    (True, 0.3965)
    """
    Lm = np.asarray(L, dtype=np.float64)
    D = np.atleast_2d(np.asarray(diff, dtype=np.float64))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _gibbs_accept(Lm, D, threshold, sigma)


def _gibbs_accept(Lm: Array, D: Array, threshold: float, sigma: float) -> tuple[Array, Array]:
    dim = Lm.shape[0]
    nd, nL = _norms(D), _norms(D @ Lm.T)
    root = math.sqrt(threshold)
    s = sigma * (math.sqrt(dim) + _SCREEN_R) * nd
    rejects = nL - s > root  # accepted with probability < SCREEN_EPS
    accepts = nL + s <= root
    lower = np.where(accepts, 1.0 - SCREEN_EPS, 0.0)
    upper = np.where(rejects, SCREEN_EPS, 1.0)
    # diff = 0 has distance 0 <= threshold: accepted; an overflow (NaN) stays [0, 1]
    hard = ~(rejects | accepts) & (nd > 0) & np.isfinite(nd + nL)
    if hard.any():
        scale = (sigma * nd[hard]) ** 2
        p = special.chndtr(threshold / scale, dim, nL[hard] ** 2 / scale)
        lower[hard] = np.where(np.isnan(p), 0.0, p)  # NaN: underflow of sigma ||diff||
        upper[hard] = np.where(np.isnan(p), 1.0, p)
    lower[nd == 0] = 1.0
    return lower, upper


def certify_pac_bayes(
    L: Any,
    prior: Any,
    X: Any,
    labels: Any,
    threshold: float,
    threshold_source: str,
    *,
    delta: float = 0.05,
    seed: int = 0,
    version: int | None = None,
    prefix: int | None = None,
    trained: int | None = None,
    window: int | None = None,
    stream: int = 0,
    sigmas: Any = None,
) -> Certificate:
    """PAC-Bayes-kl certificate of the Gibbs metric around ``L`` (docs/algorithms/certificates.md).

    ``prior``: ``L`` frozen after the training prefix (``None``: the prefix has not passed
    yet, NotEnoughHeldOut); ``X``, ``labels``: training samples *after* the prefix (the bound
    set). Both metrics are normalised to unit Frobenius norm (triplet decisions do not change;
    the threshold is scaled with ``L``). Posterior ``Q = N(L/||L||, sigma^2 I)``, prior ``P =
    N(L_P/||L_P||, sigma^2 I)``, ``KL = ||L/||L|| - L_P/||L_P|| ||_F^2 / (2 sigma^2)``. Each
    quantity (``delta / 3``) is bounded by ``kl^-1(R, (KL + ln(J xi(m) / (delta/3))) / m)``
    (never a factor 2 inside), at each of the ``J`` scales of ``sigmas`` (absolute; default
    :data:`SIGMA_GRID` ``/ d``), and the best is reported (valid by the union bound over the
    grid). The false accept / reject rates are certified at the :data:`THRESHOLD_GRID` values
    just above / below the normalised threshold (``J G`` in the union bound). ``R`` is the
    exact empirical Gibbs risk (:func:`gibbs_triplet_error`, :func:`gibbs_accept`) plus
    :data:`GIBBS_TOLERANCE`: no Monte-Carlo, no second delta.
    Scales that cannot beat the best found (``1 - exp(-c)`` already above it) are skipped.
    """
    delta, _ = check_certificate_args(delta, "pac-bayes")
    what = "training samples after the PAC-Bayes prefix"
    if prior is None:
        left = max((prefix or 0) - (trained or 0), 0)
        raise NotEnoughHeldOut(
            left + 7 * MIN_TUPLES,
            0,
            f"not enough {what}: the prior is frozen after {prefix} training samples "
            f"({trained} so far); about {left + 7 * MIN_TUPLES} more are needed",
        )
    Lm, Xs, codes = check_metric_and_samples(L, X, labels)
    dim = Lm.shape[0]
    Pm = check_metric(prior, dim, "prior")
    scale, prior_scale = float(np.linalg.norm(Lm)), float(np.linalg.norm(Pm))
    if scale == 0.0 or prior_scale == 0.0:
        raise ValueError("L: a zero metric has no scale to normalise; PAC-Bayes needs L != 0")
    theta = check_threshold(threshold)
    grid = SIGMA_GRID / dim if sigmas is None else np.asarray(sigmas, dtype=np.float64).ravel()
    if not (len(grid) and np.isfinite(grid).all() and (grid > 0).all()):
        raise ValueError("sigmas: must be finite numbers > 0")
    Lh, theta_h = Lm / scale, theta / scale**2
    above = int(np.searchsorted(THRESHOLD_GRID, theta_h, side="left"))
    below = int(np.searchsorted(THRESHOLD_GRID, theta_h, side="right")) - 1
    # Off the grid: infinity accepts everything and 0 rejects every pair of distinct samples:
    # the vacuous bound 1, valid without a union bound.
    far_theta = float(THRESHOLD_GRID[above]) if above < len(THRESHOLD_GRID) else math.inf
    frr_theta = float(THRESHOLD_GRID[below]) if below >= 0 else 0.0
    G = len(THRESHOLD_GRID)
    distance2 = float(np.sum((Lh - Pm / prior_scale) ** 2))
    n_classes = len(np.unique(codes))
    tuples = build_tuples(codes, tuple_rng(seed, stream))
    check_enough(tuples, len(Xs), n_classes, what, window or len(Xs))
    t, pos, neg = tuples.triplets, tuples.positive_pairs, tuples.negative_pairs
    a, b = Xs[t[:, 0]] - Xs[t[:, 1]], Xs[t[:, 0]] - Xs[t[:, 2]]
    dpos, dneg = Xs[pos[:, 0]] - Xs[pos[:, 1]], Xs[neg[:, 0]] - Xs[neg[:, 1]]
    # quantity: (tuples, hypotheses in the union bound, Gibbs error probabilities at sigma)
    risks: dict[str, tuple[int, int, Callable[[float], Array]]] = {
        "triplet_error": (len(t), len(grid), lambda s: gibbs_triplet_error(Lh, a, b, s)),
        "false_accept": (
            len(neg),
            len(grid) * G,
            lambda s: gibbs_accept(Lh, dneg, far_theta, s)[1],
        ),
        "false_reject": (
            len(pos),
            len(grid) * G,
            lambda s: 1.0 - gibbs_accept(Lh, dpos, frr_theta, s)[0],
        ),
    }
    share = delta / len(QUANTITIES)
    bounds: dict[str, Bound] = {}
    for name, (m, union, risk) in risks.items():
        confidence = math.log(union * xi(m) / share)
        best: Bound | None = None
        for sigma in np.sort(grid)[::-1]:  # large sigma first: small KL, cheap quadrature
            kl_div = distance2 / (2.0 * sigma**2)
            c = (kl_div + confidence) / m
            if best is not None and -math.expm1(-c) >= best.bound:
                continue  # kl^-1(R, c) >= kl^-1(0, c) = 1 - e^-c: cannot win
            errors = float(np.sum(risk(float(sigma))))
            upper = float(kl_inv_upper(min(errors / m + GIBBS_TOLERANCE, 1.0), c))
            if best is None or upper < best.bound:
                best = Bound(m, errors, errors / m, upper, share, float(sigma), kl_div)
        assert best is not None
        bounds[name] = best
    at = "" if version is None else f" at version {version}"
    statement = (
        f"With probability at least {1 - delta:.4g} over the bound set, all three bounds hold "
        f"together (each at delta/3 = {share:.4g}, spread over {len(grid)} posterior scales) "
        f"for the RANDOMISED (Gibbs) metric: the expected error of L~ = L/||L||_F + sigma E "
        f"(E with i.i.d. standard normal entries) around the metric{at}, at threshold "
        f"{theta_h:.6g} = {theta:.6g}/||L||_F^2 ({threshold_source}); NOT of the served "
        f"deterministic metric: {summary(bounds)}. The false accept and reject rates are "
        f"certified at the grid thresholds {far_theta:.6g} and {frr_theta:.6g} just above and "
        f"below it, which bound those at it. One delta is spent: the Gibbs risk is "
        f"computed exactly (no Monte-Carlo delta). Prior N(L_P/||L_P||_F, sigma^2 I), L_P "
        f"frozen after the first {prefix} training samples; bound set: the last {len(Xs)} "
        f"training samples after them. Assumes an exchangeable (i.i.d., no drift) labelled "
        f"stream; {CLASS_MIX}."
    )
    return Certificate(
        method="pac-bayes",
        certifies="gibbs",
        delta=delta,
        threshold=theta,
        threshold_source=threshold_source,
        samples=len(Xs),
        classes=n_classes,
        window=window or len(Xs),
        version=version,
        statement=statement,
        details={
            "prior_prefix": prefix,
            "sigma_grid": grid.tolist(),
            "normalised_threshold": theta_h,
            "false_accept_threshold": far_theta,
            "false_reject_threshold": frr_theta,
            "threshold_grid": {"ratio": 2.0**0.125, "min": THRESHOLD_GRID[0], "size": G},
            "scale": scale,
            "delta_monte_carlo": 0.0,
            "gibbs_tolerance": GIBBS_TOLERANCE,
        },
        triplet_error=bounds["triplet_error"],
        false_accept=bounds["false_accept"],
        false_reject=bounds["false_reject"],
    )
