"""The gallery aggregate: a model's 1:N identification gallery (one hash of items) and its
change count (in the model's meta), with the enrol's idempotency records (``enrol.lua``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.storage.client import Connection
from service.storage.errors import GalleryFull, NoSuchItem, NoSuchModel, guarded
from service.storage.keys import ModelKeys


@dataclass(frozen=True)
class Enrolled:
    """Outcome of an enrol: ``added`` of its items were new (the others replaced items with
    the same key), the gallery then held ``size`` items, and it was the ``changes``-th change
    of the gallery (0 for a replay, which changed nothing)."""

    added: int
    size: int
    changes: int
    replayed: bool = False
    fingerprint: str = ""


@guarded
class GalleryStore:
    """Gallery items in, gallery items out (every failure of Redis: Unavailable).

    >>> from service.storage.client import connect
    >>> GalleryStore(Connection(connect("redis://127.0.0.1:1/0", 1.0))).conn.cluster
    False
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def enrol(
        self,
        name: str,
        items: dict[str, bytes],
        *,
        idempotency_field: str,
        fingerprint: str,
        now_ms: int,
        ttl_ms: int,
        max_items: int,
        max_records: int = 0,
        on_dropped: Callable[[int], object] | None = None,
    ) -> Enrolled:
        """Write gallery items (key -> :func:`~service.storage.codec.encode_gallery_item`)
        and the idempotency record, atomically; :class:`NoSuchModel`, :class:`GalleryFull`.
        ``ttl_ms``, ``max_records`` and ``on_dropped``: as
        :meth:`~service.storage.logstore.LogStore.append_groups`."""
        keys = ModelKeys(name)
        args: list[Any] = [now_ms, ttl_ms, max_items, idempotency_field, fingerprint, max_records]
        for pair in items.items():
            args += pair
        out = await self.conn.run(
            "enrol", [keys.meta, keys.gallery, keys.idempotency, keys.idempotency_expiry], args
        )
        code = int(out[0])
        if code == 0:
            raise NoSuchModel(name)
        if code == 3:
            raise GalleryFull(int(out[1]))
        if code == 2:
            fp, added, size = out[1].decode().split(" ")
            return Enrolled(int(added), int(size), 0, replayed=True, fingerprint=fp)
        dropped = int(out[4])
        if dropped and on_dropped is not None:
            on_dropped(dropped)
        return Enrolled(int(out[2]), int(out[3]), int(out[1]), fingerprint=fingerprint)

    async def delete_item(self, name: str, key: str) -> int:
        """Remove a gallery item; the gallery's change count after it (:class:`NoSuchModel`,
        :class:`NoSuchItem`)."""
        keys = ModelKeys(name)
        out = await self.conn.run("delete_item", [keys.meta, keys.gallery], [key])
        code = int(out[0])
        if code == 0:
            raise NoSuchModel(name)
        if code == 2:
            raise NoSuchItem(key)
        return int(out[1])

    async def gallery_changes(self, name: str) -> int:
        """How many times the gallery was changed (enrols and deletes, by any process)."""
        raw = await self.conn.client.hget(ModelKeys(name).meta, "gallery")
        return int(raw) if raw is not None else 0

    async def read_gallery(self, name: str, attempts: int = 5) -> tuple[int, dict[str, bytes]]:
        """Every gallery item (key -> stored value) and the change count they are as of.

        Read in chunks (``HSCAN``: a large gallery does not block Redis for one long reply);
        the change count is read before and after, and the scan repeated (``attempts`` times)
        if another process changed the gallery meanwhile.
        """
        keys = ModelKeys(name)
        for _ in range(attempts):
            before = await self.gallery_changes(name)
            items: dict[str, bytes] = {}
            async for field, value in self.conn.client.hscan_iter(keys.gallery, count=1000):
                items[field.decode()] = value
            after = await self.gallery_changes(name)
            if after == before:
                break
        return after, items
