"""``service.allocator``: the raised thresholds keep large buffers in the process, measured as
page faults of a real allocation pattern in a fresh interpreter; the operator's own malloc
tuning is left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from service.allocator import keep_large_buffers

ROOT = Path(__file__).resolve().parents[1]
#: The buffers of one round, in bytes (as a binary frame's block and its copies).
SIZES = (300_000, 524_288, 700_000, 1_200_000)

#: Rounds of frame-sized buffers (a numpy array and a bytes of each of :data:`SIZES`), all
#: freed at the end of each round; prints the minor page faults per round after a warm-up.
PATTERN = f"""
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from service.allocator import keep_large_buffers
    assert keep_large_buffers() is None
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
sizes = {SIZES}
for _ in range(5):
    held = [np.ones(s // 8) for s in sizes]
    del held
before = faults()
for _ in range(50):
    held = [np.ones(s // 8) for s in sizes] + [bytes(s) for s in sizes]
    del held
print((faults() - before) / 50)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def faults_per_round(mode: str) -> float:
    env = {
        k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")
    }
    out = subprocess.run(
        [sys.executable, "-c", PATTERN, mode],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return float(out.stdout)


@glibc
def test_freed_frame_buffers_are_reused_instead_of_faulted_in_again() -> None:
    pages = sum(SIZES) * 2 / 4096  # touched per round
    default, kept = faults_per_round("default"), faults_per_round("keep")
    assert default > pages / 4, (default, pages)  # the problem is there to be solved...
    assert kept < default / 10, (kept, default)  # ... and the thresholds solve it


@pytest.mark.parametrize(
    "environ",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
        {"GLIBC_TUNABLES": "glibc.rtld.nns=2:glibc.malloc.trim_threshold=0"},
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
    ],
)
def test_the_environments_own_malloc_tuning_wins(environ: dict[str, str]) -> None:
    assert keep_large_buffers(environ) == "the environment tunes malloc"


@glibc
def test_other_variables_do_not_stop_it() -> None:
    other = {"GLIBC_TUNABLES": "glibc.rtld.nns=2", "MALLOC_ARENA_MAX": "2"}
    assert keep_large_buffers(other) is None
