"""How values are laid out in Redis: vector bytes, log entry ids.

Vectors, ``L`` and the calibration window are stored as raw little-endian float64 bytes
(:data:`DTYPE`, the one place the dtype is stated). The ingestion log is a Redis Stream whose
entry ids encode the sample seq: sample ``s`` is ``s-1``; a metric replacement (``PUT metric``)
logged after sample ``s`` is ``s-k`` with ``k >= 2``, so it sorts after sample ``s`` and before
sample ``s + 1`` without consuming a seq.

>>> parse_id(b"12-1")
(12, 1)
>>> format_id((12, 1)), sample_id(12), after((12, 3))
('12-1', '12-1', '12-4')
>>> decode_vector(encode_vector(np.array([1.5, -2.0])), 2).tolist()
[1.5, -2.0]
"""

from __future__ import annotations

import numpy as np

from service.core._validation import Array

#: dtype of every stored vector and matrix: little-endian IEEE 754 float64.
DTYPE = np.dtype("<f8")

#: Stream id parts of a sample entry: ``<seq>-SAMPLE_PART``.
SAMPLE_PART = 1

StreamId = tuple[int, int]


def encode_vector(x: Array) -> bytes:
    """Raw bytes of a float64 array (any shape, C order)."""
    return np.ascontiguousarray(x, dtype=DTYPE).tobytes()


def decode_vector(raw: bytes, n: int) -> Array:
    """``n`` float64 values from raw bytes (ValueError if the length is wrong)."""
    if len(raw) != n * DTYPE.itemsize:
        raise ValueError(f"stored array: expected {n} float64 values, got {len(raw)} bytes")
    return np.frombuffer(raw, dtype=DTYPE).astype(np.float64)


def sample_id(seq: int) -> str:
    """The log entry id of sample ``seq``."""
    return f"{seq}-{SAMPLE_PART}"


def parse_id(raw: bytes | str) -> StreamId:
    """``b"12-1"`` -> ``(12, 1)``."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, part = text.partition("-")
    return int(ms), int(part)


def format_id(entry: StreamId) -> str:
    return f"{entry[0]}-{entry[1]}"


def after(entry: StreamId) -> str:
    """The smallest id greater than ``entry`` (for XTRIM MINID / exclusive ranges)."""
    return f"{entry[0]}-{entry[1] + 1}"
