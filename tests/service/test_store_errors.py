"""The store's Redis client: failures that are not RedisErrors in redis-py become RedisErrors,
and every failure of the client leaves the store as the domain's StorageUnavailable (503 +
Retry-After); a burst of calls waits for connections: a write on a connection the
event loop already closed (a cluster node killed during a failover), a pool smaller than the
burst. Its commands are packed in C, to the same bytes as redis-py's own packer."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, DataError, RedisClusterException, RedisError

from service.errors import StorageUnavailable
from service.storage.client import (
    MAX_CONNECTIONS,
    _c_packing,
    _closed_transport,
    connect,
    connect_cluster,
)
from service.storage.errors import NotReplicated, is_client_failure, mapped
from service.storage.store import Store
from tests.service.support import RedisServer


@pytest.mark.parametrize(
    "message",
    [
        "unable to perform operation on <TCPTransport closed=True reading=False 0x5>; "
        "the handler is closed",  # uvloop
        "unable to perform operation on <_SelectorSocketTransport closed=True>",  # asyncio
    ],
)
def test_a_write_on_a_closed_transport_is_a_redis_error(message: str) -> None:
    error = _closed_transport(RuntimeError(message))
    assert isinstance(error, RedisError) and "closed" in str(error)


def test_any_other_runtime_error_stays_what_it_is() -> None:
    with pytest.raises(RuntimeError, match="event loop is running"):
        _closed_transport(RuntimeError("this event loop is running"))


def test_a_burst_beyond_the_pool_waits_for_a_connection(own_redis: RedisServer) -> None:
    """More concurrent calls than the pool holds (every writer of many models polling at once)
    wait for a free connection instead of failing (redis-py 8's default pool refused the
    101st at once: MaxConnectionsError)."""

    async def burst() -> list[object]:
        # 30 s: opening 512 connections at once took over 5 s on a busy 2-core machine; the
        # bound is what a call may wait, not what is tested (no call is refused at once).
        client = connect(own_redis.url, 30.0)
        try:  # BLPOP holds its connection 0.1 s without blocking the server
            calls = (client.blpop(["nokey"], 0.1) for _ in range(MAX_CONNECTIONS + 100))
            return await asyncio.gather(*calls)
        finally:
            await client.aclose()

    assert asyncio.run(burst()) == [None] * (MAX_CONNECTIONS + 100)


def test_pooled_connections_left_stale_by_a_redis_restart_reconnect_before_a_call(
    own_redis: RedisServer,
) -> None:
    """After Redis restarts, every pooled connection still holds the dead server's socket; the
    pool sees that before it sends a command on one and reconnects, so no call fails. (With
    redis-py 8's maintenance notifications on, its default, the pool skipped that check: the
    first call on each stale connection failed, and a /readyz after an outage answered 503
    while the same Redis acknowledged samples.)"""

    async def restart_between_bursts() -> list[object]:
        client = connect(own_redis.url, 5.0)
        try:
            await asyncio.gather(*(client.ping() for _ in range(20)))  # 20 pooled connections
            # in threads, so the event loop sees the sockets close, as a service's loop does
            await asyncio.to_thread(own_redis.kill)
            await asyncio.to_thread(own_redis.start)  # same port and dir
            return await asyncio.gather(*(client.ping() for _ in range(20)), return_exceptions=True)
        finally:
            await client.aclose()

    assert asyncio.run(restart_between_bursts()) == [True] * 20


PACKED = [
    ("SCRIPT LOAD", "return 1"),
    (b"SCRIPT LOAD", b"return 1"),
    ("EVALSHA", "f" * 40, 2, "k1", "k2", 1, -3, 2**70, 0.1, 1e20, 1 / 3, float("inf")),
    ("XADD", b"log", "7-1", "x", bytes(range(256)) * 40, "y", '["\u00fc","\u4e2d"]'),
    ("SET", "k", memoryview(b"abc"), "PX", 10),
]


@pytest.mark.parametrize("args", PACKED, ids=lambda a: str(a[0]))
def test_commands_are_packed_in_c_to_the_bytes_of_redis_pys_packer(args: tuple) -> None:
    c_packed = _c_packing(Connection)()
    python_packed = Connection()
    assert type(c_packed).pack_command is not Connection.pack_command
    assert b"".join(c_packed.pack_command(*args)) == b"".join(
        bytes(chunk) for chunk in python_packed.pack_command(*args)
    )


def test_an_argument_hiredis_does_not_take_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(DataError, match="bool"):
        _c_packing(Connection)().pack_command("SET", "k", True)
    with pytest.raises(UnicodeEncodeError):
        _c_packing(Connection)().pack_command("SET", "k", "\ud800")


def test_every_kind_of_connection_of_the_pool_packs_in_c(own_redis: RedisServer) -> None:
    """The pool's class follows the URL (TCP, TLS, Unix socket); each gets the C packer, and
    a real server answers what it was sent."""
    for cls in (Connection, SSLConnection, UnixDomainSocketConnection):
        assert issubclass(_c_packing(cls), cls) and _c_packing(cls) is _c_packing(cls)

    async def round_trip() -> tuple[type, object, object]:
        client = connect(own_redis.url, 5.0)
        try:
            value = bytes(range(256)) * 100
            await client.set("packed", value)
            sha = await client.script_load("return #ARGV[1]")
            return (
                client.connection_pool.connection_class,
                await client.get("packed") == value,
                await client.evalsha(sha, 0, value),
            )
        finally:
            await client.aclose()

    cls, same, length = asyncio.run(round_trip())
    assert cls is _c_packing(Connection) and same and length == 25600


def test_the_store_turns_a_failure_of_redis_into_unavailable() -> None:
    """Nothing listens at the URL: every store call raises the domain's StorageUnavailable (a
    503 with Retry-After), whatever the client raised, on a single server and a cluster."""

    async def scenario() -> None:
        for store in (
            Store(connect("redis://127.0.0.1:1/0", 0.5)),
            Store(connect_cluster("redis://127.0.0.1:1/0", 0.5)),
        ):
            with pytest.raises(StorageUnavailable, match="Redis is unavailable") as caught:
                await store.model_exists("m")
            assert caught.value.retry_after >= 1
            with pytest.raises(StorageUnavailable):
                await store.ping()
            await store.aclose()

    asyncio.run(scenario())


def test_an_exception_escaping_redis_py_is_unavailable_and_a_bug_of_ours_is_not() -> None:
    """An exception that is no RedisError but comes out of redis-py's own code (as the
    AttributeError of a connection torn down while it connects) is a failure of the client;
    the same exception raised by code of ours is a bug and stays what it is."""

    @mapped
    async def inside_redis() -> None:
        key_slot(None)  # type: ignore[arg-type]  # AttributeError within redis/crc.py

    @mapped
    async def ours() -> None:
        raise AttributeError("a bug")

    with pytest.raises(StorageUnavailable, match="AttributeError"):
        asyncio.run(inside_redis())
    with pytest.raises(AttributeError, match="a bug"):
        asyncio.run(ours())
    for exc in (ClusterDownError("CLUSTERDOWN"), RedisClusterException("no node"), OSError()):
        assert is_client_failure(exc)
    assert not is_client_failure(NotReplicated("1 of 2"))
