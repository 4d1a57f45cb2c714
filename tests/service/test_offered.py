"""The owner applies its own appends without reading them back (``engine/writer.py``,
``Writer.offer``), and only when they are certainly the log's next entries: the result is the
core learner's on the logged order, metric replacements included. Real Redis, in process."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from service.core import Learner
from service.engine import writer as writer_module
from service.engine.runtime import ModelRuntime
from service.storage.codec import encode_vector
from service.storage.store import Group, Store
from service.storage.store import connect as redis_connect
from tests.service.runtime_support import (
    CONFIG,
    UNPOLLED,
    assert_learned_like_the_core,
    no_timed_wakes,
    run_with_runtime,
    until,
)
from tests.service.support import RedisServer, stream


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``count`` of every log read the writer makes from now on (``Store.read_tail``),
    appended as it is called."""
    reads: list[int] = []
    read_tail = Store.read_tail

    async def counted(self: Store, name: str, after: str, count: int, **kwargs: Any) -> Any:
        reads.append(count)
        return await read_tail(self, name, after, count, **kwargs)

    monkeypatch.setattr(Store, "read_tail", counted)
    return reads


def test_single_sample_appends_are_applied_as_offered_and_learn_exactly(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 3600.0)  # any read is recent enough
    X, y = stream(40, 3, 4, seed=11)

    async def body(runtime: ModelRuntime) -> tuple[int, np.ndarray]:
        for i in range(len(y)):
            done = await runtime.ingest(X[i : i + 1], [y[i]], wait=True)
            assert (done.first_seq, done.version) == (i + 1, i + 1)
        assert runtime.writer is not None
        return runtime.writer.offered_applied, runtime.snapshot.L

    offered, L = run_with_runtime(redis_url, body)
    assert offered == len(y)  # none of them was read back from the log
    assert_learned_like_the_core(L, X, y)


def test_an_offered_append_waits_for_a_metric_replacement_logged_before_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends offered on both sides of a PUT metric logged by someone else (not offered): the
    second one's first seq follows the first's last, but the replacement sits between them in
    the log, so it is read, not taken as offered."""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 3600.0)
    X, y = stream(12, 3, 3, seed=4)
    M = np.diag([2.0, 0.5, 1.5])

    async def body(runtime: ModelRuntime) -> tuple[int, int, np.ndarray]:
        writer = runtime.writer
        assert writer is not None
        async with writer._learning:  # the writer cannot apply anything meanwhile
            await runtime.ingest(X[:6], y[:6])
            await runtime.store.append_metric(runtime.name, encode_vector(M))
            await runtime.ingest(X[6:], y[6:])
        await until(lambda: writer.metric_puts == 1 and runtime.snapshot.version == 12)
        return writer.offered_applied, runtime.snapshot.metric_puts, runtime.snapshot.L

    offered, puts, L = run_with_runtime(redis_url, body)
    assert puts == 1
    assert offered <= 1  # the first append at most; the second came after the replacement
    ref = Learner(CONFIG)
    ref.learn_many(X[:6], y[:6])
    ref.set_metric(M)
    ref.learn_many(X[6:], y[6:])
    np.testing.assert_allclose(L, ref.L, rtol=0, atol=1e-12)


def _count_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of log entries of every batch the writers apply from now on."""
    batches: list[int] = []
    apply_entries = writer_module.Writer._apply_entries

    def counted(self: writer_module.Writer, entries: Any, decoded: Any = None) -> Any:
        batches.append(len(entries))
        return apply_entries(self, entries, decoded)

    monkeypatch.setattr(writer_module.Writer, "_apply_entries", counted)
    return batches


def test_offered_appends_are_held_back_and_learned_together_when_someone_waits(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single-sample appends nobody waits for are held back (here: for good) and learned in
    one batch; a ``min_version`` read is urgent and gets them at once, learned exactly."""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 3600.0)
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 3600.0)
    batches = _count_batches(monkeypatch)
    X, y = stream(5, 3, 2, seed=3)

    async def body(runtime: ModelRuntime) -> tuple[int, np.ndarray]:
        for i in range(len(y)):
            done = await runtime.ingest(X[i : i + 1], [y[i]])
            assert done.first_seq == i + 1
        assert runtime.snapshot.version == 0  # held back (nobody waits)
        snapshot = await runtime.read(min_version=len(y))
        return snapshot.version, snapshot.L

    version, L = run_with_runtime(redis_url, body)
    assert version == len(y)
    assert batches == [len(y)]
    assert_learned_like_the_core(L, X, y)


def test_held_back_appends_are_learned_after_the_delay_or_once_enough(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without any waiter: a few samples are learned once the delay has passed; a block of
    ``COALESCE_SAMPLES`` at once, whatever the delay."""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 3600.0)
    X, y = stream(3 + writer_module.COALESCE_SAMPLES, 3, 3, seed=5)

    async def body(runtime: ModelRuntime) -> int:
        monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 0.05)
        for i in range(3):
            await runtime.ingest(X[i : i + 1], [y[i]])
        await until(lambda: runtime.snapshot.version == 3)
        monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 3600.0)
        await runtime.ingest(X[3:], y[3:])
        await until(lambda: runtime.snapshot.version == len(y))
        assert runtime.writer is not None
        return runtime.writer.offered_applied

    assert run_with_runtime(redis_url, body) == 4  # all applied as offered


