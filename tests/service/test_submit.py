"""Appends started without suspending (``ModelRuntime.submit``, one per ``/stream`` frame):
queued for the log in call order, each future settled with its own outcome; one cancelled
before its group was sent is left out of the log and frees its room; with no room, ``submit``
declines and ``submit_when_room`` waits for it; a failure handing a logged append to the writer
strands nobody. Real Redis, in process."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from service.engine.runtime import ModelRuntime
from service.engine.writer import Writer
from service.storage.store import Appended, Group
from tests.service.runtime_support import assert_learned_like_the_core, run_with_runtime, until
from tests.service.support import stream


def test_submitted_appends_are_logged_in_call_order(redis_url: str) -> None:
    X, y = stream(30, 3, 4, seed=5)

    async def body(runtime: ModelRuntime) -> np.ndarray:
        futures = [runtime.submit(X[i : i + 1], [y[i]]) for i in range(len(y))]
        appended = [await f for f in futures if f is not None]
        assert [(a.first_seq, a.last_seq) for a in appended] == [(i, i) for i in range(1, 31)]
        assert runtime.admission.unapplied <= len(y)
        return (await runtime.read(len(y))).L

    assert_learned_like_the_core(run_with_runtime(redis_url, body), X, y)


def test_a_submit_cancelled_before_its_group_is_sent_is_left_out(redis_url: str) -> None:
    X, y = stream(3, 3, 3, seed=6)

    async def body(runtime: ModelRuntime) -> tuple[list[int], np.ndarray]:
        first, gone, last = (runtime.submit(X[i : i + 1], [y[i]]) for i in range(3))
        assert first is not None and gone is not None and last is not None
        gone.cancel()  # before the group commit ran: its group is not sent
        kept = [(await first).first_seq, (await last).first_seq]
        await until(lambda: runtime.admission.unapplied == 0)  # its room is free again
        snap = await runtime.read(2)
        assert snap.version == 2 and runtime.writer is not None
        assert runtime.writer.logged_seq == 2  # nothing else was logged
        return kept, snap.L

    kept, L = run_with_runtime(redis_url, body)
    assert kept == [1, 2]
    assert_learned_like_the_core(L, X[[0, 2]], [y[0], y[2]])


def test_with_no_room_submit_declines_and_submit_when_room_waits(redis_url: str) -> None:
    X, y = stream(6, 3, 3, seed=7)

    async def body(runtime: ModelRuntime) -> np.ndarray:
        runtime.admission.limit = 2
        held = runtime.submit(X[:3], y[:3])  # room (none unapplied): 3 now count
        assert held is not None
        assert runtime.submit(X[3:4], y[3:4]) is None  # 3 > 2 unapplied: declined...
        assert runtime.admission.unapplied == 3  # ...counting nothing
        later = await runtime.submit_when_room(X[3:], y[3:])  # once the learner caught up
        assert (await held).last_seq == 3 and (await later).first_seq == 4
        return (await runtime.read(6)).L

    assert_learned_like_the_core(run_with_runtime(redis_url, body), X, y)


def test_an_append_the_writer_was_not_handed_is_acknowledged_and_read_back(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while handing a logged append to the writer (a bug) neither strands its
    caller nor the other appends of the same call: all are acknowledged, and the writer reads
    the one it was not handed back from the log."""
    X, y = stream(6, 3, 3, seed=8)
    offer = Writer.offer
    failed: list[int] = []

    def failing(self: Writer, appended: Appended, group: Group, decoded: Any = None) -> None:
        if appended.first_seq == 3:
            failed.append(3)
            raise RuntimeError("a bug")
        offer(self, appended, group, decoded)

    monkeypatch.setattr(Writer, "offer", failing)

    async def body(runtime: ModelRuntime) -> np.ndarray:
        futures = [runtime.submit(X[i : i + 1], [y[i]]) for i in range(len(y))]  # one call
        answers = await asyncio.wait_for(asyncio.gather(*(f for f in futures if f)), 30)
        assert [a.first_seq for a in answers] == [1, 2, 3, 4, 5, 6]
        await until(lambda: runtime.admission.unapplied == 0)
        return (await runtime.read(len(y))).L

    assert_learned_like_the_core(run_with_runtime(redis_url, body), X, y)
    assert failed == [3]
