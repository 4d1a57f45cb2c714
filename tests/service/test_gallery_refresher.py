"""The gallery's refresher (``engine/gallery.py``): it pauses between refreshes to stay within
its share of a core, and a ``min_version`` read cuts the pause short (and the writer's hold of
offered appends). Real Redis, in process."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from service.core.gallery import TransformedGallery
from service.engine import gallery as gallery_module
from service.engine import writer as writer_module
from service.engine.runtime import ModelRuntime
from tests.service.runtime_support import CONFIG, run_with_runtime, until
from tests.service.support import stream


def test_a_min_version_read_is_not_held_up_by_the_refreshers_pause(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a share so small that every pause lasts for hours, and the writer holding appends
    nobody waits for for hours, the view still follows a ``min_version`` read at once; without
    one it stays where the pause left it."""
    monkeypatch.setattr(gallery_module, "_REFRESH_SHARE", 1e-9)
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 3600.0)
    X, y = stream(30, 3, 3, seed=2)
    G = np.random.default_rng(3).normal(size=(200, 3))

    async def body(runtime: ModelRuntime) -> tuple[int, int]:
        gallery = runtime.gallery
        keys = [str(i) for i in range(len(G))]
        await gallery.enrol(G, list(range(len(G))), keys, [None] * len(G))
        await runtime.ingest(X[:10], y[:10], wait=True)
        await until(lambda: gallery.view.version == 10)  # the refresh after a long idle
        await runtime.ingest(X[10:], y[10:])  # held back by the writer; the refresher pauses
        paused = gallery.view.version
        # Unavailable after OPML_MIN_VERSION_WAIT_S if the pause (hours) held it up:
        view = await gallery.read(min_version=len(y))
        return paused, view.version

    paused, version = run_with_runtime(redis_url, body)
    assert paused == 10  # the refresher pauses: the view stayed behind the model
    assert version == len(y)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_refreshes_run_at_the_lowest_priority_unless_a_read_waits(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background refresh runs in a thread at nice 19, so the event loop, the learner and
    the clients get a core first; the refresh that a ``min_version`` read waits for runs at
    the process's own priority."""
    monkeypatch.setattr(gallery_module, "_REFRESH_SHARE", 1e-9)
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 3600.0)
    seen: list[tuple[int, bool]] = []  # (niceness, ran on the event loop's thread)
    refreshed = TransformedGallery.refreshed

    def recording(self: TransformedGallery, L: np.ndarray, rank: int | None) -> Any:
        thread = threading.get_native_id()
        seen.append((os.getpriority(os.PRIO_PROCESS, thread), thread == loop_thread))
        return refreshed(self, L, rank)

    monkeypatch.setattr(TransformedGallery, "refreshed", recording)
    loop_thread = threading.get_native_id()  # run_with_runtime runs the loop in this thread
    d = 8
    X, y = stream(30, d, 3, seed=4)
    G = np.random.default_rng(5).normal(size=(1100, d))  # n d^2 past the inline bound
    assert len(G) * d * d >= gallery_module._THREAD_WORK

    async def body(runtime: ModelRuntime) -> int:
        gallery = runtime.gallery
        await gallery.enrol(G, list(range(len(G))), [str(i) for i in range(len(G))],
                            [None] * len(G))  # fmt: skip
        await runtime.ingest(X[:10], y[:10], wait=True)
        await until(lambda: gallery.view.version == 10)
        background = len(seen)
        await runtime.ingest(X[10:], y[10:])
        view = await gallery.read(min_version=len(y))
        assert view.version == len(y)
        return background

    own = os.getpriority(os.PRIO_PROCESS, 0)
    background = run_with_runtime(redis_url, body, config=replace(CONFIG, dim=d))
    assert background >= 1 and len(seen) > background
    assert all(nice == gallery_module.REFRESH_NICENESS and not inline
               for nice, inline in seen[:background])  # fmt: skip
    assert seen[-1] == (own, False)  # the waited-for refresh: a worker at normal priority
