"""The leases aggregate: which process learns each model (its writer lease and fencing token),
and the membership of the service processes (their heartbeats).

Fencing: a lease grant takes a new token from ``INCR <fence>`` (``claim.lua``); the checkpoint
script refuses a write whose token is not the latest granted, so a process that was paused past
its lease can never overwrite a newer owner's checkpoint.
"""

from __future__ import annotations

from typing import cast

from service.storage.client import Connection
from service.storage.errors import guarded
from service.storage.keys import MEMBERS, ModelKeys


@guarded
class LeaseStore:
    """Writer leases and process membership (every failure of Redis: Unavailable).

    >>> from service.storage.client import connect
    >>> LeaseStore(Connection(connect("redis://127.0.0.1:1/0", 1.0))).conn.cluster
    False
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def claim_lease(
        self, name: str, owner: str, ttl_ms: int, created_at: str, held: int | None
    ) -> tuple[bool, int | None]:
        """Renew our lease (``held`` = its token) or take a free one.

        Returns (ours, token): (True, our token), (False, the holder's token) or (False, None)
        when the model is gone or is another incarnation (``created_at`` differs).
        """
        keys = ModelKeys(name)
        out = await self.conn.run(
            "claim",
            [keys.lease, keys.fence, keys.meta],
            [owner, ttl_ms, created_at, "" if held is None else str(held)],
        )
        code = int(out[0])
        if code == 0:
            return False, None
        return code == 1, int(out[1])

    async def release_lease(self, name: str, owner: str, token: int) -> bool:
        return bool(await self.conn.run("release", [ModelKeys(name).lease], [f"{token} {owner}"]))

    async def lease_holder(self, name: str) -> str | None:
        """The member id of the process holding the model's lease (None: nobody)."""
        raw = cast(bytes | None, await self.conn.client.get(ModelKeys(name).lease))
        return None if raw is None else raw.decode().split(" ", 1)[1]

    async def heartbeat(self, member: str, info: str, ttl_ms: int) -> dict[str, str]:
        """Announce ``member`` (``info``: its JSON) for ``ttl_ms``; the live members' infos."""
        flat = await self.conn.run("heartbeat", [MEMBERS], [member, info, ttl_ms])
        return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}

    async def leave(self, member: str) -> None:
        """``member`` stops (a graceful shutdown): the others need not wait for its expiry."""
        await self.conn.client.hdel(MEMBERS, member)
