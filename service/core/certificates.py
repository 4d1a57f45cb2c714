"""Risk certificates: high-confidence upper bounds on the errors of a metric and threshold.

A verification user asks: "at this threshold, how often will it wrongly accept or wrongly
reject, and how sure are you?". A certificate answers with three bounds, each holding with a
stated confidence, for three 0-1 errors (seed-specs 2.3):

* ``triplet_error``: ``P[ ||L(x_a - x_p)||^2 >= ||L(x_a - x_n)||^2 ]`` (ties count as errors),
  anchor and positive of one class, the negative of another;
* ``false_accept``: ``P[ ||L(x - x')||^2 <= theta | y != y' ]`` (the service's ``same <=> d <=
  theta``);
* ``false_reject``: ``P[ ||L(x - x')||^2 > theta | y = y' ]``.

Two tools (seed-specs 2.4 and 2.5):

* **Held-out test-set bound** (``method="binomial"``, the default, or ``"kl"``): the frozen
  served ``L`` and ``theta`` are evaluated on disjoint tuples of samples the learner never saw
  (the held-out reservoir of :mod:`service.core.holdout`), and ``k`` errors in ``m`` tuples
  give Langford's bound ``Bin^{-1}(m, k, delta)`` (``"binomial"``, exact) or its Chernoff
  relaxation ``kl^{-1}(k/m, ln(1/delta)/m)`` (``"kl"``). This certifies exactly what is
  served.
* **PAC-Bayes-kl** (``method="pac-bayes"``): no samples held out; a prior centred at ``L``
  frozen after a prefix of the training stream, an isotropic Gaussian posterior around the
  current (Frobenius-normalised) ``L``, the exact Gibbs risk on post-prefix training samples.
  This certifies the *randomised* (Gibbs) metric, not the served one; the answer says so.

Choices where the spec leaves room (each stated in every answer):

* **Confidence split.** The three bounds hold *together* with probability ``>= 1 - delta``:
  each is computed at ``delta / 3`` (union bound; no independence needed). For PAC-Bayes each
  quantity's ``delta / 3`` is further split over the ``J`` values of the sigma grid. The Gibbs
  risk is computed exactly (no Monte-Carlo), so no second delta is spent. Validity is per
  request: a user who asks for certificates ``j = 1, 2, ...`` on one stream and wants them all
  valid at once should ask for ``delta_j = delta / (j (j + 1))``.
* **Tuples** (:func:`build_tuples`) are formed from labels and a seeded generator only, never
  from features, and each sample is in at most one tuple, so conditional on the labels the
  tuple errors are independent (seed-specs 2.3). The samples are shuffled and dealt into a
  triplet pool (3/7), a positive-pair pool (2/7) and a negative-pair pool (2/7), which gives
  the three quantities about the same number of tuples. Positive pairs are two samples of one
  class. Negative pairs and triplets are formed in rounds (round-robin over classes): in each
  round every class that still has enough samples takes part once, and the classes of the round
  are put in a random cyclic order, each class being paired with the next one. So every class
  counts in proportion to its held-out samples, against a random other class of the round; the
  certified rates are averages over that class mix (and the answer says so).
* **Binomial inversion.** For independent errors with different means (class pairs differ) the
  exact binomial inversion is valid when the confidence per quantity is ``<= 0.1`` (Hoeffding
  1956, seed-specs 2.3), i.e. ``delta <= 0.3``; above it ask for ``method="kl"``, valid
  unconditionally.

* **PAC-Bayes details.** The Gibbs risk of a triplet is one 1-D quadrature of non-central
  chi-square functions (exact to ~1e-11; :data:`GIBBS_TOLERANCE` = 1e-9 is added), of a pair
  one non-central chi-square cdf. The served threshold and ``||L||_F`` depend on the training
  stream, so the false accept / reject rates are certified at the values of a threshold grid
  fixed in advance just above / below the normalised threshold, the grid in the union bound.

Use (the service maps the errors: ``NotEnoughHeldOut`` to 409, ``ValueError`` to 422)::

    certificate = learner.certificate(delta=0.05, method="binomial")  # or "kl", "pac-bayes"
    certificate.to_dict()   # {method, certifies, delta, validity, threshold, threshold_source,
                            #  samples, classes, window, version, statement, details,
                            #  triplet_error / false_accept / false_reject: {m, errors,
                            #  empirical, bound, delta[, sigma, kl_divergence]}}

or, on a snapshot (``L``, the reservoir's rows and class codes, the served threshold),
:func:`certify_held_out` / :func:`certify_pac_bayes`. The learner is not thread-safe: take the
certificate where the learner is updated, or on such a snapshot. Cost (2-core machine under
load, CPU time): held-out, 5000 samples, 0.04 s at d = 64 and 0.2 s at d = 1024 (one
``(4n/7) x d x d`` product); PAC-Bayes, a window of 5000, 0.4-0.8 s at d = 10 and 64 (the
quadrature; scales whose bound cannot win are skipped).

Numerics (seed-specs 2.7) are pure and vectorised: :func:`kl`, :func:`kl_inv_upper`,
:func:`kl_inv_lower`, :func:`bin_inv_upper`, :func:`xi`; :func:`hoeffding_upper` only as a
reference. Inversions return the conservative end of their final bracket.

Why one module of this length: the numerics, the tuple rule and the two certificates are one
chain of reasoning (each bound's validity depends on how the tuples were built and how delta
was split), and reading it in one place is what lets a reviewer check it; split into files it
would be the same code with the argument scattered.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from service.core._validation import Array, as_float_array, check_matrix, check_metric

if TYPE_CHECKING:
    from service.core.calibration import Calibration

#: Bisection tolerance of the kl and binomial inversions (seed-specs 2.7).
TOL = 1e-12
#: Most halvings: enough to reach any double from 1 (a lower inverse near 0 can be ~1e-300).
MAX_ITER = 1100


def kl(q: ArrayLike, p: ArrayLike) -> Array:
    """Binary relative entropy ``kl(q || p) = q ln(q/p) + (1-q) ln((1-q)/(1-p))``.

    ``0 ln 0 = 0``; ``+inf`` when ``p`` is 0 or 1 and ``q`` differs from it.

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
    """``sup{p in [q, 1] : kl(q || p) <= c}``, elementwise (seed-specs 2.7).

    Bisection inside ``[q, min(q + sqrt(c/2), q + c + sqrt(c^2 + 2qc), 1)]`` (from ``kl >=
    2 (p-q)^2`` and ``kl >= (p-q)^2 / (2p)``), returning the upper end (conservative); ``q = 0``
    has the closed form ``1 - exp(-c)``, ``c = 0`` or ``q = 1`` give ``q``, ``c = inf`` 1.

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
    Clopper-Pearson), elementwise (seed-specs 2.4, 2.7).

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


# -- what is certified: the served threshold, the arguments ---------------------------------

Method = Literal["binomial", "kl", "pac-bayes"]
METHODS: tuple[Method, ...] = ("binomial", "kl", "pac-bayes")

#: The three certified quantities, in the order of every answer.
QUANTITIES = ("triplet_error", "false_accept", "false_reject")

#: Fewest tuples of each quantity a certificate is made from (10 error-free tuples already
#: bound a rate only by 0.34 at delta / 3 = 0.0167).
MIN_TUPLES = 10

#: Largest per-quantity confidence parameter at which the exact binomial inversion is valid for
#: independent errors with different means (Hoeffding 1956; seed-specs 2.3).
BINOMIAL_MAX_DELTA = 0.1


def served_threshold(
    calibration: Calibration, margin: float, given: float | None = None
) -> tuple[float, str]:
    """The verification threshold that is served, and where it comes from.

    The caller's (``"caller"``), else the calibrated EER threshold (``"calibrated"``), else
    (too few pairs to calibrate) the EER threshold of the partial window
    (``"fallback:window"``), else, with no pairs at all, the margin (``"fallback:margin"``: the
    loss, Eq. 4, asks negatives to be ``margin`` farther).

    >>> from service.core.calibration import Calibration
    >>> served_threshold(Calibration(2.5, 0.1, 0.9, 50, True), margin=1.0)
    (2.5, 'calibrated')
    >>> served_threshold(Calibration(None, None, None, 0, False), margin=1.0)
    (1.0, 'fallback:margin')
    """
    if given is not None:
        return _check_threshold(given), "caller"
    if calibration.calibrated and calibration.threshold is not None:
        return calibration.threshold, "calibrated"
    if calibration.threshold is not None:
        return calibration.threshold, "fallback:window"
    return margin, "fallback:margin"


def _check_threshold(value: Any) -> float:
    try:
        theta = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"threshold: must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(theta) or theta < 0.0:
        raise ValueError(f"threshold: must be a finite number >= 0, got {value!r}")
    return theta


def _check_metric_and_samples(
    L: Any, X: Any, labels: Any
) -> tuple[Array, Array, NDArray[np.int64]]:
    """A square finite ``L``, samples ``X`` with as many columns, one integer code per row."""
    arr = as_float_array(L, "L")
    if arr.ndim != 2:
        raise ValueError(f"L: expected a square matrix, got shape {arr.shape}")
    Lm = check_metric(arr, arr.shape[0], "L")
    Xs = check_matrix(X, Lm.shape[0], "X")
    codes = np.asarray(labels)
    if codes.shape != (len(Xs),) or codes.dtype.kind not in "iu":
        raise ValueError(f"labels: expected {len(Xs)} integer class codes, got {codes.shape}")
    return Lm, Xs, codes.astype(np.int64)


def check_certificate_args(delta: Any, method: Any) -> tuple[float, Method]:
    """``delta`` in (0, 1) (and ``<= 3 * 0.1`` for the exact binomial inversion) and a known
    ``method``; ValueError naming the argument otherwise.

    >>> check_certificate_args(0.05, "binomial")
    (0.05, 'binomial')
    >>> check_certificate_args(1.5, "binomial")
    Traceback (most recent call last):
    ...
    ValueError: delta: must be a number in (0, 1), got 1.5
    """
    if method not in METHODS:
        raise ValueError(f"method: must be one of {', '.join(METHODS)}; got {method!r}")
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"delta: must be a number in (0, 1), got {delta!r}") from None
    if isinstance(delta, bool) or not 0.0 < d < 1.0:
        raise ValueError(f"delta: must be a number in (0, 1), got {delta!r}")
    if method == "binomial" and d / len(QUANTITIES) > BINOMIAL_MAX_DELTA:
        raise ValueError(
            f"delta: the exact binomial inversion is valid for non-identical tuples up to "
            f"delta = {len(QUANTITIES) * BINOMIAL_MAX_DELTA:g} ({BINOMIAL_MAX_DELTA:g} per "
            f"quantity); got {delta!r}: use method='kl'"
        )
    return d, method


class NotEnoughHeldOut(Exception):
    """Too few samples to certify yet: ``needed`` more (an estimate at the current class mix)
    on top of the ``have`` there are. The service answers 409."""

    def __init__(self, needed: int, have: int, message: str) -> None:
        super().__init__(message)
        self.needed = needed
        self.have = have


# -- disjoint tuples from labels and a seeded generator (seed-specs 2.4 step 3) --------------


@dataclass(frozen=True)
class Tuples:
    """Indices of disjoint tuples: ``triplets`` rows ``(anchor, positive, negative)``,
    ``positive_pairs`` and ``negative_pairs`` rows ``(first, second)``."""

    triplets: NDArray[np.int64]
    positive_pairs: NDArray[np.int64]
    negative_pairs: NDArray[np.int64]


def _blocks(
    idx: NDArray[np.int64], labels: NDArray[np.int64], size: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The samples ``idx`` grouped by class (keeping their order) into complete blocks of
    ``size``: block members (one row per block) and the round of each block (its rank within
    its class), blocks ordered by class, then round."""
    lab = labels[idx]
    order = np.argsort(lab, kind="stable")
    members, classes = idx[order], lab[order]
    n = len(classes)
    starts = np.flatnonzero(np.r_[True, classes[1:] != classes[:-1]]) if n else np.empty(0, int)
    counts = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, counts)
    full = rank < np.repeat(counts - counts % size, counts)
    rounds: NDArray[np.int64] = rank[full][::size] // size
    return members[full].reshape(-1, size), rounds


