"""Checking and converting what a caller passes (vectors, matrices, labels, holdout flags,
gallery ids) into the JSON the service reads, with a ValueError naming the argument otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.types import Array, ItemId, Label


def _floats(value: Any, name: str) -> Array:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not a numeric array ({exc})") from None


def finite(value: Any, name: str, ndim: int, *, keep_float32: bool = False) -> Array:
    """``value`` as a non-empty, finite ``ndim``-D float64 array (1: a vector, 2: a matrix);
    ValueError naming ``name`` (and the first bad row) otherwise. ``keep_float32``: a float32
    numpy array stays float32 (the ``.npz`` gallery: half the bytes, exact in float64).

    >>> finite([[1, 2], [3, float("nan")]], "X", 2)
    Traceback (most recent call last):
    ValueError: X: row 1 contains NaN or Inf
    """
    keep = keep_float32 and isinstance(value, np.ndarray) and value.dtype == np.float32
    arr: Array = value if keep else _floats(value, name)
    if arr.ndim != ndim or arr.size == 0:
        kind = "vector" if ndim == 1 else "2-D matrix"
        raise ValueError(f"{name}: expected a non-empty {kind}, got shape {arr.shape}")
    ok = np.isfinite(arr)
    if not ok.all():
        if ndim == 1:
            raise ValueError(f"{name}: contains NaN or Inf")
        bad = int(np.flatnonzero(~ok.all(axis=1))[0])
        raise ValueError(f"{name}: row {bad} contains NaN or Inf")
    return arr


def vector(value: Any, name: str) -> list[float]:
    """A finite 1-D vector (list, tuple or numpy array) as a JSON list."""
    out: list[float] = finite(value, name, 1).tolist()
    return out


def matrix(value: Any, name: str) -> list[list[float]]:
    """A finite 2-D matrix with at least one row as a JSON list of lists."""
    out: list[list[float]] = finite(value, name, 2).tolist()
    return out


def label(value: Any, name: str = "y") -> Label:
    """A label as the contract knows it: an int, or a string of 1-128 characters.

    Integral floats (labels read from a numeric file) become ints; numpy scalars plain ones.

    >>> label(np.int64(3)), label(2.0), label("cat")
    (3, 2, 'cat')
    """
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name}: a label is a string or an integer, got a boolean")
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        if not float(value).is_integer():
            raise ValueError(f"{name}: a numeric label must be an integer, got {value!r}")
        return int(value)
    if isinstance(value, str):
        if not 1 <= len(value) <= 128:
            raise ValueError(f"{name}: a label has 1 to 128 characters, got {len(value)}")
        return value
    raise ValueError(f"{name}: a label is a string or an integer, got {type(value).__name__}")


def labels(values: Any, n: int) -> list[Label]:
    """``n`` labels from a sequence or 1-D array."""
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if len(seq) != n:
        raise ValueError(f"y: expected {n} labels, got {len(seq)}")
    return [label(v, f"y[{i}]") for i, v in enumerate(seq)]


def samples(X: Any, y: Any, holdout: Any = None) -> list[dict[str, Any]]:
    """Rows of ``X`` with their labels as ``[{x, y}, ...]``; ``holdout``: booleans, True for
    the rows to route to the certification reservoir (``"holdout": true``).

    >>> samples([[1.0], [2.0]], ["a", "b"], holdout=[False, True])[1]
    {'x': [2.0], 'y': 'b', 'holdout': True}
    """
    rows = matrix(X, "X")
    return sample_docs(rows, labels(y, len(rows)), holdout_flags(holdout, len(rows)))


def holdout_flags(value: Any, n: int) -> list[bool] | None:
    """``n`` booleans (True: to the certification reservoir) from a sequence or array, or None
    when none is set; one boolean applies to all ``n``.

    >>> holdout_flags(np.array([False, True]), 2), holdout_flags(None, 2), holdout_flags(True, 2)
    ([False, True], None, [True, True])
    """
    if value is None or value is False:
        return None
    if value is True:
        return [True] * n
    flags = np.asarray(value)
    if flags.dtype != np.bool_ or flags.shape != (n,):
        got = f"{flags.dtype} of shape {flags.shape}"
        raise ValueError(f"holdout: expected {n} booleans, got {got}")
    return flags.tolist() if flags.any() else None


def sample_docs(
    rows: list[list[float]], ys: list[Label], holdout: list[bool] | None = None
) -> list[dict[str, Any]]:
    """``[{x, y}, ...]`` of rows already checked and their labels (``holdout: true`` on the
    flagged ones)."""
    docs: list[dict[str, Any]] = [{"x": x, "y": lab} for x, lab in zip(rows, ys, strict=True)]
    for doc, held in zip(docs, holdout or [], strict=False):
        if held:
            doc["holdout"] = True
    return docs


def item_ids(values: Any, n: int) -> list[ItemId]:
    """``n`` gallery ids: ints, or strings of 1-256 characters (as labels, integral numbers
    from a numeric file become ints).

    >>> item_ids(np.array([3.0, 4.0]), 2), item_ids(["a", 7], 2)
    ([3, 4], ['a', 7])
    """
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if len(seq) != n:
        raise ValueError(f"ids: expected {n} ids, got {len(seq)}")
    out: list[ItemId] = []
    for i, value in enumerate(seq):
        if isinstance(value, str) and not 1 <= len(value) <= 256:
            raise ValueError(f"ids[{i}]: an id has 1 to 256 characters, got {len(value)}")
        out.append(value if isinstance(value, str) else label(value, f"ids[{i}]"))
    return out
