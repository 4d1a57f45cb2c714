"""The append lane (:mod:`service.storage.lane`) on a real redis-server: pipelined calls each get
their own reply, a server that lost its scripts still runs them (once), a lost connection or a
call past its timeout fails only the calls waiting on that connection and the next call
connects again, and it connects as redis-py does (password, database, client name)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis
from redis.exceptions import AuthenticationError, ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from service.storage.lane import LARGE_ARGUMENT, Lane, pack_command
from service.storage.store import Store, connect
from tests.service.support import RedisServer

ECHO = "return {KEYS[1], ARGV[1]}"
COUNT = "return redis.call('INCR', KEYS[1])"
FAIL_ON_ODD = "if tonumber(ARGV[1]) % 2 == 1 then return redis.error_reply('odd') end return 1"


def run(url: str, body: Callable[[Lane, Any], Awaitable[Any]]) -> Any:
    """``body(lane, client)`` on the lane of ``connect(url)`` (and that redis-py client)."""

    async def main() -> Any:
        client = connect(url, 0.5)
        lane = Lane.of(client)
        assert lane is not None
        try:
            return await body(lane, client)
        finally:
            await lane.aclose()
            await client.aclose()

    return asyncio.run(main())


def lane_clients(plain: redis.Redis, name: str) -> list[str]:
    """The ids of the server's connections named ``name``."""
    return [c["id"] for c in plain.client_list() if c.get("name") == name]


def test_pipelined_calls_each_get_their_own_reply_in_call_order(own_redis: RedisServer) -> None:
    async def body(lane: Lane, client: Any) -> list[Any]:
        echo, odd = client.register_script(ECHO), client.register_script(FAIL_ON_ODD)
        calls = [lane.script(echo, [f"k{i}"], [i]) for i in range(300)]
        calls += [lane.script(odd, ["k"], [i]) for i in range(4)]
        return await asyncio.gather(*calls, return_exceptions=True)

    out = run(own_redis.url, body)
    assert out[:300] == [[f"k{i}".encode(), str(i).encode()] for i in range(300)]
    assert out[300] == 1 and out[302] == 1  # an error reply fails its own call only
    for failed in (out[301], out[303]):
        assert isinstance(failed, ResponseError) and "odd" in str(failed)


def test_a_server_that_lost_its_scripts_runs_the_call_once(own_redis: RedisServer) -> None:
    """After a restart (here SCRIPT FLUSH) EVALSHA answers NOSCRIPT: the lane sends the script
    itself, which runs it once and caches it again."""
    plain = redis.Redis(port=own_redis.port)

    async def body(lane: Lane, client: Any) -> list[int]:
        count = client.register_script(COUNT)
        first = await lane.script(count, ["n"], [])
        await asyncio.to_thread(plain.script_flush)
        assert not (await asyncio.to_thread(plain.script_exists, count.sha))[0]
        return [first, await lane.script(count, ["n"], []), await lane.script(count, ["n"], [])]

    assert run(own_redis.url, body) == [1, 2, 3]
    assert plain.get("n") == b"3"


def test_a_lost_connection_fails_the_calls_waiting_on_it_and_the_next_reconnects(
    own_redis: RedisServer,
) -> None:
    plain = redis.Redis(port=own_redis.port)
    url = own_redis.url + "?client_name=lane-lost"

    async def body(lane: Lane, client: Any) -> tuple[list[Any], Any]:
        count = client.register_script(COUNT)
        await lane.script(count, ["n"], [])  # connected
        await asyncio.to_thread(plain.execute_command, "CLIENT", "PAUSE", 5000, "WRITE")
        try:
            waiting = [asyncio.ensure_future(lane.script(count, ["n"], [])) for _ in range(3)]
            await asyncio.sleep(0)  # written, held by the pause
            (lane_id,) = await asyncio.to_thread(lane_clients, plain, "lane-lost")
            await asyncio.to_thread(plain.client_kill_filter, _id=lane_id)
            # bounded: a lane that missed the loss would leave them waiting for ever
            failed = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 10)
        finally:
            await asyncio.to_thread(plain.execute_command, "CLIENT", "UNPAUSE")
        return failed, await lane.script(count, ["n"], [])

    failed, after = run(url, body)
    assert all(isinstance(f, ConnectionError) for f in failed), failed
    assert after == 2  # the killed calls never ran; the next one did, on a new connection
    assert lane_clients(plain, "lane-lost") == []  # closed with the lane


