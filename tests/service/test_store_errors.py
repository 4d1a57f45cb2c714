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