def test_the_periodic_read_takes_one_entry_and_sees_an_append_of_another_process(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a read due at every step, offered appends are still applied as offered after a
    one-entry read shows they are the log's next; an entry appended by someone else (straight
    to the store, as another process does) between two offered ones is read, in log order."""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 0.0)  # every step reads
    monkeypatch.setattr(writer_module, "APPLY_DELAY_S", 0.0)
    no_timed_wakes(monkeypatch)
    X, y = stream(14, 3, 3, seed=9)
    reads = count_reads(monkeypatch)

    async def body(runtime: ModelRuntime) -> tuple[int, np.ndarray]:
        writer = runtime.writer
        assert writer is not None
        for i in range(6):
            await runtime.ingest(X[i : i + 1], [y[i]], wait=True)
        assert writer.offered_applied == 6
        async with writer._learning:  # the foreign entry lands between two offered ones
            await runtime.ingest(X[6:8], y[6:8])
            foreign = Group(encode_vector(X[8:10]), list(y[8:10]), "", "f" * 32)
            await runtime.store.append_groups(
                runtime.name, [foreign], now_ms=0, ttl_ms=60_000, max_classes=100
            )
            runtime._notify_logged(10)
            await runtime.ingest(X[10:], y[10:])
        await until(lambda: runtime.snapshot.version == len(y))
        return writer.offered_applied, runtime.snapshot.L

    offered, L = run_with_runtime(redis_url, body, UNPOLLED)
    assert 1 in reads  # the one-entry reads
    assert 6 <= offered <= 8  # the foreign entry and the one after it were read back
    assert_learned_like_the_core(L, X, y)


def test_a_wake_while_an_append_of_this_process_is_in_flight_reads_nothing(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken while its own append is still in Redis (and nothing else is new), the writer does
    not read the log: that append's entry is applied as offered once it returns. (A read then
    would run after the append in Redis and bring its entry back to be decoded.)"""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 3600.0)  # the latest read stays recent
    X, y = stream(8, 3, 3, seed=13)
    reads = count_reads(monkeypatch)

    async def body(runtime: ModelRuntime) -> tuple[int, np.ndarray]:
        writer = runtime.writer
        assert writer is not None
        await runtime.ingest(X[:1], [y[0]], wait=True)
        offered_before, reads_before = writer.offered_applied, len(reads)
        pauser = redis_connect(own_redis.url, 5.0)
        try:  # every client's commands wait in Redis for a second
            await pauser.execute_command("CLIENT", "PAUSE", "1000", "ALL")
        finally:
            await pauser.aclose()
        appended = runtime.submit(X[1:], list(y[1:]))
        assert appended is not None
        writer.kick()  # a wake with the append in flight
        for _ in range(50):  # the writer's step runs (it would send its read at once)
            await asyncio.sleep(0)
        assert len(reads) == reads_before
        assert (await appended).last_seq == len(y)
        snapshot = await runtime.read(len(y))
        return writer.offered_applied - offered_before, snapshot.L

    offered, L = run_with_runtime(own_redis.url, body)
    assert offered == 1  # the one entry of seven samples, as offered
    assert_learned_like_the_core(L, X, y)


def test_an_append_heard_from_another_process_is_read_at_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's append, heard on the model's channel, is read at the wake it causes,
    however recent the latest read (it is never offered here)."""
    monkeypatch.setattr(writer_module, "SKIP_READ_S", 3600.0)
    X, y = stream(5, 3, 3, seed=14)

    async def body(runtime: ModelRuntime) -> np.ndarray:
        writer = runtime.writer
        assert writer is not None
        await runtime.ingest(X[:1], [y[0]], wait=True)
        foreign = Group(encode_vector(X[1:]), list(y[1:]), "", "f" * 32)
        await runtime.store.append_groups(
            runtime.name, [foreign], now_ms=0, ttl_ms=60_000, max_classes=100
        )
        writer.heard_append()  # what the registry does for a message on the channel
        await until(lambda: runtime.snapshot.version == len(y), timeout=10)
        return runtime.snapshot.L

    assert_learned_like_the_core(run_with_runtime(redis_url, body), X, y)
