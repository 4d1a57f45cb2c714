"""Tool A: the held-out test-set bound of the served metric (docs/algorithms/certificates.md).

The frozen ``L`` and threshold are evaluated on disjoint tuples of samples the learner never saw
(:mod:`~service.core.certificates.tuples`); ``k`` errors in ``m`` tuples of a quantity give
Langford's bound at that quantity's share of delta (:func:`upper_bound`). The pieces are public
so that other held-out statements can be built from the same tuples and the same bounds:
:func:`tuple_errors` (which tuples the metric gets wrong at a threshold) and
:func:`upper_bound` (the bound of a count).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.core._validation import Array, check_threshold
from service.core.certificates import (
    CLASS_MIX,
    QUANTITIES,
    Bound,
    Certificate,
    Method,
    check_certificate_args,
    check_metric_and_samples,
    summary,
)
from service.core.certificates.bounds import bin_inv_upper, kl_inv_upper
from service.core.certificates.tuples import Tuples, build_tuples, check_enough, tuple_rng


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


def upper_bound(m: int, k: int, delta: float, method: Method = "binomial") -> float:
    """The bound, holding with probability ``>= 1 - delta``, on a rate of which ``k`` errors were
    seen in ``m`` independent tuples: Langford's ``Bin^{-1}(m, k, delta)`` (``"binomial"``,
    exact; valid for tuples with different means up to ``delta = 0.1``) or its Chernoff
    relaxation ``kl^{-1}(k/m, ln(1/delta)/m)`` (``"kl"``, valid at any ``delta``).

    >>> round(upper_bound(1000, 50, 0.05), 6), round(upper_bound(1000, 50, 0.05, "kl"), 6)
    (0.062863, 0.068685)
    """
    if method == "binomial":
        return float(bin_inv_upper(m, k, delta))
    if method == "kl":
        return float(kl_inv_upper(k / m, math.log(1.0 / delta) / m))
    raise ValueError(f"method: a held-out bound is 'binomial' or 'kl', got {method!r}")


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
    """Certify the frozen metric ``L`` at ``threshold`` on held-out samples
    (docs/algorithms/certificates.md).

    ``X``: the held-out samples as the metric sees them (normalised), ``labels``: their class
    codes. Disjoint tuples come from :func:`build_tuples` with a generator fixed by ``seed``
    and ``stream`` (the number of samples that ever entered the reservoir), errors are counted
    with ``L`` as it is, and each quantity is bounded at ``delta / 3`` with
    :func:`upper_bound` (``"binomial"`` or ``"kl"``).

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
    Lm, Xs, codes = check_metric_and_samples(L, X, labels)
    theta = check_threshold(threshold)
    n_classes = len(np.unique(codes))
    tuples = build_tuples(codes, tuple_rng(seed, stream))
    check_enough(tuples, len(Xs), n_classes, "held-out samples", window or len(Xs))
    share = delta / len(QUANTITIES)
    bounds: dict[str, Bound] = {}
    for name, errs in tuple_errors(Lm, Xs, tuples, theta).items():
        m, k = len(errs), int(errs.sum())
        upper = upper_bound(m, k, share, method)
        bounds[name] = Bound(m=m, errors=k, empirical=k / m, bound=upper, delta=share)
    at = "" if version is None else f" at version {version}"
    statement = (
        f"With probability at least {1 - delta:.4g} over the held-out samples, all three "
        f"bounds hold together (each at delta/3 = {share:.4g}) for the served metric{at} at "
        f"threshold {theta:.6g} ({threshold_source}): {summary(bounds)}. Assumes an "
        f"exchangeable (i.i.d., no drift) labelled stream and a metric and threshold not "
        f"chosen using these {len(Xs)} held-out samples; {CLASS_MIX}."
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
