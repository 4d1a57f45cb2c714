"""The learner's state format: everything a :class:`~service.core.learner.Learner` needs to
resume bit-identically, as float64 arrays and JSON-safe metadata.

:func:`dump` and :func:`load` are the learner's persistence half (``Learner.to_state`` and
``Learner.from_state`` call them): they read and set the learner's private fields, which nothing
else outside the learner touches. There is one format, :data:`STATE_FORMAT`; a state in any
other, or with a field or array missing, is refused with a ``ValueError`` (so is an inconsistent
one), never read by guesswork.

Arrays: ``L`` (the served track's; for ``sgd`` / ``brm`` the stored factor: the served ``L`` is
``meta["scale"]`` times it, their lazy decay, 1 for every other algorithm and without decay),
``buffer`` (H, one row per class) and ``calibration`` (its threshold window); while a
``gamma="auto"`` race runs, also ``tracks_L`` and ``tracks_calibration`` (every candidate's)
and ``race_pairs`` (the current rung's measurements); with ``rehearsal > 0``,
``rehearsal_rows`` and ``rehearsal_slots`` (the reservoir); with ``lda`` or
``precondition="whiten"``, ``within_counts``, ``within_means`` and ``within_scatter``
(:mod:`service.core.within`), and with the latter once it has one ``whitening`` (``W``;
``L`` is then the factor learned on ``W x``); with held-out routing or PAC-Bayes
certificates, their windows and prior (:mod:`service.core.holdout`). A store must keep
every array it is given.

Metadata: ``format``, ``config`` (the :class:`~service.core.config.LearnerConfig` fields),
``classes`` (in order of first appearance), ``rng`` (the PCG64 state, its 128-bit integers as
decimal strings), ``samples_seen``, ``outcomes`` (non-zero step counts), ``scale``,
``stability``, ``stream`` (the running scale of ``step="scaled"``), ``tracks``, ``race``,
``holdout`` and, with rehearsal, ``rehearsal``. Floats survive JSON exactly (``repr``
round-trips).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol, TypeVar

import numpy as np

from service.core._validation import (
    Array,
    check_int,
    check_matrix,
    check_metric,
    check_positive,
)
from service.core.config import LearnerConfig
from service.core.holdout import Holdout
from service.core.race import Race
from service.core.rehearsal import Reservoir
from service.core.stability import StabilityTracker
from service.core.tracks import Tracks
from service.core.update import OUTCOMES
from service.core.within import WithinClass

#: The layout of :func:`dump` (2: step rules, scale estimate, divergence monitor, race and
#: tracks are part of it).
STATE_FORMAT = 2


class _Counters(Protocol):
    samples_seen: int
    outcomes: Any  # int64 steps by outcome code (indexes OUTCOMES)


class Resumable(Protocol):
    """What the state holds of a learner: the fields :func:`dump` reads and :func:`load` sets
    (:class:`~service.core.learner.Learner`'s; a protocol, since the learner's module imports
    this one).

    >>> from service.core import Learner, LearnerConfig
    >>> learner = Learner(LearnerConfig(dim=2))
    >>> _ = learner.learn_many([[0.0, 1.0], [1.0, 0.0], [0.0, 0.9]], ["a", "b", "a"])
    >>> arrays, meta = dump(learner)
    >>> sorted(arrays), meta["format"], meta["classes"]
    (['L', 'buffer', 'calibration'], 2, ['a', 'b'])
    >>> (load(Learner, arrays, meta).L == learner.L).all()
    np.True_
    """

    config: LearnerConfig
    holdout: Holdout
    _rng: np.random.Generator
    _buffer: Array
    _classes: list[str]
    _scale: float
    _stability: StabilityTracker
    _stream: Array
    _tracks: Tracks
    _race: Race | None
    _reservoir: Reservoir | None
    _within: WithinClass | None
    _W: Array | None
    _first: int

    def _trained(self) -> int: ...

    @property
    def _stats(self) -> _Counters: ...

    @property
    def dim(self) -> int: ...

    @property
    def counts(self) -> dict[str, int]: ...

    def _remember(self, key: str, x: Array) -> None: ...


R = TypeVar("R", bound=Resumable)


def dump(learner: Resumable) -> tuple[dict[str, Array], dict[str, Any]]:
    """Arrays and JSON-safe metadata holding everything needed to resume ``learner`` exactly."""
    rng = learner._rng.bit_generator.state
    n_classes = len(learner._classes)
    track_arrays, track_meta = learner._tracks.to_state()
    arrays = {"buffer": learner._buffer[:n_classes].copy(), **track_arrays}
    meta: dict[str, Any] = {
        "format": STATE_FORMAT,
        "config": asdict(learner.config),
        "classes": list(learner._classes),
        "rng": {
            "bit_generator": rng["bit_generator"],
            "state": str(rng["state"]["state"]),
            "inc": str(rng["state"]["inc"]),
            "has_uint32": int(rng["has_uint32"]),
            "uinteger": int(rng["uinteger"]),
        },
        "samples_seen": learner._stats.samples_seen,
        "outcomes": {k: v for k, v in learner.counts.items() if v},
        "scale": learner._scale,
        "stability": learner._stability.to_state(n_classes),
        "stream": learner._stream.tolist(),
        "tracks": track_meta,
        "race": None,
    }
    if learner._race is not None:
        pairs, meta["race"] = learner._race.to_state()
        if not learner._race.done:
            arrays["race_pairs"] = pairs
    held_arrays, meta["holdout"] = learner.holdout.to_state()
    arrays.update(held_arrays)
    if learner._reservoir is not None:
        rehearsal_arrays, meta["rehearsal"] = learner._reservoir.to_state()
        arrays.update(rehearsal_arrays)
    if learner._within is not None:
        arrays.update(learner._within.to_state(n_classes))
    if learner._W is not None:
        arrays["whitening"] = learner._W.copy()
        meta["first"] = learner._first
    return arrays, meta


def load(cls: Callable[[LearnerConfig], R], arrays: dict[str, Array], meta: dict[str, Any]) -> R:
    """A ``cls`` learner rebuilt from :func:`dump` output; ValueError if the state is not in
    :data:`STATE_FORMAT`, incomplete or inconsistent."""
    fmt = meta.get("format")
    if fmt != STATE_FORMAT:
        raise ValueError(f"state: unsupported format {fmt!r} (this version reads {STATE_FORMAT})")
    try:
        return _load(cls, arrays, meta)
    except KeyError as missing:
        raise ValueError(f"state: no {missing.args[0]!r}") from None


def _load(cls: Callable[[LearnerConfig], R], arrays: dict[str, Array], meta: dict[str, Any]) -> R:
    learner = cls(LearnerConfig(**meta["config"]))
    d = learner.dim
    L = np.array(check_metric(arrays["L"], d, "L"), dtype=np.float64, order="C")
    learner._tracks = Tracks.from_state(arrays, meta["tracks"], L, d)
    stream = np.array(meta["stream"], dtype=np.float64)
    if stream.shape != (2,) or not np.isfinite(stream).all() or (stream < 0).any():
        raise ValueError("state: stream scale is not two finite numbers >= 0")
    learner._stream = stream
    if (meta["race"] is None) != (learner._race is None):
        raise ValueError("state: race state does not match gamma")
    if meta["race"] is not None:
        pairs = arrays.get("race_pairs", np.empty((0, 0, 2)))  # none once the race is done
        learner._race = race = Race.from_state(pairs, meta["race"])
        if race.started and not race.done and len(race.alive) != len(learner._tracks):
            raise ValueError("state: race candidates and tracks do not match")
    classes = [str(k) for k in meta["classes"]]
    buffer = check_matrix(np.asarray(arrays["buffer"]).reshape(-1, d), d, "buffer")
    if len(buffer) != len(classes) or len(set(classes)) != len(classes):
        raise ValueError("state: buffer rows and classes do not match")
    for key, row in zip(classes, buffer, strict=True):
        learner._remember(key, row)
    if (meta.get("rehearsal") is None) != (learner._reservoir is None):
        raise ValueError("state: rehearsal reservoir does not match rehearsal")
    if learner._reservoir is not None:
        learner._reservoir.restore(arrays, meta["rehearsal"], len(classes))
    if learner._within is not None:
        learner._within.restore(arrays, len(classes))
    if "whitening" in arrays:  # absent: no W yet (or no precondition)
        if learner.config.precondition == "none":
            raise ValueError("state: whitening does not match precondition")
        W = check_matrix(np.asarray(arrays["whitening"]), d, "whitening")
        if W.shape != (d, d):
            raise ValueError("state: whitening is not d x d")
        learner._W = np.array(W, dtype=np.float64, order="C")
    rng = meta["rng"]
    learner._rng.bit_generator.state = {
        "bit_generator": rng["bit_generator"],
        "state": {"state": int(rng["state"]), "inc": int(rng["inc"])},
        "has_uint32": int(rng["has_uint32"]),
        "uinteger": int(rng["uinteger"]),
    }
    learner._stats.samples_seen = int(meta["samples_seen"])
    for name, count in meta["outcomes"].items():
        learner._stats.outcomes[OUTCOMES.index(name)] = int(count)
    learner._scale = check_positive(meta["scale"], "scale")
    if learner._W is not None:
        # A state written before this schedule (no "first") resumes as if its W had just come.
        first = meta.get("first", max(learner._trained(), 1))
        learner._first = check_int(first, "first", 1, 2**62)
    learner._stability.restore(meta["stability"], len(classes))
    learner.holdout.restore(arrays, meta["holdout"])
    return learner
