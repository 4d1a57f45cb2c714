"""The service processes sharing a Redis keyspace, and which of them should own each model.

Each process announces itself in the Redis hash ``opml:members`` (member id -> expiry and
``{"url": ...}``) with a heartbeat every third of ``OPML_LEASE_TTL_S``; a member whose heartbeat
is older than the TTL has left (the expiry is stamped with the Redis server's clock, so hosts'
clocks do not matter). A graceful stop removes the entry at once.

Which process should own a model is decided by rendezvous (highest random weight) hashing over
the live members: every process computes the same answer from the same member list, models
spread evenly, and when a member joins or leaves only the models whose top-weight member
changed move -- about 1/N of them. The decision is advice for placement only: the writer lease
(:mod:`service.engine.lease`) still guarantees that one process at a time applies and
checkpoints a model, with fencing; a process whose view of the members is briefly different
only delays a hand-over.

>>> rendezvous("faces", ["a", "b", "c"]) in {"a", "b", "c"}
True
>>> rendezvous("faces", ["a", "b", "c"]) == rendezvous("faces", ["c", "a", "b"])
True
>>> rendezvous("faces", [])
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field

from service.storage.store import Store

log = logging.getLogger("service.membership")


def _weight(member: str, model: str) -> int:
    digest = hashlib.blake2b(f"{member}\x00{model}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(model: str, members: list[str]) -> str | None:
    """The member with the highest weight for ``model`` (None without members)."""
    return max(members, key=lambda m: (_weight(m, model), m), default=None)


@dataclass
class Membership:
    """This process's membership and its latest view of the others."""

    store: Store
    member_id: str
    url: str
    ttl_s: float
    #: Live members (id -> advertised URL) as of the latest heartbeat.
    members: dict[str, str] = field(default_factory=dict)

    async def heartbeat(self) -> dict[str, str]:
        """Announce this process and refresh :attr:`members` (a Redis error is raised)."""
        info = json.dumps({"url": self.url})
        raw = await self.store.heartbeat(self.member_id, info, int(self.ttl_s * 1000))
        members = {}
        for member, text in raw.items():
            try:
                members[member] = str(json.loads(text)["url"])
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a malformed member entry %r", member)
        if members.keys() != self.members.keys():
            log.info("members: %s", ", ".join(sorted(members)))
        self.members = members
        return members

    def owner_of(self, model: str) -> str | None:
        """The member that should own ``model`` (by rendezvous over the live members)."""
        return rendezvous(model, sorted(self.members))

    def should_own(self, model: str) -> bool:
        # Alone (or before the first heartbeat): every model is ours.
        return self.owner_of(model) in (self.member_id, None)

    async def leave(self) -> None:
        await self.store.leave(self.member_id)
