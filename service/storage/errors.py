"""The storage layer's errors, and the one place where a failure of the Redis client becomes
one of the domain's errors.

Refusals with a meaning of their own (the model is gone, the gallery is full, a fenced
checkpoint, ...) are the exception types below. Anything the Redis client raises on the way
(redis-py's ``RedisError`` family, the cluster client's ``RedisClusterException`` family such as
"slot not covered" during a failover, a socket error, or any other exception that escapes
redis-py's code, e.g. an ``AttributeError`` on a connection torn down while it connects) is
turned into :class:`~service.errors.StorageUnavailable` (an ``Unavailable`` with a retry hint)
at the boundary of every store class (:func:`guarded`): the engine and the API above see the
domain's errors only.

>>> from redis.exceptions import ConnectionError
>>> err = unavailable(ConnectionError("Connection refused"))
>>> err.slug, err.retry_after
('unavailable', 1)
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.exceptions import ConnectionError, RedisClusterException, RedisError

from service.errors import ServiceError, StorageUnavailable

log = logging.getLogger("service.store")

#: Where redis-py's own code lives: an exception raised inside it is a failure of the client.
_REDIS_DIR = str(Path(redis.__file__).parent)


class GalleryFull(Exception):
    """Enrolling would exceed the gallery's size limit; it holds ``size`` items."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class NoSuchItem(Exception):
    """No gallery item has that key."""


class Fenced(Exception):
    """A checkpoint was refused: a newer fencing token was granted to another writer."""


class Overtaken(Fenced):
    """A checkpoint was refused: the stored one covers a later log position (written by a
    newer owner), so this writer's state is behind and must not replace it."""


class NoSuchModel(Exception):
    """The model's keys are gone (deleted)."""


class TooManyClasses(Exception):
    """Appending would exceed the classes-per-model limit; ``have`` classes exist."""

    def __init__(self, have: int) -> None:
        super().__init__(have)
        self.have = have


class NotReplicated(StorageUnavailable):
    """An append is in the master but fewer replicas than ``OPML_REDIS_WAIT_REPLICAS``
    confirmed it in time (nothing of it is applied until a confirmed append covers it); its
    detail says what to do."""


class ClusterUnavailable(ConnectionError):
    """The cluster client could not serve a command (no reachable node, a slot not covered
    during a failover, a slot moving between masters): a ``RedisError`` inside this layer,
    :class:`~service.errors.Unavailable` outside it."""


def _inside_redis(tb: TracebackType | None) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_REDIS_DIR):
            return True
        tb = tb.tb_next
    return False


def is_client_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the Redis client or of the network under it (rather
    than a refusal of this layer or a bug of ours)."""
    if isinstance(exc, ServiceError) or not isinstance(exc, Exception):
        return False
    if isinstance(exc, RedisError | RedisClusterException | OSError | TimeoutError | EOFError):
        return True
    # A write on a connection whose socket the event loop already closed (a node killed during
    # a failover): uvloop's "the handler is closed", asyncio's "unable to perform operation on
    # ... closed".
    if isinstance(exc, RuntimeError) and "closed" in str(exc):
        return True
    return _inside_redis(exc.__traceback__)


def unavailable(exc: BaseException) -> StorageUnavailable:
    """The domain's error for a failure of the Redis client (see :func:`is_client_failure`)."""
    if isinstance(exc, StorageUnavailable):
        return exc
    if not isinstance(exc, RedisError | RedisClusterException | OSError | TimeoutError):
        log.warning("the Redis client failed with %r", exc)
    return StorageUnavailable(f"Redis is unavailable ({type(exc).__name__}); retry shortly")


F = TypeVar("F", bound=Callable[..., Any])


def mapped(method: F) -> F:
    """``method`` (a coroutine function) with the Redis client's failures raised as
    :class:`~service.errors.Unavailable`."""

    @functools.wraps(method)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except Exception as exc:
            if is_client_failure(exc):
                raise unavailable(exc) from exc
            raise

    return run  # type: ignore[return-value]


C = TypeVar("C", bound=type)


def guarded(cls: C) -> C:
    """Every public coroutine method of the class ``cls`` :func:`mapped`: nothing the Redis
    client raises leaves the storage layer as it is."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, mapped(member))
    return cls
