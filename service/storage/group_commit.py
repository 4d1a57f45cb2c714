"""Group commit of one model's appends: requests and frames that arrive together share one Lua
call, hence one AOF write and one fsync, instead of paying one each.

While an append script is in flight, new groups (a REST request's or a WS frame's samples) wait
in a queue; when it returns, everything queued goes in the next call, in arrival order (after
the tasks already woken have run, so that frames received meanwhile join it). Each
group keeps its own seqs, its own idempotency record and its own outcome (a group over the
class limit is refused alone; a replay answers from its own record), exactly as if it had been
appended by itself at that point of the order. A caller that gave up before its group was sent
is left out: nothing of it is logged.

Every append queued is settled exactly once (:meth:`Append.settle`): with its outcome, with
what failed its call, with None when it was left out, or with ``CancelledError`` when the queue
stops (shutdown) before sending it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from service.storage.store import Appended, Group, Store, TooManyClasses

log = logging.getLogger("service.group_commit")


class Append(Protocol):
    """One append in the queue: its group, whether its caller gave up, and its outcome's
    destination."""

    @property
    def group(self) -> Group: ...

    def gave_up(self) -> bool:
        """True: leave the group out if it was not sent yet."""

    def settle(self, outcome: Appended | BaseException | None) -> None:
        """What became of the group: logged or replayed (:class:`Appended`), refused
        (:class:`TooManyClasses`, ``NoSuchModel``, ``Unavailable`` for its call), left out
        (None), or never sent because the queue stopped (``CancelledError``)."""


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
        max_records: int = 0,
        announce: Callable[[], bool] = lambda: True,
        on_dropped: Callable[[int], object] | None = None,
    ) -> None:
        self.store = store
        self.name = name
        #: Whether an append is published on the model's channel (see Store.append_groups).
        self.announce = announce
        self.ttl_ms = ttl_ms
        #: Most idempotency records the model keeps (0: no cap), and what to tell how many the
        #: cap removed (Store.append_groups).
        self.max_records = max_records
        self.on_dropped = on_dropped
        self.max_classes = max_classes
        #: Most samples per script (a group larger than this still goes, alone).
        self.max_samples = max_samples
        self._pending: deque[Append] = deque()
        self._flusher: asyncio.Task[None] | None = None

    def submit(self, append: Append) -> None:
        """Queue ``append`` for the log, after every append submitted before it."""
        self._pending.append(append)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name=f"append:{self.name}")

    def _take(self) -> list[Append]:
        batch: list[Append] = []
        size = 0
        while self._pending:
            append = self._pending[0]
            if batch and size + len(append.group) > self.max_samples:
                break
            self._pending.popleft()
            if append.gave_up():  # not sent: not logged
                _settle(append, None)
                continue
            batch.append(append)
            size += len(append.group)
        return batch

    async def _flush(self) -> None:
        batch: list[Append] = []
        try:
            while self._pending:
                batch = self._take()
                if not batch:
                    continue
                try:
                    outcomes: list[Appended | TooManyClasses] = await self.store.append_groups(
                        self.name,
                        [append.group for append in batch],
                        now_ms=int(time.time() * 1000),
                        ttl_ms=self.ttl_ms,
                        max_classes=self.max_classes,
                        max_records=self.max_records,
                        announce=self.announce(),
                        on_dropped=self.on_dropped,
                    )
                except Exception as exc:  # the whole call failed: every group in it did
                    done, batch = batch, []
                    for append in done:
                        _settle(append, exc)
                    continue
                done, batch = batch, []
                for append, outcome in zip(done, outcomes, strict=True):
                    _settle(append, outcome)
                if self._pending:
                    # Let the tasks already woken run first: readers that this event-loop pass
                    # handed frames submit theirs, which then go in the next call instead of
                    # waiting a whole round trip for the one after
                    # (docs/design/single-writer-log.md).
                    await asyncio.sleep(0)
        finally:
            self._flusher = None
            # Cancelled (shutdown) with appends unsettled: their callers must not wait forever.
            for append in [*batch, *self._pending]:
                _settle(append, asyncio.CancelledError())
            self._pending.clear()


def _settle(append: Append, outcome: Appended | BaseException | None) -> None:
    """``append.settle(outcome)``; a settle that fails (a bug) is logged, and the appends
    after it in the call are still settled (their callers would wait forever)."""
    try:
        append.settle(outcome)
    except Exception:
        log.exception("settling an append failed")
