"""The models aggregate: each model's meta hash (it exists if and only if its meta does) and the
model index, the set of model names.

The model index may lag behind the metas: create writes the meta first (``create.lua``) and then
adds the name; delete removes every key of the model, meta included, in one ``DEL`` (atomic: one
slot) and then the name. So a crash between the two steps leaves, at worst, a model index name
without a meta (not a model: skipped and removed at start-up) or a meta whose name is missing
from the model index (found at start-up by :meth:`ModelStore.repair_index`, and at any time by
name through :meth:`ModelStore.model_exists`); never a model without its meta or half of a
deleted model.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

from service.storage.client import Connection
from service.storage.errors import guarded
from service.storage.keys import META_PATTERN, MODEL_INDEX, ModelKeys, name_of_meta

log = logging.getLogger("service.store")


@guarded
class ModelStore:
    """The models' metas and their model index (every failure of Redis: Unavailable).

    >>> from service.storage.client import connect
    >>> ModelStore(Connection(connect("redis://127.0.0.1:1/0", 1.0))).conn.cluster
    False
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def create_model(self, name: str, config: dict[str, Any], created_at: float) -> bool:
        """Create the model (its meta hash), then add its name to the model index; False if it
        exists. A failure between the two leaves a model missing from the index, which
        :meth:`repair_index` and :meth:`model_exists` find."""
        keys = ModelKeys(name)
        done = await self.conn.run("create", [keys.meta], [json.dumps(config), repr(created_at)])
        if done:
            await self.conn.client.sadd(MODEL_INDEX, name)
        return bool(done)

    async def model_exists(self, name: str) -> bool:
        """Whether the model exists (its meta does), whatever the model index says: one EXISTS."""
        return bool(await self.conn.client.exists(ModelKeys(name).meta))

    async def model_names(self) -> list[str]:
        """The model index: every model's name, and possibly a few names whose create or delete
        did not finish (their meta is missing: not models)."""
        names = cast(set[bytes], await self.conn.client.smembers(MODEL_INDEX))
        return sorted(n.decode() for n in names)

    async def repair_index(self) -> list[str]:
        """Make the model index list exactly the models (start-up): remove names without a meta,
        add metas whose name is missing; log each repair; return the models' names.

        Metas are found with ``SCAN MATCH opml:{*}:meta`` on every master (the cluster client
        scans each one): O(keys) once per start, the price of an index that may lag behind."""
        registered = set(await self.model_names())
        metas = {name_of_meta(key) async for key in self.conn.client.scan_iter(META_PATTERN, 1000)}
        for name in sorted(metas - registered):
            log.warning("model %r was missing from the model index (a create that did not "
                        "finish); added", name)  # fmt: skip
            await self.conn.client.sadd(MODEL_INDEX, name)
        dangling = sorted(registered - metas)
        if dangling:
            await self.conn.client.srem(MODEL_INDEX, *dangling)
            # A create of that name may be under way: its meta written after our SCAN and its
            # name added before our SREM. Look again after the SREM and put such names back.
            for name in dangling:
                if await self.model_exists(name):
                    await self.conn.client.sadd(MODEL_INDEX, name)
                    metas.add(name)
                else:
                    log.warning("model index name %r has no model (a create or delete that did "
                                "not finish); removed", name)  # fmt: skip
        return sorted(metas)

    async def model_meta(self, name: str) -> dict[str, str] | None:
        raw = cast(dict[bytes, bytes], await self.conn.client.hgetall(ModelKeys(name).meta))
        return {k.decode(): v.decode() for k, v in raw.items()} if raw else None

    async def created_stamps(self, names: list[str]) -> dict[str, str | None]:
        """Each model's ``created_at`` as stored (None: gone); tells incarnations apart."""
        async with self.conn.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hget(ModelKeys(name).meta, "created_at")
            stamps = await pipe.execute()
        return {n: None if s is None else s.decode() for n, s in zip(names, stamps, strict=True)}

    async def delete_model(self, name: str) -> None:
        """Remove every key of the model in one DEL (atomic: they share one slot; the model
        stops existing with its meta), then its model index entry."""
        await self.conn.client.delete(*ModelKeys(name).all())
        await self.conn.client.srem(MODEL_INDEX, name)
