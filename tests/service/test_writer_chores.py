"""The writer's chores (``engine/writer.py``, ``Writer._start_chore``): the periodic one-entry
read and the checkpoint writes run beside the learning, one at a time, and a failed one falls
due again. Real Redis, in process; the store's calls are held back (or failed once) by wrapping
them, so the test sees what the writer does meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from service.config import Settings
from service.core import Learner
from service.engine import writer as writer_module
from service.engine.runtime import ModelRuntime
from service.storage import checkpoint
from service.storage.store import Store
from tests.service.runtime_support import (
    CONFIG,
    UNPOLLED,
    Gate,
    assert_learned_like_the_core,
    no_timed_wakes,
    run_with_runtime,
    until,
)
from tests.service.support import stream


def test_offered_entries_are_learned_while_the_periodic_read_is_held(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a one-entry read due at every step and every such read held in Redis, single-sample
    appends are still learned as offered, one read at a time; once the reads return, they
    found the entries they expected (nothing was read back) and the result is the core's."""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 0.0)
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 0.0)
    no_timed_wakes(monkeypatch)
    X, y = stream(12, 3, 3, seed=21)

    async def body(runtime: ModelRuntime) -> np.ndarray:
        writer = runtime.writer
        assert writer is not None
        await runtime.ingest(X[:1], [y[0]], wait=True)  # the writer has read the log once
        gate = Gate(monkeypatch, "read_tail", lambda name, after, count, **_: count == 1)
        offered_before = writer.offered_applied
        try:  # learned meanwhile (bounded: a writer that awaited the read would wait for ever)
            for i in range(1, len(y)):
                await asyncio.wait_for(runtime.ingest(X[i : i + 1], [y[i]], wait=True), 30)
        finally:
            gate.open.set()
        assert writer.offered_applied - offered_before == len(y) - 1
        assert gate.calls >= 1 and gate.most_in_flight == 1
        await until(lambda: gate.in_flight == 0)
        assert not writer._unconfirmed
        await runtime.ingest(X[:1], [y[0]], wait=True)  # still applied as offered
        assert writer.offered_applied - offered_before == len(y)
        return runtime.snapshot.L

    L = run_with_runtime(redis_url, body, UNPOLLED)
    assert_learned_like_the_core(L, np.vstack([X, X[:1]]), [*y, y[0]])


def test_learning_goes_on_while_a_checkpoint_is_written_and_it_covers_its_snapshot(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint due every two samples, its write held: the samples after it are learned
    meanwhile, no second write starts; once written, the checkpoint is the state at the
    snapshot it was taken from (restoring it and learning the rest gives the core's L)."""
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 0.0)
    X, y = stream(10, 3, 3, seed=22)

    async def body(runtime: ModelRuntime) -> tuple[np.ndarray, np.ndarray]:
        writer = runtime.writer
        assert writer is not None
        gate = Gate(monkeypatch, "write_checkpoint")
        try:  # bounded, as above
            for i in range(len(y)):
                await asyncio.wait_for(runtime.ingest(X[i : i + 1], [y[i]], wait=True), 30)
            assert gate.calls == 1 and gate.most_in_flight == 1
        finally:
            gate.open.set()
        assert runtime.snapshot.version == len(y)
        await until(lambda: writer.checkpoint.seq > 0)
        covered = writer.checkpoint.seq
        assert 2 <= covered < len(y)  # taken at the snapshot when it fell due
        fields = await runtime.store.read_checkpoint(runtime.name)
        assert fields is not None
        restored = checkpoint.decode(*fields, dim=3)
        assert restored.learner.version == covered
        restored.learner.learn_many(X[covered:], y[covered:])
        return restored.learner.L, runtime.snapshot.L

    resumed, L = run_with_runtime(redis_url, body, Settings(checkpoint_every=2))
    assert_learned_like_the_core(L, X, y)
    np.testing.assert_allclose(resumed, L, rtol=0, atol=1e-12)


def test_a_checkpoint_write_that_fails_falls_due_again(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first checkpoint write fails (a Redis error): its samples count as unsaved again,
    so the next step writes one that covers them."""
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 0.0)
    X, y = stream(6, 3, 3, seed=23)
    write_checkpoint = Store.write_checkpoint
    attempts: list[int] = []

    async def failing_once(store: Store, *args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise RedisConnectionError("connection lost (test)")
        return await write_checkpoint(store, *args, **kwargs)

    monkeypatch.setattr(Store, "write_checkpoint", failing_once)

    async def body(runtime: ModelRuntime) -> int:
        writer = runtime.writer
        assert writer is not None
        await runtime.ingest(X[:3], y[:3], wait=True)  # due (3 >= 3): the write fails
        await until(lambda: len(attempts) == 1 and writer._chore_free())
        assert writer.checkpoint.seq == 0 and writer.unsaved.since == 3
        await runtime.ingest(X[3:4], y[3:4], wait=True)  # still due: written at this wake
        await until(lambda: writer.checkpoint.seq >= 3 and writer._chore_free())
        fields = await runtime.store.read_checkpoint(runtime.name)
        assert fields is not None
        restored = checkpoint.decode(*fields, dim=3)
        assert restored.learner.version == writer.checkpoint.seq
        assert writer.unsaved.since == 4 - writer.checkpoint.seq
        return len(attempts)

    assert run_with_runtime(redis_url, body, Settings(checkpoint_every=3)) == 2


def test_a_writer_behind_the_stored_checkpoint_gives_the_model_up(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another owner checkpointed past this writer's position under the token this writer
    holds (as when a lost lease is granted again to a process still behind): the writer's own
    checkpoint is refused rather than moving the stored one back over the trimmed log; it
    gives the lease up and stops learning. Its log reads are held so that it cannot find the
    newer checkpoint first."""
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 0.0)
    X, y = stream(8, 3, 3, seed=24)

    async def body(runtime: ModelRuntime) -> None:
        writer = runtime.writer
        assert writer is not None
        await runtime.ingest(X[:3], y[:3], wait=True)
        assert runtime.snapshot.version == 3
        newer = Learner(CONFIG)  # the newer owner learned five samples more
        newer.learn_many(X, y)
        fields = checkpoint.encode(newer, applied=(8, 1), metric_puts=0, time=1.0)
        token = runtime.lease.token
        assert token is not None
        gate = Gate(monkeypatch, "read_tail")
        try:
            assert await runtime.store.write_checkpoint(
                runtime.name,
                *fields,
                applied=(8, 1),
                created_at=repr(runtime.created_at),
                trim_min_id="8-2",
                fencing_token=token,
            )
            refused = writer.telemetry.checkpoints_fenced._value.get()
            assert writer.board.current.applied < (8, 1)
            await writer._write_checkpoint()
            assert writer.telemetry.checkpoints_fenced._value.get() == refused + 1
            assert not runtime.lease.held and writer._stopping
        finally:
            gate.open.set()
        stored = await runtime.store.read_checkpoint(runtime.name)
        assert stored is not None
        restored = checkpoint.decode(*stored, dim=3)
        assert restored.applied == (8, 1)
        np.testing.assert_array_equal(restored.learner.L, newer.L)

    run_with_runtime(redis_url, body)
