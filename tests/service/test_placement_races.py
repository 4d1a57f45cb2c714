"""Placement against create and delete, in process on a real Redis of the test's own: a
placement round (or an append notification's take-over) that runs while a model is being
deleted must not bring its learner back. Before the fix the round re-claimed the lease of the
model being closed and started a new writer on it: an ``/events`` socket then waited on that
orphan for ever (seen once in CI) and the writer ran on after its model was gone."""

from __future__ import annotations

import asyncio

from service.config import Settings
from service.core import LearnerConfig
from service.engine.registry import Registry
from service.storage.keys import ModelKeys
from service.storage.store import Store
from tests.service.support import RedisServer


def _learning(name: str) -> list[str]:
    """Tasks of this event loop that load or learn ``name``."""
    return [
        t.get_name()
        for t in asyncio.all_tasks()
        if t.get_name() in (f"writer:{name}", f"load:{name}") and not t.done()
    ]


def test_a_placement_racing_a_delete_does_not_bring_the_model_back(
    own_redis: RedisServer,
) -> None:
    async def run() -> None:
        store = Store.connect(own_redis.url, 5.0)
        registry = Registry(store, Settings(), "http://placement-test")
        registry.start()
        try:
            await asyncio.wait_for(registry.loaded.wait(), 30)
            for i in range(10):
                name = f"race-{i}"
                runtime = await registry.create(name, LearnerConfig(dim=2))
                assert runtime.writer is not None and _learning(name)
                await asyncio.gather(
                    registry.delete(name), registry._place(runtime), registry._place(runtime)
                )
                assert runtime.closed and runtime.writer is None
                assert _learning(name) == []
                assert await store.client.exists(ModelKeys(name).lease) == 0
                assert name not in registry.runtimes
        finally:
            await registry.close()
            await store.aclose()

    asyncio.run(run())
