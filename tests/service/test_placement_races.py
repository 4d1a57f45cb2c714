"""Placement against create, delete and a lost lease, in process on a real Redis of the test's
own.

A placement round (or an append notification's take-over) that runs while a model is being
deleted must not bring its learner back. Before the fix the round re-claimed the lease of the
model being closed and started a new writer on it: an ``/events`` socket then waited on that
orphan for ever (seen once in CI) and the writer ran on after its model was gone.

A round that finds its writer's lease lost (here: overtaken by another owner's checkpoint) must
not claim the lease again for that stopped writer: the model was then held and never learned
(seen once in the chaos test under load). It takes the model afresh instead."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.config import Settings
from service.core import Learner, LearnerConfig
from service.engine.registry import Registry
from service.storage import checkpoint
from service.storage.codec import encode_vector
from service.storage.keys import ModelKeys
from service.storage.store import Group, Store
from tests.service.runtime_support import CONFIG, Gate, until
from tests.service.support import RedisServer, stream


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


def test_a_writer_overtaken_by_another_owner_is_replaced_not_renewed(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process appends five samples and checkpoints past this writer's position while
    the writer's log reads are held; once they return, the writer finds the newer checkpoint
    and gives the lease up. The placement then starts a new writer from that checkpoint (which
    learns on), rather than renewing the lease for the stopped one."""
    X, y = stream(12, 3, 3, seed=31)

    async def run() -> None:
        store = Store.connect(own_redis.url, 5.0)
        other = Store.connect(own_redis.url, 5.0)  # the other process's connection
        registry = Registry(store, Settings(), "http://placement-test")
        registry.start()
        gate: Gate | None = None
        try:
            await asyncio.wait_for(registry.loaded.wait(), 30)
            runtime = await registry.create("overtaken", CONFIG)
            await asyncio.wait_for(runtime.caught_up(), 30)
            await runtime.ingest(X[:3], y[:3], wait=True)
            first = runtime.writer
            token = runtime.lease.token
            assert first is not None and token is not None
            gate = Gate(monkeypatch, "read_tail")
            await other.append_groups(
                "overtaken", [Group(encode_vector(X[3:8]), y[3:8], "", "fp")],
                now_ms=0, ttl_ms=60_000, max_classes=10,
            )  # fmt: skip
            newer = Learner(CONFIG)
            newer.learn_many(X[:8], y[:8])
            fields = checkpoint.encode(newer, applied=(8, 1), metric_puts=0, time=1.0)
            assert await other.write_checkpoint(
                "overtaken",
                *fields,
                applied=(8, 1),
                created_at=repr(runtime.created_at),
                trim_min_id="8-2",
                fencing_token=token,
            )
            assert runtime.snapshot.version == 3  # behind: it has not read the log
            gate.open.set()
            await until(lambda: not first.lease.held or runtime.writer is not first)
            for _ in range(2):  # a round drops the lost writer, the next takes the model
                await registry._place(runtime)
            await until(lambda: runtime.writer not in (None, first) and runtime.lease.held)
            await asyncio.wait_for(runtime.caught_up(), 30)
            assert runtime.snapshot.version == 8
            np.testing.assert_array_equal(runtime.snapshot.L, newer.L)
            await runtime.ingest(X[8:], y[8:], wait=True)  # and it learns on
            ref = Learner(CONFIG)
            ref.learn_many(X, y)
            np.testing.assert_allclose(runtime.snapshot.L, ref.L, rtol=0, atol=1e-12)
        finally:
            if gate is not None:
                gate.open.set()
            await registry.close()
            await other.aclose()
            await store.aclose()

    asyncio.run(run())
