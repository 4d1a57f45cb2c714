"""Labelled samples read from CSV, NPY or NPZ files for ``opml ingest``.

Labels come from a column of the data (``label_column``: an index, negative from the end, or a
CSV header name; the last column by default) or, when ``labels_path`` is given, from a file of
their own (``.npy``, or text with one label per line) and then every data column is a feature.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "s.csv"
>>> _ = path.write_text("a,b,kind\\n0.5,1,cat\\n2,3,dog\\n")
>>> data = load(path)
>>> data.X.tolist(), data.y
([[0.5, 1.0], [2.0, 3.0]], ['cat', 'dog'])
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clients.types import Array


@dataclass(frozen=True)
class Samples:
    """Features ``X`` (n x d), labels ``y`` and a digest naming exactly this input."""

    X: Array
    y: list[Any]
    digest: str


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _column_index(spec: str | None, header: list[str] | None, width: int) -> int:
    if spec is None:
        return width - 1
    if header is not None and spec in header:
        return header.index(spec)
    try:
        index = int(spec)
    except ValueError:
        raise ValueError(f"--label-column: no column named {spec!r}") from None
    if not -width <= index < width:
        raise ValueError(f"--label-column: {index} is outside the {width} columns")
    return index % width


def _csv_label(cell: str) -> Any:
    """A label cell: float-formatted integers (``3.0``, ``1e+00``, as numeric writers emit them)
    mean the integer; anything else stays the string it is."""
    if cell.isdigit() or not _is_number(cell):
        return cell
    value = float(cell)
    return int(value) if value.is_integer() else cell


def _read_csv(path: Path, label_column: str | None, with_labels: bool) -> tuple[Array, list[Any]]:
    with path.open(newline="") as handle:
        rows = [row for row in csv.reader(handle, skipinitialspace=True) if row]
    if not rows:
        raise ValueError(f"{path}: no rows")
    width = len(rows[0])
    named = with_labels and label_column is not None and label_column in rows[0]
    col = -1
    if with_labels and not named:
        col = _column_index(label_column, None, width)
    if named or not all(_is_number(cell) for i, cell in enumerate(rows[0]) if i != col):
        header, rows = rows[0], rows[1:]
        if with_labels:
            col = _column_index(label_column, header, width)
    if any(len(row) != width for row in rows):
        raise ValueError(f"{path}: rows have different numbers of columns")
    features = [[cell for i, cell in enumerate(row) if i != col] for row in rows]
    try:
        X = np.asarray(features, dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"{path}: a feature is not a number ({exc})") from None
    return X, [_csv_label(row[col]) for row in rows] if with_labels else []


def _split(arr: Any, label_column: str | None, path: Path) -> tuple[Array, list[Any]]:
    data = np.asarray(arr)
    if data.ndim != 2 or data.shape[1] < 2:
        raise ValueError(f"{path}: expected a 2-D array with a label column, got {data.shape}")
    col = _column_index(label_column, None, data.shape[1])
    X = np.delete(data, col, axis=1).astype(np.float64)
    return X, data[:, col].tolist()


def _read_labels(path: Path) -> list[Any]:
    if path.suffix == ".npy":
        out: list[Any] = np.load(path, allow_pickle=False).ravel().tolist()
        return out
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def load(
    path: Path,
    *,
    label_column: str | None = None,
    labels_path: Path | None = None,
    x_key: str = "X",
    y_key: str = "y",
) -> Samples:
    """The samples of ``path`` (``.csv``, ``.npy`` or ``.npz``); ValueError if unreadable."""
    suffix = path.suffix.lower()
    external = labels_path is not None
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:
            key = x_key if x_key in npz.files else x_key.lower()
            if key not in npz.files:
                raise ValueError(f"{path}: no array {x_key!r} (has {', '.join(npz.files)})")
            if external or y_key in npz.files:
                X = np.asarray(npz[key], dtype=np.float64)
                y = [] if external else npz[y_key].ravel().tolist()
            else:
                X, y = _split(npz[key], label_column, path)
    elif suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        X, y = (
            (np.asarray(arr, dtype=np.float64), []) if external else _split(arr, label_column, path)
        )
    else:
        X, y = _read_csv(path, label_column, not external)
    if labels_path is not None:
        y = _read_labels(labels_path)
    if X.ndim != 2 or len(X) == 0:
        raise ValueError(f"{path}: expected a non-empty 2-D array of features, got {X.shape}")
    if len(y) != len(X):
        raise ValueError(f"{path}: {len(X)} rows but {len(y)} labels")
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(X).tobytes())
    digest.update(repr(y).encode())
    return Samples(X, y, digest.hexdigest()[:16])
