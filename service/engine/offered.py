"""The appends this process logged, kept by the writer to apply without reading them back
(:meth:`service.engine.writer.Writer.offer`; when that is safe: the writer's module docstring).

>>> import numpy as np
>>> from service.storage.store import Appended, Group
>>> cache = OfferedEntries()
>>> cache.add(Appended(1, 2, puts=0), Group(b"x", ["a", "b"], "", "fp"), None, at=10.0)
>>> cache.next_of(0).last_seq, 1 in cache, len(cache)
(2, True, 1)
>>> entries, decoded = cache.take(0, count=8, metric_puts=0)
>>> [entry_id for entry_id, _ in entries], len(cache)
([(2, 1)], 0)
"""

from __future__ import annotations

from typing import NamedTuple

from service.core._validation import Array
from service.core.holdout import Flags
from service.storage.codec import StreamId
from service.storage.store import Appended, Group

#: A log entry as read: (id, fields); and a batch of them.
Entry = tuple[StreamId, dict[bytes, bytes]]
Entries = list[Entry]
#: The samples of a sample entry, as decoding it gives them: rows, class keys, ``holdout``
#: flags (None: none set).
Decoded = tuple[Array, list[str], Flags | None]

#: Most appends kept (beyond it they are read back from the log).
MAX_OFFERED = 4096


class Offered(NamedTuple):
    """One append of this process as logged: the metric replacements logged before it
    (``puts``), its log entry, the samples it was encoded from, and when it was offered."""

    puts: int
    entry: Entry
    decoded: Decoded | None
    at: float

    @property
    def last_seq(self) -> int:
        """The seq of its last sample (its entry's id is ``<last_seq>-1``)."""
        return self.entry[0][0]


class OfferedEntries:
    """The offered appends by the seq of their first sample."""

    def __init__(self) -> None:
        self._by_first: dict[int, Offered] = {}

    def __len__(self) -> int:
        return len(self._by_first)

    def __contains__(self, first_seq: int) -> bool:
        return first_seq in self._by_first

    def add(self, appended: Appended, group: Group, decoded: Decoded | None, at: float) -> None:
        """Keep ``group``, logged as ``appended`` (not when the metric replacements before it
        are unknown, nor beyond :data:`MAX_OFFERED`)."""
        if appended.puts < 0 or len(self._by_first) >= MAX_OFFERED:
            return
        entry = ((appended.last_seq, 1), group.entry_fields())
        self._by_first[appended.first_seq] = Offered(appended.puts, entry, decoded, at)

    def next_of(self, version: int) -> Offered | None:
        """The offered append that follows the applied ``version``, if any."""
        return self._by_first.get(version + 1)

    def take(
        self, version: int, count: int, metric_puts: int
    ) -> tuple[Entries, list[Decoded | None]]:
        """The offered entries that certainly follow ``version`` in the log (at most
        ``count``; none past a metric replacement not applied yet: ``metric_puts`` applied),
        in order, removed; and their samples as offered."""
        entries: Entries = []
        decoded: list[Decoded | None] = []
        while len(entries) < count and (offered := self._by_first.get(version + 1)) is not None:
            if offered.puts != metric_puts:  # a metric replacement comes first: read the log
                break
            del self._by_first[version + 1]
            entries.append(offered.entry)
            decoded.append(offered.decoded)
            version = offered.last_seq
        return entries, decoded

    def drop_through(self, version: int) -> None:
        """Forget the appends that start at or before ``version`` (applied)."""
        if self._by_first:
            for first in [first for first in self._by_first if first <= version]:
                del self._by_first[first]

    def held_until(self, version: int, enough: int, delay_s: float) -> float | None:
        """When the run of offered appends that follows ``version`` is due (the first one's
        offer time plus ``delay_s``), or None when it holds ``enough`` samples already."""
        first = self._by_first[version + 1]
        while (offered := self._by_first.get(version + 1)) is not None:
            enough -= offered.last_seq - version
            if enough <= 0:
                return None
            version = offered.last_seq
        return first.at + delay_s
