"""A write on a connection the event loop already closed (a cluster node killed during a
failover) is a lost connection, a RedisError (503 + Retry-After), not a 500."""

from __future__ import annotations

import pytest
from redis.exceptions import RedisError

from service.storage.store import _closed_transport


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