def test_a_call_past_its_timeout_fails_and_drops_the_connection(own_redis: RedisServer) -> None:
    plain = redis.Redis(port=own_redis.port)
    url = own_redis.url + "?client_name=lane-slow"

    async def body(lane: Lane, client: Any) -> tuple[Any, float, Any, list[str]]:
        count = client.register_script(COUNT)
        await lane.script(count, ["n"], [])
        await asyncio.to_thread(plain.execute_command, "CLIENT", "PAUSE", 3000, "ALL")
        started = time.monotonic()
        try:
            slow = await asyncio.gather(lane.script(count, ["n"], []), return_exceptions=True)
        finally:
            await asyncio.to_thread(plain.execute_command, "CLIENT", "UNPAUSE")
        waited = time.monotonic() - started
        after = await lane.script(count, ["n"], [])
        return slow[0], waited, after, await asyncio.to_thread(lane_clients, plain, "lane-slow")

    slow, waited, after, connections = run(url, body)
    assert isinstance(slow, RedisTimeout) and waited >= 0.5  # the client's socket timeout
    assert after in (2, 3)  # the timed-out call may have run once the pause ended
    assert len(connections) == 1  # the timed-out connection was dropped, a new one opened


def test_it_connects_with_the_password_database_and_name_of_the_url(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret").start()
    try:
        base = f"redis://:s3cret@127.0.0.1:{server.port}"
        plain = redis.Redis(port=server.port, password="s3cret", db=3)

        async def body(lane: Lane, client: Any) -> Any:
            return await lane.call("SET", "where", "db3")

        assert run(f"{base}/3?client_name=lane-auth", body) is not None
        assert plain.get("where") == b"db3"
        with pytest.raises(AuthenticationError):
            run(f"redis://:wrong@127.0.0.1:{server.port}/0", body)
    finally:
        server.stop()


def test_the_store_appends_through_a_lane_only_where_it_can(own_redis: RedisServer) -> None:
    """A single server: the appends go through the lane. With replicas awaited the WAIT must
    follow the write on its own connection: through redis-py. TLS: through redis-py."""
    assert Store.connect(own_redis.url, 1.0).conn._lane is not None
    assert Store.connect(own_redis.url, 1.0, wait_replicas=1).conn._lane is None
    assert Lane.of(connect("rediss://127.0.0.1:1/0", 1.0)) is None
    unix = Lane.of(connect("unix:///tmp/opml.sock?db=2", 1.0))
    assert unix is not None and (unix.endpoint.path, unix.endpoint.db) == ("/tmp/opml.sock", 2)


def test_a_command_with_a_large_argument_is_packed_as_hiredis_packs_it() -> None:
    rng = random.Random(5)
    sizes = [0, 1, LARGE_ARGUMENT, LARGE_ARGUMENT + 1, 700_000]
    for _ in range(200):
        command: list[Any] = ["EVALSHA", "f" * 40, rng.randrange(4)]
        for _ in range(rng.randrange(1, 12)):
            kind = rng.randrange(5)
            if kind == 0:
                command.append(rng.randbytes(rng.choice(sizes)))
            elif kind == 1:
                command.append("é" * rng.choice(sizes[:3]) + "\r\n")
            elif kind == 2:
                command.append(rng.randrange(-(10**20), 10**20))
            elif kind == 3:
                command.append(rng.random() * 1e6)  # a float: hiredis's own repr
            else:  # a view of bytes, as a binary frame's block is logged
                command.append(memoryview(rng.randbytes(rng.choice(sizes))))
        parts = pack_command(tuple(command))
        assert b"".join(parts) == hiredis.pack_command(tuple(command))
        if not any(type(a) is float for a in command):  # large arguments are sent, not copied
            large = [
                a for a in command if isinstance(a, bytes | memoryview) and len(a) > LARGE_ARGUMENT
            ]
            assert [p for p in parts if any(p is a for a in large)] == large
    refusals: list[tuple[Any, ...]] = [("SET", "k", None), ("SET", "k", True, b"x" * 20_000)]
    for refused in refusals:
        with pytest.raises((TypeError, ValueError)):
            hiredis.pack_command(refused)
        with pytest.raises((TypeError, ValueError)):
            pack_command(refused)


def test_a_large_argument_reaches_the_script_whole(own_redis: RedisServer) -> None:
    block = random.Random(6).randbytes(600_000)

    async def body(lane: Lane, client: Any) -> list[Any]:
        echo = client.register_script(ECHO)
        return await asyncio.gather(*(lane.script(echo, [f"k{i}"], [block]) for i in range(3)))

    assert run(own_redis.url, body) == [[f"k{i}".encode(), block] for i in range(3)]
