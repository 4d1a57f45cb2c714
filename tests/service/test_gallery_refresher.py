"""The gallery's refresher (``engine/gallery.py``): it pauses between refreshes to stay within
its share of a core, and a ``min_version`` read cuts the pause short (and the writer's hold of
offered appends). Real Redis, in process."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine import gallery as gallery_module
from service.engine import writer as writer_module
from service.engine.runtime import ModelRuntime
from tests.service.support import stream
from tests.service.test_offered import run_with_runtime, until


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
