"""Redis failures that are not RedisErrors in redis-py become RedisErrors (503 + Retry-After),
and a burst of calls waits for connections: a write on a connection the event loop already
closed (a cluster node killed during a failover), a pool smaller than the burst."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import RedisError

from service.storage.store import MAX_CONNECTIONS, _closed_transport, connect
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
        client = connect(own_redis.url, 5.0)
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
