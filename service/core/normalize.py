"""Input normalisation: every sample and query vector scaled to unit L2 norm (``normalize="l2"``).

The learner normalises the rows it learns, the metric view those it queries, with the same
compiled kernel, so a query vector is normalised exactly as the sample it is compared with was.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from service.core._validation import Array
from service.core.config import Normalize


def normalize_rows(X: Array, how: Normalize) -> Array:
    """Rows of ``X`` scaled to unit L2 norm (``how="l2"``; a zero row stays zero), else ``X``.

    Overflow-safe: each row is divided by its largest magnitude before its norm is taken.

    >>> normalize_rows(np.array([[3.0, 4.0], [0.0, 0.0], [1e300, 1e300]]), "l2").round(6).tolist()
    [[0.6, 0.8], [0.0, 0.0], [0.707107, 0.707107]]
    >>> normalize_rows(np.array([[3.0, 4.0]]), "none").tolist()
    [[3.0, 4.0]]
    """
    if how == "none":
        return X
    return _unit_rows(X, np.empty(X.shape))


def _unit_rows(X: Array, out: Array) -> Array:
    """``X``'s rows at unit L2 norm, written into ``out`` (:func:`_unit_rows_into`)."""
    _unit_rows_into(np.ascontiguousarray(X, dtype=np.float64), out)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def _unit_rows_into(X: Array, out: Array) -> None:
    """Row by row, ``y = x / max|x|``, then ``y / ||y||`` into ``out`` (a zero row stays
    zero). One compiled pass that holds no GIL: in the service this runs in the learner's
    thread beside a busy event loop, where each of the six NumPy calls it replaces waited for
    the GIL on its return (a fifth of a batch's time at d = 64)."""
    n, d = X.shape
    for i in range(n):
        scale = 0.0
        for j in range(d):
            scale = max(scale, abs(X[i, j]))
        if scale == 0.0:
            scale = 1.0
        total = 0.0
        for j in range(d):
            v = X[i, j] / scale
            out[i, j] = v
            total += v * v
        norm = math.sqrt(total)
        if norm == 0.0:
            norm = 1.0
        for j in range(d):
            out[i, j] = out[i, j] / norm


def normalized_minus(X: Array, how: Normalize, A: Array, out: Array) -> Array:
    """``normalize_rows(X, how) - A`` written into ``out``: bit for bit the same operations,
    without a temporary per step (one allocation fewer per block of a one-to-many query)."""
    if how == "none":
        return np.subtract(X, A, out=out)
    return np.subtract(_unit_rows(X, out), A, out=out)
