"""The binary array formats of the API: ``.npz`` bodies in, ``.npy`` / ``.npz`` answers out.

Reading never unpickles and never trusts a header: :func:`npz_arrays` parses each member's
``.npy`` header itself (float32 or float64 only) and reads its data only within the body
limit. Writing is NumPy's own (``np.save`` / ``np.savez``, no pickle). Bad bytes are a 422
problem naming the body or the array, as :mod:`service.api.parsing` words every other field.

>>> import numpy as np
>>> arrays = npz_arrays(npz_bytes(a=np.ones(3), b=np.zeros((2, 3), "f4")), {"a": 1, "b": 2}, 1024)
>>> {name: (arr.dtype.name, arr.shape) for name, arr in arrays.items()}
{'a': ('float64', (3,)), 'b': ('float64', (2, 3))}
>>> npz_arrays(npz_bytes(a=np.ones((2, 2))), {"a": 1}, 1024)
Traceback (most recent call last):
...
service.errors.InvalidInput: body.a: expected shape (d,), got shape (2, 2)
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
from typing import IO, Any

import numpy as np

from service.core._validation import Array
from service.errors import InvalidInput

NPZ = "application/x-npz"
NPY = "application/x-npy"


def _invalid(loc: list[str | int], msg: str) -> InvalidInput:
    """A 422 for the array at ``loc`` (the wording of :func:`service.api.parsing.invalid`)."""
    where = ".".join(str(p) for p in loc)
    return InvalidInput(f"{where}: {msg}", [{"loc": loc, "msg": msg, "type": "value_error"}])


#: Item sizes of the float dtypes a binary array may have (either byte order); computed in
#: float64.
_FLOAT_SIZES = (4, 8)


def npz_arrays(
    data: bytes, shapes: dict[str, int], max_bytes: int, *, required: bool = True
) -> dict[str, Array]:
    """The float arrays ``name -> ndim`` of an ``.npz`` body (``np.savez``, stored or
    compressed), as float64; a 422 problem naming the body or the array otherwise. With
    ``required=False`` an array missing from the body is left out of the answer.

    Nothing is unpickled or trusted: each member's ``.npy`` header is parsed first (float32 or
    float64 only, so an object array is never read), and its data is read only when the
    header's size keeps all arrays together, as float64, within ``max_bytes`` (so a compressed
    body cannot inflate beyond the body limit). Other members are refused, like unknown JSON
    fields. A stored (uncompressed, ``np.savez``) float64 member is used in place: no copy and
    no CRC pass over its bytes (~4 ms for 10 MB; TCP already checks the transfer).
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = {info.filename: info for info in archive.infolist()}
    except Exception as exc:  # garbage: BadZipFile, but also struct/zlib/encoding errors
        raise _invalid(["body"], f"not an .npz archive ({type(exc).__name__})") from None
    for member in members:
        if member.removesuffix(".npy") not in shapes:
            raise _invalid(["body"], f"unexpected member {member!r}; expected {sorted(shapes)}")
    budget = max_bytes
    out: dict[str, Array] = {}
    for name, ndim in shapes.items():
        info = members.get(name + ".npy")
        if info is None:
            if not required:
                continue
            raise _invalid(["body", name], "missing from the .npz archive")
        loc: list[str | int] = ["body", name]
        try:
            arr = _npy_member(data, archive, info, loc, ndim, budget)
        except InvalidInput:
            raise
        except Exception as exc:  # a corrupt member: zlib, CRC, header syntax, EOF, encryption
            raise _invalid(loc, f"not a readable .npy member ({type(exc).__name__})") from None
        out[name] = np.asarray(arr, dtype=np.float64)
        budget -= out[name].nbytes
    return out


#: A local file header: signature, 22 bytes, file name length, extra field length.
_LOCAL_HEADER = struct.Struct("<4s22xHH")
#: Enough bytes for any .npy header ``read_array_header_*`` accepts (at most 10,000 bytes).
_HEADER_PEEK = 16384


def _npy_member(
    data: bytes,
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    loc: list[str | int],
    ndim: int,
    budget: int,
) -> Array:
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:  # not encrypted
        signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(data, info.header_offset)
        if signature != b"PK\x03\x04":
            raise zipfile.BadZipFile("bad local file header")
        start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        peek = io.BytesIO(data[start : start + min(info.file_size, _HEADER_PEEK)])
        shape, fortran, dtype, count = _npy_header(peek, loc, ndim, budget)
        offset = start + peek.tell()
        if offset + count * dtype.itemsize > min(start + info.file_size, len(data)):
            raise _invalid(loc, "truncated: fewer data bytes than its header says")
        flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    else:
        with archive.open(info) as f:
            shape, fortran, dtype, count = _npy_header(f, loc, ndim, budget)
            raw = f.read(count * dtype.itemsize)
        if len(raw) != count * dtype.itemsize:
            raise _invalid(loc, "truncated: fewer data bytes than its header says")
        flat = np.frombuffer(raw, dtype=dtype)
    arr: Array = flat.reshape(shape, order="F" if fortran else "C")
    return arr


def _npy_header(
    f: IO[bytes], loc: list[str | int], ndim: int, budget: int
) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """Shape, order, dtype and value count of a ``.npy`` header, all checked."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise _invalid(loc, f"unsupported .npy format version {version}")
    if dtype.kind != "f" or dtype.itemsize not in _FLOAT_SIZES:
        raise _invalid(loc, f"must hold float64 or float32 values, got dtype {dtype}")
    if len(shape) != ndim or 0 in shape:
        want = "(d,)" if ndim == 1 else "(n, d) with n >= 1"
        raise _invalid(loc, f"expected shape {want}, got shape {tuple(shape)}")
    count = math.prod(shape)
    if count * 8 > budget:
        raise _invalid(loc, f"{count} values: over OPML_MAX_BODY_BYTES as float64")
    return tuple(shape), bool(fortran), dtype, count


def npy_bytes(values: Array) -> bytes:
    """``values`` as ``.npy`` bytes (``np.save``, no pickle)."""
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    return buf.getvalue()


def npz_bytes(**arrays: Any) -> bytes:
    """``arrays`` as ``.npz`` bytes (``np.savez``, stored); give no object arrays, so that
    ``np.load(..., allow_pickle=False)`` reads the answer."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def wants(accept: str | None, media: str) -> bool:
    """``Accept`` asks for ``media`` (``.npy`` or ``.npz`` bytes)."""
    return bool(accept) and media in accept  # type: ignore[operator]


def wants_npy(accept: str | None) -> bool:
    """``Accept`` asks for ``.npy`` bytes."""
    return wants(accept, NPY)
