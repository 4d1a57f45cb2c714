"""Per-sample results kept for ``?wait=true`` ingestion requests still in flight.

A ``?wait=true`` request answers with each of its samples' step results (outcome, hinge,
distances). The writer hands every batch's results to :meth:`StepResultsKeeper.record`, which
keeps only those a waiting request can still ask for: each request registers a floor (every
seq it can be given is above it), results at or below the smallest floor are dropped, and none
are kept while nobody waits.

>>> from service.core import StepResult
>>> keeper = StepResultsKeeper()
>>> token = keeper.want(floor=0)
>>> keeper.record([1, 2], [StepResult("new_class"), StepResult("passive", -1.0, 1.0, 3.0)])
>>> [r["outcome"] for r in keeper.results(1, 2)]
['new_class', 'passive']
>>> keeper.release(token); keeper.results(1, 2) is None
True
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from service.core import StepResult


class StepResultsKeeper:
    """The results ``?wait=true`` requests are waiting for (see the module docstring)."""

    def __init__(self) -> None:
        self._floors: dict[int, int] = {}
        self._results: dict[int, StepResult] = {}
        self._tokens = itertools.count()

    @property
    def wanted(self) -> bool:
        """True while some request waits for results."""
        return bool(self._floors)

    def want(self, floor: int) -> int:
        """Register interest in results of seqs above ``floor``; returns a token."""
        token = next(self._tokens)
        self._floors[token] = floor
        return token

    def raise_floor(self, token: int, floor: int) -> None:
        """The request now knows its seqs are above ``floor``."""
        self._floors[token] = floor
        self._prune()

    def release(self, token: int) -> None:
        self._floors.pop(token, None)
        self._prune()

    def record(self, seqs: Sequence[int], results: Sequence[StepResult]) -> None:
        """Keep the results of a batch that someone may still wait for."""
        if not self._floors:
            return
        low = min(self._floors.values())
        for seq, result in zip(seqs, results, strict=True):
            if seq > low:
                self._results[seq] = result

    def results(self, first: int, last: int) -> list[dict[str, Any]] | None:
        """Per-sample results of seqs ``first..last`` if still kept, else None."""
        kept = self._results
        if any(seq not in kept for seq in range(first, last + 1)):
            return None
        return [{"seq": seq, **kept[seq].to_dict()} for seq in range(first, last + 1)]

    def _prune(self) -> None:
        if not self._floors:
            self._results.clear()
            return
        low = min(self._floors.values())
        for seq in [s for s in self._results if s <= low]:
            del self._results[seq]
