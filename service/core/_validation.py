"""The one place that validates what enters the core: vectors, matrices, labels.

Every error is a ``ValueError`` whose message starts with the name of the bad argument, and
nothing is validated twice: the learner validates once, then works on trusted arrays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

Array = NDArray[np.float64]

#: The largest magnitude any entry of ``L`` may reach (see :mod:`service.core.update`).
#: Squared distances of inputs up to ~1e75 then stay finite in float64.
MAX_ABS_ENTRY = 1e150


def as_float_array(value: Any, name: str) -> Array:
    """``value`` as a float64 ndarray; ValueError naming ``name`` when that is impossible."""
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        return value
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested lists and the like
        raise ValueError(f"{name}: not a numeric array ({exc})") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name}: must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def check_vector(value: Any, dim: int, name: str = "x") -> Array:
    """A finite float64 vector of length ``dim``."""
    arr = as_float_array(value, name)
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise ValueError(f"{name}: expected a vector of length {dim}, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or Inf")
    return arr


def check_matrix(value: Any, dim: int, name: str = "X") -> Array:
    """A finite float64 matrix with ``dim`` columns (and at least one row)."""
    arr = as_float_array(value, name)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"{name}: expected shape (n, {dim}), got shape {arr.shape}")
    if not all_finite(np.ascontiguousarray(arr)):
        bad = int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])
        raise ValueError(f"{name}: row {bad} contains NaN or Inf")
    return arr


@njit(cache=True)
def all_finite(X: Array) -> bool:
    """Whether every entry of the matrix ``X`` is finite: one compiled pass that keeps the
    GIL (``np.isfinite(X).all()`` is two NumPy calls that each release it and wait for it
    again, which in the service's learner thread, behind a busy event loop, costs up to a
    switch interval each).

    >>> all_finite(np.ones((2, 2))), all_finite(np.array([[1.0, np.nan]]))
    (True, False)
    """
    for row in X:
        for v in row:
            if not math.isfinite(v):
                return False
    return True


def check_metric(value: Any, dim: int, name: str = "L") -> Array:
    """A finite ``dim x dim`` matrix whose entries stay within :data:`MAX_ABS_ENTRY`."""
    arr = as_float_array(value, name)
    if arr.shape != (dim, dim):
        raise ValueError(f"{name}: expected shape ({dim}, {dim}), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or Inf")
    if arr.size and float(np.abs(arr).max()) > MAX_ABS_ENTRY:
        raise ValueError(f"{name}: entries must not exceed {MAX_ABS_ENTRY:g} in magnitude")
    return arr


def label_key(value: Any, name: str = "y") -> str:
    """The canonical class key of a label: an integer means its decimal string.

    >>> label_key(3) == label_key("3") == "3"
    True
    """
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name}: a label is a string or an integer, got a boolean")
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{name}: a label must not be empty")
        return value
    raise ValueError(f"{name}: a label is a string or an integer, got {type(value).__name__}")


def label_keys(labels: list[Any], name: str = "y") -> list[str]:
    """The class keys of a list of labels (:func:`label_key` of each; a bad one is named
    ``name[i]``).

    Plain labels, the common case, are converted in one pass (:func:`plain_keys`: a batch
    costs ~4x less); anything else is checked element by element.

    >>> label_keys([3, "a"])
    ['3', 'a']
    >>> label_keys(["a", ""])
    Traceback (most recent call last):
    ...
    ValueError: y[1]: a label must not be empty
    """
    keys = plain_keys(labels)
    if keys is None:
        return [label_key(value, f"{name}[{i}]") for i, value in enumerate(labels)]
    return keys


def plain_keys(labels: list[Any]) -> list[str] | None:
    """The class keys of labels that are all non-empty Python strings or integers, in one
    pass without naming each element; None if any is not (then :func:`label_key`, element by
    element, names the first bad one).

    >>> plain_keys([3, "a"]), plain_keys([3, True]), plain_keys([""])
    (['3', 'a'], None, None)
    """
    keys: list[str] = []
    append = keys.append
    for value in labels:
        kind = type(value)
        if kind is str and value:
            append(value)
        elif kind is int:
            append(str(value))
        else:
            return None
    return keys


def _number(value: Any, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a number, got {value!r}") from None
    return out


def check_positive(value: Any, name: str) -> float:
    """A finite float > 0."""
    out = _number(value, name)
    if not np.isfinite(out) or out <= 0:
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return out


def check_nonnegative(value: Any, name: str) -> float:
    """A finite float >= 0."""
    out = _number(value, name)
    if not np.isfinite(out) or out < 0:
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return out


def check_range(value: Any, name: str, low: float, high: float) -> float:
    """A finite float in ``(low, high]``; ValueError naming ``name`` and the range otherwise.

    >>> check_range(0.5, "gamma", 0.0, 1.0)
    0.5
    >>> check_range(1e300, "gamma", 0.0, 1.0)
    Traceback (most recent call last):
    ...
    ValueError: gamma: must be in (0, 1], got 1e+300
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    out = _number(value, name)
    if not (math.isfinite(out) and low < out <= high):
        raise ValueError(f"{name}: must be in ({low:g}, {high:g}], got {value!r}")
    return out


def check_int(value: Any, name: str, low: int, high: int) -> int:
    """An integer (not a bool, float or string) in ``[low, high]``.

    >>> check_int("64", "dim", 1, 32768)
    Traceback (most recent call last):
    ...
    ValueError: dim: must be an integer, got '64'
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    out = int(value)
    if not low <= out <= high:
        raise ValueError(f"{name}: must be in [{low}, {high}], got {out}")
    return out


def check_threshold(value: Any) -> float:
    """A verification threshold: a finite number >= 0 (a squared distance).

    >>> check_threshold(2), check_threshold(0.5)
    (2.0, 0.5)
    >>> check_threshold(float("inf"))
    Traceback (most recent call last):
    ...
    ValueError: threshold: must be a finite number >= 0, got inf
    """
    try:
        theta = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"threshold: must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(theta) or theta < 0.0:
        raise ValueError(f"threshold: must be a finite number >= 0, got {value!r}")
    return theta
