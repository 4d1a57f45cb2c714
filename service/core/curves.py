"""What the console draws, computed here so every client gets the same numbers: the ROC of a
calibration window and a two-dimensional principal-component view of samples.

The ROC follows the verify rule: a pair is accepted when its squared distance (Eq. 2) is at
most the threshold ``t``, so ``far(t) = #{d_neg <= t} / n`` and ``frr(t) = #{d_pos > t} / n``
over the window's ``n`` (positive, negative) pairs (:mod:`service.core.calibration`).
"""

from __future__ import annotations

import numpy as np

from service.core._validation import Array


def roc(window: Array, points: int) -> tuple[Array, Array, Array]:
    """``points`` (threshold, far, frr) triples of the window (rows ``(d_pos, d_neg)``):
    thresholds at evenly spaced quantiles of all its distances, ascending, from the smallest
    to the largest (so the curve runs from far = 0 to far = 1). ValueError: an empty window or
    ``points < 2``.

    >>> t, far, frr = roc(np.array([[1.0, 3.0], [2.0, 4.0]]), 4)
    >>> t.tolist(), far.tolist(), frr.tolist()
    ([1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.5, 1.0], [0.5, 0.0, 0.0, 0.0])
    """
    if points < 2:
        raise ValueError(f"points: must be >= 2, not {points}")
    if len(window) == 0:
        raise ValueError("window: no pairs yet")
    pos = np.sort(window[:, 0])
    neg = np.sort(window[:, 1])
    thresholds = np.quantile(np.concatenate([pos, neg]), np.linspace(0.0, 1.0, points))
    return thresholds, *rates(pos, neg, thresholds)


def rates(pos: Array, neg: Array, thresholds: Array) -> tuple[Array, Array]:
    """False accept and false reject rates at each threshold (``pos``, ``neg`` sorted).

    >>> far, frr = rates(np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([2.5]))
    >>> far.tolist(), frr.tolist()
    ([0.0], [0.0])
    """
    n_pos, n_neg = max(len(pos), 1), max(len(neg), 1)
    far = np.searchsorted(neg, thresholds, side="right") / n_neg
    frr = 1.0 - np.searchsorted(pos, thresholds, side="right") / n_pos
    return far, frr


def principal_components(X: Array, k: int = 2) -> tuple[Array, Array]:
    """The rows of ``X`` projected on its first ``k`` principal axes (centred; SVD), and the
    share of the variance each axis explains. Fewer than ``k`` dimensions or rows: the missing
    columns are zeros. Axis signs are fixed (largest loading positive) so a picture does not
    flip between two calls on nearly the same samples. Computed on ``X`` divided by its
    largest magnitude (axes and shares do not depend on the scale), so finite rows near the
    float64 limit get finite shares too (their points may overflow to infinity); ``X`` with a
    non-finite value has no axes: zeros.

    >>> P, share = principal_components(np.array([[0.0, 0.0], [2.0, 0.0], [4.0, 0.0]]))
    >>> P[:, 0].tolist(), P[:, 1].tolist(), share.tolist()
    ([-2.0, 0.0, 2.0], [0.0, 0.0, 0.0], [1.0, 0.0])
    """
    n = len(X)
    out = np.zeros((n, k))
    share = np.zeros(k)
    if n == 0:
        return out, share
    scale = float(np.max(np.abs(X)))
    if not np.isfinite(scale) or scale == 0.0:
        return out, share
    centred = X / scale
    centred -= centred.mean(axis=0)
    _, s, Vt = np.linalg.svd(centred, full_matrices=False)
    m = min(k, len(s))
    axes = Vt[:m]
    flip = np.sign(axes[np.arange(m), np.argmax(np.abs(axes), axis=1)])
    axes = axes * np.where(flip == 0, 1.0, flip)[:, None]
    with np.errstate(over="ignore"):
        out[:, :m] = (centred @ axes.T) * scale
    total = float(np.sum(s**2))
    if total > 0:
        share[:m] = s[:m] ** 2 / total
    return out, share