def _across_classes(
    idx: NDArray[np.int64], labels: NDArray[np.int64], size: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Tuples whose last member is of another class, formed in rounds: in round ``r`` every
    class with an ``r``-th complete block takes part; the blocks of the round are put in a
    random cyclic order and each block's tuple is its first ``size - 1`` samples plus the last
    sample of the next block. Rounds with a single class are dropped."""
    blocks, rounds = _blocks(idx, labels, size)
    keys = rng.random(len(blocks))
    order = np.lexsort((keys, rounds))
    blocks, rounds = blocks[order], rounds[order]
    n = len(rounds)
    starts = np.flatnonzero(np.r_[True, rounds[1:] != rounds[:-1]]) if n else np.empty(0, int)
    counts = np.diff(np.r_[starts, n])
    nxt = np.arange(n) + 1
    nxt[starts + counts - 1] = starts  # the last block of a round passes to its first
    tuples = np.column_stack([blocks[:, : size - 1], blocks[nxt, size - 1]]) if n else blocks
    out: NDArray[np.int64] = tuples[np.repeat(counts >= 2, counts)].astype(np.int64)
    return out


def build_tuples(labels: NDArray[np.int64], rng: np.random.Generator) -> Tuples:
    """Disjoint triplets, positive pairs and negative pairs from labels alone (never features).

    The samples are shuffled and dealt into a triplet pool (3 in 7), a positive-pair pool (2 in
    7) and a negative-pair pool (2 in 7). Positive pairs: consecutive samples of one class.
    Triplets and negative pairs: rounds over the classes (see the module docstring). Each sample
    is in at most one tuple.

    >>> t = build_tuples(np.repeat(np.arange(4), 70), np.random.default_rng(0))
    >>> len(t.triplets), len(t.positive_pairs), len(t.negative_pairs)
    (39, 40, 40)
    >>> used = np.concatenate([t.triplets.ravel(), t.positive_pairs.ravel(),
    ...                        t.negative_pairs.ravel()])
    >>> len(np.unique(used)) == len(used)
    True
    """
    n = len(labels)
    shuffled = rng.permutation(n).astype(np.int64)
    deal = np.arange(n) % 7
    return Tuples(
        triplets=_across_classes(shuffled[deal < 3], labels, 3, rng),
        positive_pairs=_blocks(shuffled[(deal == 3) | (deal == 4)], labels, 2)[0],
        negative_pairs=_across_classes(shuffled[deal >= 5], labels, 2, rng),
    )


def _tuple_rng(seed: int, stream: int) -> np.random.Generator:
    """The generator that forms a certificate's tuples: fixed by the model's seed and the
    number of samples that ever entered the window, so one snapshot always gives the same
    tuples (and a window that moved gets fresh ones)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2, stream))))


