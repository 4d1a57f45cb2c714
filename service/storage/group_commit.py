"""Group commit of one model's appends: requests and frames that arrive together share one Lua
call, hence one AOF write and one fsync, instead of paying one each.

While an append script is in flight, new groups (a REST request's or a WS frame's samples) wait
in a queue; when it returns, everything queued goes in the next call, in arrival order. Each
group keeps its own seqs, its own idempotency record and its own outcome (a group over the
class limit is refused alone; a replay answers from its own record), exactly as if it had been
appended by itself at that point of the order. A caller that gave up (cancelled) before its
group was sent is left out: nothing of it is logged.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from service.storage.store import Appended, Group, Store, TooManyClasses


class GroupCommit:
    """The append queue of one model (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        ttl_ms: int,
        max_classes: int,
        max_samples: int,
        announce: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.name = name
        #: Whether an append is published on the model's channel (see Store.append_groups).
        self.announce = announce
        self.ttl_ms = ttl_ms
        self.max_classes = max_classes
        #: Most samples per script (a group larger than this still goes, alone).
        self.max_samples = max_samples
        self._pending: deque[tuple[Group, asyncio.Future[Appended]]] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def append(self, group: Group) -> Appended:
        """Append ``group`` (after every group submitted before it); raises what the store
        raises for it (:class:`TooManyClasses`, ``NoSuchModel``, ``RedisError``)."""
        future: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        self._pending.append((group, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name=f"append:{self.name}")
        return await future

    def _take(self) -> list[tuple[Group, asyncio.Future[Appended]]]:
        batch: list[tuple[Group, asyncio.Future[Appended]]] = []
        size = 0
        while self._pending:
            group, future = self._pending[0]
            if batch and size + len(group) > self.max_samples:
                break
            self._pending.popleft()
            if future.done():  # its caller was cancelled before it was sent: not logged
                continue
            batch.append((group, future))
            size += len(group)
        return batch

    async def _flush(self) -> None:
        batch: list[tuple[Group, asyncio.Future[Appended]]] = []
        try:
            while self._pending:
                batch = self._take()
                if not batch:
                    continue
                try:
                    outcomes = await self.store.append_groups(
                        self.name,
                        [group for group, _ in batch],
                        now_ms=int(time.time() * 1000),
                        ttl_ms=self.ttl_ms,
                        max_classes=self.max_classes,
                        announce=self.announce(),
                    )
                except Exception as exc:  # the whole call failed: every group in it did
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, TooManyClasses):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._flusher = None
            # Cancelled (shutdown) with callers still waiting: they must not wait forever.
            for _, future in [*batch, *self._pending]:
                if not future.done():
                    future.cancel()
            self._pending.clear()
