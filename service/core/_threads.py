"""BLAS threads: one controller for the process, and the work from which a call pins BLAS to
one thread (the learner's steps, one-to-many queries, the gallery's searches)."""

from __future__ import annotations

import functools

from threadpoolctl import ThreadpoolController

#: Calls of at least this many multiply-adds run on one BLAS thread: a second thread loses more
#: than it gains on a 2-core machine when the other core is busy (the event loop needs it).
PINNED_WORK = 1 << 22


@functools.cache
def blas() -> ThreadpoolController:
    """BLAS thread control, made once (enumerating the loaded libraries costs ~0.5 ms)."""
    return ThreadpoolController()
