"""The C allocator's thresholds for large buffers, raised at start-up (glibc only).

A binary WebSocket frame, its reassembly and the learner's batch arrays are each hundreds of
kilobytes. By default glibc gives such buffers fresh pages from the kernel (above its *mmap
threshold*, which it moves as it sees large frees) and hands freed memory at the top of a heap
back to the kernel (above its *trim threshold*): so each frame's buffers are faulted in again,
page by page. With 1,024-sample frames at d = 64 that was up to about 240 page faults per
frame, and keeping the buffers in the process took 3-15 % off the service's CPU per sample
(``docs/operations/deployment.md``).

:func:`keep_large_buffers` fixes both thresholds (``mallopt``): allocations below
:data:`MMAP_THRESHOLD` come from the heap, and up to :data:`TRIM_THRESHOLD` of freed memory at
the top of a heap stays in the process for the next frame. The cost is that resident memory
can stay up to that much above what is in use. Nothing is changed when the environment
already tunes glibc's malloc (``GLIBC_TUNABLES`` naming ``glibc.malloc``, or a ``MALLOC_*_``
variable: the operator's choice wins), or when the C library is not glibc; the command line
does not call it when ``OPML_KEEP_LARGE_BUFFERS`` is false.

>>> keep_large_buffers({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
'the environment tunes malloc'
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

#: Allocations up to this size are served from the heap, not by fresh pages of their own: a
#: binary frame of 8,192 samples at d = 64 (or 1,024 at d = 512) fits.
MMAP_THRESHOLD = 4 << 20
#: Freed memory at the top of a heap is returned to the kernel only beyond this much.
TRIM_THRESHOLD = 16 << 20
#: ``mallopt`` parameters (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_large_buffers(environ: Mapping[str, str] = os.environ) -> str | None:
    """Set the thresholds (module docstring); None when set, else why not (a sentence)."""
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", "") or any(
        name.startswith("MALLOC_") and name.endswith("_") for name in environ
    ):
        return "the environment tunes malloc"
    if platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Setting either one stops glibc moving both (its dynamic thresholds): so both are set.
    if not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) or not mallopt(
        _M_TRIM_THRESHOLD, TRIM_THRESHOLD
    ):
        return "mallopt refused the thresholds"
    return None
