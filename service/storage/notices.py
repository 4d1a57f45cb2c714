"""Pub/sub: each model's own wake channel, on which its appends (made through a process other
than its owner) and its releases are announced, so that the process that learns it, or should,
acts at once. The channel names (:func:`~service.storage.keys.wake_channel`) stay in this layer: the
engine speaks of models.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from redis.asyncio.client import PubSub

from service.storage.client import Connection
from service.storage.errors import guarded
from service.storage.keys import name_of_channel, wake_channel


@guarded
class Listener:
    """A subscription to some models' channels (``async with``; every failure of Redis:
    Unavailable)."""

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def subscribe(self, names: Iterable[str]) -> None:
        """Listen to the models ``names`` too."""
        await self._pubsub.subscribe(*(wake_channel(n) for n in names))

    async def unsubscribe(self, names: Iterable[str]) -> None:
        """Stop listening to the models ``names``."""
        await self._pubsub.unsubscribe(*(wake_channel(n) for n in names))

    async def next_model(self, timeout: float) -> str | None:
        """The name of a model announced (an append or a release), or whose subscription
        was just confirmed; None when nothing came within ``timeout`` seconds."""
        message: dict[str, Any] | None = await self._pubsub.get_message(timeout=timeout)
        if message is None or message["type"] not in ("message", "subscribe"):
            return None
        return name_of_channel(message["channel"])


@guarded
class Notices:
    """Announcing models on their channels, and listening to them.

    >>> from service.storage.client import connect
    >>> Notices(Connection(connect("redis://127.0.0.1:1/0", 1.0))).conn.cluster
    False
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def notify(self, name: str) -> None:
        """Announce that model ``name`` needs its owner's attention (it was released: the
        process that should own it takes it now)."""
        await self.conn.client.publish(wake_channel(name), name)

    def listen(self) -> Listener:
        """A subscription (``async with store.notices.listen() as listener``), to no model
        yet."""
        return Listener(self.conn.client.pubsub())
