"""How values are laid out in Redis: vector bytes, log entry ids.

Vectors, ``L`` and the calibration window are stored as raw little-endian float64 bytes
(:data:`DTYPE`, the one place the dtype is stated).

The ingestion log is a Redis Stream. One entry holds the samples of one request or WebSocket
frame, so Redis and the writer pay per frame, not per sample: fields ``n`` (the count), ``x``
(the (n, d) block, row-major :data:`DTYPE` bytes) and ``y`` (the n class keys, a JSON array).
Its id encodes the seq of its LAST sample: samples ``s-n+1 .. s`` are entry ``s-1``. A metric
replacement (``PUT metric``) logged after sample ``s`` is ``s-k`` with
``k >= 2``, so it sorts after the entry ending at ``s`` and before the next one, without
consuming a seq. "Has seq ``s`` been applied?" is then "is the applied position ``>= s-1``?".
An entry some of whose samples the caller flagged ``holdout`` has a field ``h``: one ASCII
``0``/``1`` per sample (:func:`encode_flags`); the writer replays it, so routing is exact.

>>> parse_id(b"12-1")
(12, 1)
>>> format_id((12, 1)), sample_id(12), after((12, 3))
('12-1', '12-1', '12-4')
>>> decode_vector(encode_vector(np.array([1.5, -2.0])), 2).tolist()
[1.5, -2.0]
>>> decode_labels(encode_labels(["a", "7", 'q"x']))
['a', '7', 'q"x']
>>> X, keys = decode_entry({b"n": b"2", b"x": encode_vector(np.eye(2)), b"y": b'["a","b"]'}, 2)
>>> X.tolist(), keys
([[1.0, 0.0], [0.0, 1.0]], ['a', 'b'])

A gallery item (the hash ``opml:{name}:gallery``, field = the item's key) is ``uint32 LE
header length | JSON {"id", "y"} | d float64 values``: its id and label as enrolled (an integer
stays an integer; ``y`` null when none) and its vector as sent (not normalised).

>>> item_id, y, x = decode_gallery_item(encode_gallery_item(7, "ann", np.array([0.5, 1.0])), 2)
>>> item_id, y, x.tolist()
(7, 'ann', [0.5, 1.0])

>>> encode_flags(np.array([True, False])), entry_flags({b"h": b"10"}, 2).tolist()
(b'10', [True, False])
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.core._validation import Array

#: dtype of every stored vector and matrix: little-endian IEEE 754 float64.
DTYPE = np.dtype("<f8")

#: Stream id parts of a sample entry: ``<seq>-SAMPLE_PART``.
SAMPLE_PART = 1

StreamId = tuple[int, int]


def encode_vector(x: Array) -> bytes:
    """Raw bytes of a float64 array (any shape, C order)."""
    return np.ascontiguousarray(x, dtype=DTYPE).tobytes()


def block_bytes(X: Array) -> bytes | memoryview:
    """The bytes of a block of samples as :func:`encode_vector` gives them; a view of them, not
    a copy, when ``X`` is a read-only float64 view of an immutable ``bytes`` (a binary frame's
    block as received), so that nothing can change them before they are logged.

    >>> raw = np.arange(4.0).tobytes()
    >>> view = block_bytes(np.frombuffer(raw, dtype=DTYPE).reshape(2, 2))
    >>> type(view).__name__, bytes(view) == raw
    ('memoryview', True)
    >>> type(block_bytes(np.arange(4.0))).__name__  # writable: copied
    'bytes'
    """
    if X.dtype == DTYPE and X.flags.c_contiguous and not X.flags.writeable:
        base: Any = X
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        if type(base) is bytes:
            return memoryview(X.data).cast("B")
    return encode_vector(X)


def decode_vector(raw: bytes, n: int) -> Array:
    """``n`` float64 values from raw bytes (ValueError if the length is wrong)."""
    if len(raw) != n * DTYPE.itemsize:
        raise ValueError(f"stored array: expected {n} float64 values, got {len(raw)} bytes")
    return np.frombuffer(raw, dtype=DTYPE).astype(np.float64)


#: What JSON escapes in a string (``ensure_ascii=False``): quote, backslash, control characters.
_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def encode_labels(keys: list[str]) -> bytes:
    r"""A log entry's ``y``: its class keys as a compact JSON array (written directly when no
    key needs an escape, the common case: the same bytes, ~5x cheaper).

    >>> encode_labels(["a", "7"]), encode_labels(['say "hi"'])
    (b'["a","7"]', b'["say \\"hi\\""]')
    """
    if _ESCAPED.search("".join(keys)) is None:
        return ('["' + '","'.join(keys) + '"]').encode()
    return json.dumps(keys, separators=(",", ":"), ensure_ascii=False).encode()


def decode_labels(raw: bytes) -> list[str]:
    keys = json.loads(raw)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("stored labels: expected a JSON array of strings")
    return keys


def decode_entry(fields: dict[bytes, bytes], d: int) -> tuple[Array, list[str]]:
    """The (n, d) samples and n class keys of a sample entry of the log."""
    n = int(fields[b"n"])
    keys = decode_labels(fields[b"y"])
    if len(keys) != n:
        raise ValueError(f"stored entry: {n} samples but {len(keys)} labels")
    return decode_vector(fields[b"x"], n * d).reshape(n, d), keys


def encode_flags(flags: NDArray[np.bool_] | None) -> bytes:
    """A log entry's ``h``: ``b"0"``/``b"1"`` per sample; ``b""`` (no field) for None."""
    if flags is None:
        return b""
    return np.where(flags, ord("1"), ord("0")).astype(np.uint8).tobytes()


def entry_flags(fields: dict[bytes, bytes], n: int) -> NDArray[np.bool_] | None:
    """The ``holdout`` flags of a sample entry's ``n`` samples (None: no field, none set)."""
    raw = fields.get(b"h")
    if raw is None:
        return None
    if len(raw) != n or raw.strip(b"01"):
        raise ValueError(f"stored entry: holdout flags {raw[:32]!r} for {n} samples")
    flags: NDArray[np.bool_] = np.frombuffer(raw, dtype=np.uint8) == ord("1")
    return flags


def sample_id(seq: int) -> str:
    """The id of the log entry position at which sample ``seq`` counts as applied."""
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


_ITEM_HEADER = struct.Struct("<I")


def encode_gallery_item(item_id: int | str, y: Any, x: Array) -> bytes:
    """A gallery item's stored value: its id and label as enrolled, then its vector."""
    header = json.dumps({"id": item_id, "y": y}, separators=(",", ":"), ensure_ascii=False)
    raw = header.encode()
    return _ITEM_HEADER.pack(len(raw)) + raw + encode_vector(x)


def decode_gallery_item(raw: bytes, d: int) -> tuple[int | str, Any, Array]:
    """``(id, y, x)`` of a stored gallery item (ValueError if the bytes do not fit ``d``)."""
    (size,) = _ITEM_HEADER.unpack_from(raw)
    start = _ITEM_HEADER.size + size
    header = json.loads(raw[_ITEM_HEADER.size : start])
    return header["id"], header["y"], decode_vector(raw[start:], d)
