"""Helpers of the tests that run a model's runtime in the test process on a real Redis (no
service process): a fresh model and its runtime, the core learner's reference, a bounded wait,
a gate that holds a store method's calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.core import Learner, LearnerConfig
from service.engine import writer as writer_module
from service.engine.runtime import ModelRuntime
from service.storage.store import Store
from service.storage.store import connect as redis_connect

CONFIG = LearnerConfig(dim=3, gamma=0.05)


def run_with_runtime(
    redis_url: str,
    body: Callable[[ModelRuntime], Awaitable[Any]],
    settings: Settings | None = None,
    config: LearnerConfig = CONFIG,
) -> Any:
    """``body(runtime)`` on a fresh model (``config``) learned by this (test) process."""

    async def run() -> Any:
        client = redis_connect(redis_url, 5.0)
        store = Store(client)
        name = f"offered-{time.time_ns()}"
        created = time.time()
        assert await store.create_model(name, asdict(config), created)
        runtime = ModelRuntime(name, config, created, store, settings or Settings(), f"test:{name}")
        try:
            assert await runtime.claim()
            runtime.activate()
            await asyncio.wait_for(runtime.caught_up(), 30)
            return await body(runtime)
        finally:
            await runtime.deactivate(checkpoint=False, closing=True)
            await store.delete_model(name)
            await client.aclose()

    return asyncio.run(run())


#: Settings whose writers do not poll the log (the longest interval): they read when woken.
UNPOLLED = Settings(poll_interval_s=60)


def no_timed_wakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer waits for a wake (an append of this process, a waiter) instead of reading
    the log again :data:`~service.engine.writer.PUBLISH_DELAY_S` after a batch. With a read
    due at every step, a timed read sent while one of the test's appends is in flight reads
    that entry back instead of applying it as offered: correct, but not what a test of the
    offered path counts, and likely on a busy machine, where an append can outlast the delay.
    With :data:`UNPOLLED`, no read of the writer's own is timed."""
    monkeypatch.setattr(writer_module, "PUBLISH_DELAY_S", 60.0)


def assert_learned_like_the_core(L: np.ndarray, X: np.ndarray, y: list[Any]) -> None:
    """``L`` is what the core learner reaches on ``X``, ``y`` in one batch."""
    ref = Learner(CONFIG)
    ref.learn_many(X, y)
    np.testing.assert_allclose(L, ref.L, rtol=0, atol=1e-12)


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


class Gate:
    """Holds every call of one store method until opened; counts the calls in flight."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, method: str, when: Any = None) -> None:
        self.open = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls = 0
        original = getattr(Store, method)

        async def held(store: Store, *args: Any, **kwargs: Any) -> Any:
            if when is not None and not when(*args, **kwargs):
                return await original(store, *args, **kwargs)
            self.calls += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await self.open.wait()
                return await original(store, *args, **kwargs)
            finally:
                self.in_flight -= 1

        monkeypatch.setattr(Store, method, held)
