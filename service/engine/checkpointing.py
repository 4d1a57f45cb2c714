"""When the writer checkpoints, and what a checkpoint in flight counted as saved.

A checkpoint falls due after ``OPML_CHECKPOINT_EVERY`` applied samples, or
``OPML_CHECKPOINT_INTERVAL_S`` after the first change since the latest one. The writer encodes
it from a snapshot (:class:`PendingCheckpoint`) and writes it beside its batches; a write that
fails puts back what it counted as saved, so it falls due again.

>>> due = CheckpointSchedule(every=3, interval_s=60.0)
>>> due.learned(2, now=0.0); due.due(now=1.0)
False
>>> due.learned(1, now=1.0); due.due(now=1.0)
True
>>> since, dirty = due.take(); due.due(now=1.0), since
(False, 3)
>>> due.put_back(since, dirty); due.due(now=1.0)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.storage.codec import StreamId


@dataclass(frozen=True)
class CheckpointInfo:
    """What the latest known checkpoint covers (``seq``) and when it was written."""

    seq: int = 0
    at: float | None = None


@dataclass(frozen=True, slots=True)
class PendingCheckpoint:
    """A checkpoint encoded and not yet written, and what it counted as saved."""

    checkpoint: dict[str, bytes]
    buffer: dict[str, bytes]
    applied: StreamId
    version: int
    time: float
    token: int
    since: int  # samples it covers that the previous checkpoint did not
    dirty_since: float | None
    started: float  # perf_counter when it was encoded


class CheckpointSchedule:
    """The samples learned since the latest checkpoint, and since when the learner differs
    from it (monotonic time; None: it does not)."""

    def __init__(self, every: int, interval_s: float) -> None:
        self.every = every
        self.interval_s = interval_s
        self.since = 0
        self.dirty_since: float | None = None

    def learned(self, samples: int, now: float) -> None:
        """A batch of ``samples`` was applied at ``now``."""
        self.since += samples
        if self.dirty_since is None:
            self.dirty_since = now

    def due(self, now: float) -> bool:
        if self.since >= self.every:
            return True
        return self.dirty_since is not None and now - self.dirty_since >= self.interval_s

    def reset(self) -> None:
        """The learner is as checkpointed (restored from a checkpoint)."""
        self.since = 0
        self.dirty_since = None

    def take(self) -> tuple[int, float | None]:
        """Count everything as saved (a checkpoint of it is being written); what was due."""
        taken = self.since, self.dirty_since
        self.reset()
        return taken

    def put_back(self, since: int, dirty_since: float | None) -> None:
        """A checkpoint write failed: what it had taken is unsaved again."""
        self.since += since
        if dirty_since is not None:
            self.dirty_since = min(dirty_since, self.dirty_since or math.inf)
