"""The one place where request values become arrays the core can trust.

Shapes and finiteness are checked by the core's validators (:mod:`service.core._validation`);
their ``ValueError`` becomes a 422 problem whose ``errors`` item points at the bad field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from service.core._validation import Array, check_matrix, check_metric, check_vector, label_key
from service.errors import InvalidInput
from service.models.schemas import MAX_LABEL_CHARS, Sample

T = TypeVar("T")


def invalid(loc: list[str | int], msg: str) -> InvalidInput:
    """A 422 for the field at ``loc``."""
    where = ".".join(str(p) for p in loc)
    return InvalidInput(f"{where}: {msg}", [{"loc": loc, "msg": msg, "type": "value_error"}])


def _checked(loc: list[str | int], fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        raise invalid(loc, str(exc).split(": ", 1)[-1]) from None


def vector(value: Sequence[float], dim: int, loc: list[str | int]) -> Array:
    """A finite float64 vector of length ``dim``."""
    return _checked(loc, lambda: check_vector(value, dim, str(loc[-1])))


def matrix(value: Sequence[Sequence[float]], dim: int, loc: list[str | int]) -> Array:
    """A finite float64 matrix with ``dim`` columns (ragged rows are rejected)."""
    for i, row in enumerate(value):
        if len(row) != dim:
            raise invalid([*loc, i], f"expected a vector of length {dim}, got {len(row)} values")
    return _checked(loc, lambda: check_matrix(value, dim, str(loc[-1])))


def metric(value: Sequence[Sequence[float]], dim: int) -> Array:
    """A finite ``dim x dim`` matrix within the core's entry bound."""
    return _checked(["body", "L"], lambda: check_metric(value, dim, "L"))


def label(value: Any, loc: list[str | int]) -> str:
    """The class key of a label (integers as their decimal string), at most 128 characters."""
    key = _checked(loc, lambda: label_key(value, str(loc[-1])))
    if len(key) > MAX_LABEL_CHARS:
        raise invalid(loc, f"a label has at most {MAX_LABEL_CHARS} characters")
    return key


def samples(
    items: list[Sample], dim: int, loc: list[str | int], indexed: bool
) -> tuple[Array, list[str]]:
    """The rows and class keys of a request's samples, all validated before anything runs.

    ``loc`` locates the samples in the request (``indexed``: a list, so items add their index).
    """
    fast = _samples_fast(items, dim)
    if fast is not None:
        return fast
    # Something is wrong (or unusual): the per-row checks name the first bad element.
    X = np.empty((len(items), dim))
    keys = []
    for i, s in enumerate(items):
        where: list[str | int] = [*loc, i] if indexed else list(loc)
        X[i] = vector(s.x, dim, [*where, "x"])
        keys.append(label(s.y, [*where, "y"]))
    return X, keys


def _samples_fast(items: list[Sample], dim: int) -> tuple[Array, list[str]] | None:
    """The common case in one ``np.array`` and one ``isfinite``; None if any check fails
    (then :func:`samples` redoes it row by row to say where)."""
    if any(len(s.x) != dim for s in items):
        return None
    try:
        X = np.array([s.x for s in items], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return None
    if X.shape != (len(items), dim) or not np.isfinite(X).all():
        return None
    keys = []
    for s in items:
        y = s.y
        if type(y) is str:
            key = y
        elif type(y) is int:
            key = str(y)
        else:
            return None
        if not key or len(key) > MAX_LABEL_CHARS:
            return None
        keys.append(key)
    return X, keys


@dataclass(frozen=True)
class Block:
    """The samples of a binary WebSocket frame: an (n, d) float64 block (shape checked, values
    not yet) and its n labels as sent."""

    X: Array
    y: list[Any]

    def __len__(self) -> int:
        return len(self.y)


def block(b: Block) -> tuple[Array, list[str]]:
    """The rows and class keys of a binary frame; a 422 names the first non-finite row
    (``block.<row>``) or bad label (``y.<i>``)."""
    X = b.X
    if not np.isfinite(X).all():
        bad = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
        raise invalid(["block", bad], "contains NaN or Inf")
    return X, [label(v, ["y", i]) for i, v in enumerate(b.y)]


def fingerprint(X: Array, keys: list[str]) -> str:
    """A digest of a request's samples (an idempotency key reused with other samples is 409)."""
    h = hashlib.sha256(np.ascontiguousarray(X).tobytes())
    h.update("\x00".join(keys).encode())
    return h.hexdigest()[:32]


def finite_or_422(values: Array, what: str) -> Array:
    """``values`` if all finite; else 422 (a float64 overflow must not become JSON Infinity)."""
    if not np.isfinite(values).all():
        raise InvalidInput(
            f"{what} overflows float64 for these inputs; scale the inputs down",
            [{"loc": ["body"], "msg": f"{what} overflows float64", "type": "overflow"}],
        )
    return values
