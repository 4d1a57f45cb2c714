"""A model's writer lease: which process applies the log and writes checkpoints.

The lease is the Redis string ``opml:{name}:lease`` = ``"<fencing token> <owner id>"`` with a
TTL of ``OPML_LEASE_TTL_S``; a grant takes a new fencing token from ``INCR opml:{name}:fence``
(Lua scripts of :mod:`service.storage.leases`). The registry's lease loop calls :meth:`Lease.claim`
every third of the TTL: it renews the lease while we hold it, or takes it when it is free. The
checkpoint script refuses a write whose token is not the latest granted, so a process paused
past its lease (GC, SIGSTOP, a VM migration) can never overwrite a newer owner's checkpoint; it
finds out through :class:`~service.storage.store.Fenced` and calls :meth:`Lease.lose`.
"""

from __future__ import annotations

import logging
import time

from service.errors import Unavailable
from service.storage.store import Store

log = logging.getLogger("service.lease")


class Lease:
    """Our hold on one model's lease (``token`` is None while another process owns it).

    >>> lease = Lease(store=None, name="faces", owner_id="host:1:ab", created_at=1.0, ttl_s=10)
    >>> lease.held, lease.token
    (False, None)
    """

    def __init__(
        self, store: Store | None, name: str, owner_id: str, created_at: float, ttl_s: float
    ) -> None:
        self.store = store
        self.name = name
        self.owner_id = owner_id
        self.created_at = created_at
        self.ttl_s = ttl_s
        #: Our fencing token while we hold the lease; None: we do not own the model.
        self.token: int | None = None
        self._ok_at = 0.0  # monotonic start of the last successful claim

    @property
    def held(self) -> bool:
        return self.token is not None

    async def claim(self) -> bool:
        """Renew the lease, or take it if it is free; True when we have just taken it.

        A Redis error is raised to the caller; if the lease could not be renewed for longer
        than its TTL we stop counting on it (Redis fencing would refuse our checkpoints anyway).
        """
        assert self.store is not None
        started = time.monotonic()
        try:
            ours, token = await self.store.claim_lease(
                self.name,
                self.owner_id,
                int(self.ttl_s * 1000),
                repr(self.created_at),
                self.token,
            )
        except Unavailable:
            if self.token is not None and started - self._ok_at > self.ttl_s:
                self.lose("it could not be renewed")
            raise
        if not ours:
            if self.token is not None:
                self.lose(f"token {token} was granted to another process")
            return False
        taken = self.token != token
        if taken:
            log.info("%s: this process now owns the model (fencing token %s)", self.name, token)
        self.token = token
        self._ok_at = started
        return taken

    def lose(self, why: str) -> None:
        """We no longer own the model (``why`` is logged)."""
        log.warning("%s: lease lost (%s); following the log read-only", self.name, why)
        self.token = None

    async def release(self) -> None:
        """Hand the lease back at once (after a final checkpoint), so another process takes
        over without waiting for the TTL."""
        if self.store is not None and self.token is not None:
            await self.store.release_lease(self.name, self.owner_id, self.token)
            self.token = None