def _not_enough(tuples: Tuples, n: int, classes: int, what: str, window: int) -> None:
    """NotEnoughHeldOut unless every quantity has :data:`MIN_TUPLES` tuples."""
    fewest = min(len(tuples.triplets), len(tuples.positive_pairs), len(tuples.negative_pairs))
    if fewest >= MIN_TUPLES:
        return
    floor = 7 * MIN_TUPLES  # every pool full of ideal tuples
    total = max(floor, math.ceil(n * MIN_TUPLES / fewest) if fewest else 2 * max(n, 1))
    needed = max(total - n, 1)
    detail = " of at least two classes" if classes < 2 else ""
    hint = f"; the window keeps at most {window}, raise it" if total > window else ""
    raise NotEnoughHeldOut(
        needed,
        n,
        f"not enough {what}: {n} form {fewest} tuples of the scarcest kind, a certificate needs "
        f"{MIN_TUPLES} of each; about {needed} more{detail} are needed{hint}",
    )


# -- the answer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """One certified quantity: ``errors`` among ``m`` tuples, the ``empirical`` rate, and the
    ``bound`` that the true rate stays below with probability >= ``1 - delta``.

    PAC-Bayes adds the posterior scale ``sigma`` chosen on the grid and ``kl_divergence``
    ``KL(Q || P)``; there ``errors`` is the sum of exact Gibbs error probabilities.

    >>> Bound(m=100, errors=0, empirical=0.0, bound=0.0295, delta=0.05).to_dict()["bound"]
    0.0295
    """

    m: int
    errors: float
    empirical: float
    bound: float
    delta: float
    sigma: float | None = None
    kl_divergence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.sigma is None:
            del out["sigma"], out["kl_divergence"]
        return out


@dataclass(frozen=True)
class Certificate:
    """A certificate: three bounds that hold together with probability >= ``1 - delta``.

    ``certifies`` is ``"served"`` (the deterministic ``L`` and ``threshold`` that queries use)
    or ``"gibbs"`` (PAC-Bayes: the randomised metric around ``L``). ``samples`` / ``classes``
    describe the samples the tuples came from (the reservoir, or the PAC-Bayes bound window)
    and ``window`` its capacity. ``validity`` is ``"per-request"``: see the module docstring
    for certificates that must hold all at once. ``statement`` says it in a sentence.
    """

    method: Method
    certifies: Literal["served", "gibbs"]
    delta: float
    triplet_error: Bound
    false_accept: Bound
    false_reject: Bound
    threshold: float
    threshold_source: str
    samples: int
    classes: int
    window: int
    version: int | None
    statement: str
    validity: str = "per-request"
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: plain numbers, strings and dicts."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in QUANTITIES:
            out[name] = getattr(self, name).to_dict()
        return out


def _bound_text(name: str, b: Bound) -> str:
    return f"{name} <= {b.bound:.4g} ({b.errors:.6g} errors in {b.m})"


def _summary(bounds: dict[str, Bound]) -> str:
    return "; ".join(
        _bound_text(text, bounds[name])
        for name, text in zip(
            QUANTITIES, ("triplet error", "false accept rate", "false reject rate"), strict=True
        )
    )


_MIX = (
    "the rates are averages over the class mix of the tuples: every class in proportion to "
    "its samples there, paired with a random other class"
)


# -- Tool A: the held-out test-set bound of the served metric (seed-specs 2.4) ---------------


def _squared(L: Array, X: Array, first: NDArray[np.int64], second: NDArray[np.int64]) -> Array:
    """``||L (x_first - x_second)||^2`` row by row (Eq. 2), as a verify computes it."""
    with np.errstate(over="ignore", invalid="ignore"):
        Z = (X[first] - X[second]) @ L.T
        out: Array = np.einsum("ij,ij->i", Z, Z)
    return out


def tuple_errors(
    L: Array, X: Array, tuples: Tuples, threshold: float
) -> dict[str, NDArray[np.bool_]]:
    """Per tuple, whether the frozen metric errs: triplets ``d(a, p) >= d(a, n)`` (ties are
    errors), negative pairs ``d <= threshold`` (false accept), positive pairs ``d > threshold``
    (false reject). A distance that overflowed float64 (NaN) counts as an error: conservative.
    """
    t, pos, neg = tuples.triplets, tuples.positive_pairs, tuples.negative_pairs
    return {
        "triplet_error": ~(_squared(L, X, t[:, 0], t[:, 1]) < _squared(L, X, t[:, 0], t[:, 2])),
        "false_accept": ~(_squared(L, X, neg[:, 0], neg[:, 1]) > threshold),
        "false_reject": ~(_squared(L, X, pos[:, 0], pos[:, 1]) <= threshold),
    }


def certify_held_out(
    L: Any,
    X: Any,
    labels: Any,
    threshold: float,
    threshold_source: str,
    *,
    delta: float = 0.05,
    method: Method = "binomial",
    seed: int = 0,
    version: int | None = None,
    window: int | None = None,
    stream: int = 0,
) -> Certificate:
    """Certify the frozen metric ``L`` at ``threshold`` on held-out samples (seed-specs 2.4).

    ``X``: the held-out samples as the metric sees them (normalised), ``labels``: their class
    codes. Disjoint tuples come from :func:`build_tuples` with a generator fixed by ``seed``
    and ``stream`` (the number of samples that ever entered the reservoir), errors are counted
    with ``L`` as it is, and each quantity is bounded at ``delta / 3`` with
    :func:`bin_inv_upper` (``"binomial"``) or :func:`kl_inv_upper` (``"kl"``).

    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, 2100)
    >>> X = 3.0 * np.eye(4)[labels] + rng.normal(size=(2100, 4))
    >>> c = certify_held_out(np.eye(4), X, labels, 14.0, "caller")
    >>> c.false_accept.m, c.false_accept.errors, round(c.false_accept.bound, 4)
    (297, 58, 0.2493)
    >>> c.certifies, round(c.false_accept.delta, 4)
    ('served', 0.0167)
    """
    delta, method = check_certificate_args(delta, method)
    if method == "pac-bayes":
        raise ValueError("method: the held-out certificate is 'binomial' or 'kl'")
    Lm, Xs, codes = _check_metric_and_samples(L, X, labels)
    theta = _check_threshold(threshold)
    n_classes = len(np.unique(codes))
    tuples = build_tuples(codes, _tuple_rng(seed, stream))
    _not_enough(tuples, len(Xs), n_classes, "held-out samples", window or len(Xs))
    share = delta / len(QUANTITIES)
    bounds: dict[str, Bound] = {}
    for name, errs in tuple_errors(Lm, Xs, tuples, theta).items():
        m, k = len(errs), int(errs.sum())
        if method == "binomial":
            upper = float(bin_inv_upper(m, k, share))
        else:
            upper = float(kl_inv_upper(k / m, math.log(1.0 / share) / m))
        bounds[name] = Bound(m=m, errors=k, empirical=k / m, bound=upper, delta=share)
    at = "" if version is None else f" at version {version}"
    statement = (
        f"With probability at least {1 - delta:.4g} over the held-out samples, all three "
        f"bounds hold together (each at delta/3 = {share:.4g}) for the served metric{at} at "
        f"threshold {theta:.6g} ({threshold_source}): {_summary(bounds)}. Assumes an "
        f"exchangeable (i.i.d., no drift) labelled stream and a metric and threshold not "
        f"chosen using these {len(Xs)} held-out samples; {_MIX}."
    )
    return Certificate(
        method=method,
        certifies="served",
        delta=delta,
        threshold=theta,
        threshold_source=threshold_source,
        samples=len(Xs),
        classes=n_classes,
        window=window or len(Xs),
        version=version,
        statement=statement,
        triplet_error=bounds["triplet_error"],
        false_accept=bounds["false_accept"],
        false_reject=bounds["false_reject"],
    )


# -- Tool B: PAC-Bayes-kl certificate of the Gibbs metric (seed-specs 2.5) -------------------

#: Posterior scales, relative to the unit Frobenius norm of the normalised metric and divided
#: by ``d`` (seed-specs 2.5): fixed in advance, the confidence is split over them.
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
    (seed-specs 2.5 (ii)).

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
    """PAC-Bayes-kl certificate of the Gibbs metric around ``L`` (seed-specs 2.5).

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
    Lm, Xs, codes = _check_metric_and_samples(L, X, labels)
    dim = Lm.shape[0]
    Pm = check_metric(prior, dim, "prior")
    scale, prior_scale = float(np.linalg.norm(Lm)), float(np.linalg.norm(Pm))
    if scale == 0.0 or prior_scale == 0.0:
        raise ValueError("L: a zero metric has no scale to normalise; PAC-Bayes needs L != 0")
    theta = _check_threshold(threshold)
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
    tuples = build_tuples(codes, _tuple_rng(seed, stream))
    _not_enough(tuples, len(Xs), n_classes, what, window or len(Xs))
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
        f"deterministic metric: {_summary(bounds)}. The false accept and reject rates are "
        f"certified at the grid thresholds {far_theta:.6g} and {frr_theta:.6g} just above and "
        f"below it, which bound those at it. One delta is spent: the Gibbs risk is "
        f"computed exactly (no Monte-Carlo delta). Prior N(L_P/||L_P||_F, sigma^2 I), L_P "
        f"frozen after the first {prefix} training samples; bound set: the last {len(Xs)} "
        f"training samples after them. Assumes an exchangeable (i.i.d., no drift) labelled "
        f"stream; {_MIX}."
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
