"""Typed answers of the service (frozen dataclasses); vectors and matrices come back as numpy.

Each type is built from the JSON the contract defines (``from_json``) and keeps the whole
document in ``raw``, so members the service adds beyond the contract stay reachable.

>>> d = Distance.from_json({"distance": 2.0, "squared_distance": 4.0, "version": 7})
>>> d.distance, d.version
(2.0, 7)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
#: A class label as the contract knows it: an int, or a string of 1-128 characters.
Label = int | str
#: A gallery item's id: an int, or a string of 1-256 characters.
ItemId = int | str


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class VerificationState:
    """A model's online-calibrated verification threshold (squared-distance units)."""

    threshold: float | None
    calibrated: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> VerificationState:
        return cls(_opt_float(doc.get("threshold")), bool(doc.get("calibrated")), doc)


@dataclass(frozen=True)
class Model:
    """A model: hyperparameters and live state.

    ``updates`` counts steps by outcome (``triplet``, ``pair``, ``passive``, ...); ``classes`` is
    what the service reports for the classes seen (their number). ``step`` is the step rule:
    ``"scaled"`` or ``"paper"`` for opml/copml (``"paper"`` from a service that predates step
    rules), ``"constant"``, ``"descent"`` or ``"invsqrt"`` for sgd, sgd_psd and brm. ``gamma``
    is a number or ``"auto"`` (None for the gradient learners); ``health`` the divergence
    monitor (``state``, ``times_tripped``, ``step_scale``, ...; opml/copml only) and ``race``
    the ``gamma="auto"`` race (``state``, ``winner``, ``rounds``, ...; None otherwise), as the
    service reports them (None if it does not).

    >>> m = Model.from_json({"name": "faces", "dim": 2, "algorithm": "copml", "gamma": 0.001,
    ...     "gamma_pair": 0.001, "margin": 1.0, "normalize": "none", "seed": 0, "version": 3,
    ...     "samples_seen": 3, "classes": 2, "updates": {"triplet": 1, "pair": 0, "passive": 0},
    ...     "verification": {"threshold": None, "calibrated": False}})
    >>> m.name, m.samples_seen, m.updates["triplet"], m.verification.calibrated
    ('faces', 3, 1, False)
    >>> m.step, m.health, m.race
    ('paper', None, None)
    """

    name: str
    dim: int
    algorithm: str
    gamma: float | Literal["auto"] | None
    gamma_pair: float | None
    margin: float
    normalize: str
    seed: int
    version: int
    samples_seen: int
    classes: Any
    updates: dict[str, int]
    verification: VerificationState
    step: str | None = "paper"
    health: dict[str, Any] | None = None
    race: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: The gradient learners' hyperparameters (``sgd``, ``sgd_psd``, ``brm``; None where the
    #: algorithm does not use one, and for ``gamma`` of these three).
    eta: float | None = None
    mu: float | None = None
    kappa: float | None = None
    lam: float | None = None
    #: Step-mass diagnostics (not a generalisation bound); None from a service without them.
    stability: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Model:
        step = doc.get("step")
        if step is None and doc["algorithm"] in ("opml", "copml"):
            step = "paper"  # a service that predates step rules ran the paper's
        gamma = doc.get("gamma")
        return cls(
            name=str(doc["name"]),
            dim=int(doc["dim"]),
            algorithm=str(doc["algorithm"]),
            gamma="auto" if gamma == "auto" else _opt_float(gamma),
            gamma_pair=_opt_float(doc.get("gamma_pair")),
            margin=float(doc["margin"]),
            normalize=str(doc["normalize"]),
            seed=int(doc["seed"]),
            version=int(doc["version"]),
            samples_seen=int(doc["samples_seen"]),
            classes=doc["classes"],
            updates={str(k): int(v) for k, v in doc["updates"].items()},
            verification=VerificationState.from_json(doc["verification"]),
            step=None if step is None else str(step),
            health=doc.get("health"),
            race=doc.get("race"),
            raw=doc,
            eta=_opt_float(doc.get("eta")),
            mu=_opt_float(doc.get("mu")),
            kappa=_opt_float(doc.get("kappa")),
            lam=_opt_float(doc.get("lam")),
            stability=doc.get("stability"),
        )


@dataclass(frozen=True)
class CertifiedRate:
    """One certified quantity: ``errors`` in ``m`` disjoint held-out tuples, the
    ``empirical`` rate, and the ``bound`` the true rate stays below (with the certificate's
    confidence; ``delta`` is this bound's share)."""

    m: int
    errors: float
    empirical: float
    bound: float
    delta: float

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CertifiedRate:
        return cls(
            int(doc["m"]),
            float(doc["errors"]),
            float(doc["empirical"]),
            float(doc["bound"]),
            float(doc["delta"]),
        )


@dataclass(frozen=True)
class Certificate:
    """Answer of ``GET .../certificate``: bounds on the triplet error, false accept and false
    reject rates that hold together with probability ``>= 1 - delta``; ``certifies`` is
    ``"served"`` (the metric and threshold queries use) or ``"gibbs"`` (PAC-Bayes: the
    randomised metric); ``statement`` says what is certified and under which assumption.

    >>> rate = {"m": 100, "errors": 0, "empirical": 0.0, "bound": 0.0295, "delta": 0.0167}
    >>> c = Certificate.from_json({"version": 9, "method": "binomial", "certifies": "served",
    ...     "delta": 0.05, "threshold": 2.0, "threshold_source": "calibrated", "samples": 700,
    ...     "classes": 3, "window": 5000, "statement": "...", "triplet_error": rate,
    ...     "false_accept": rate, "false_reject": rate})
    >>> c.false_accept.bound, c.version
    (0.0295, 9)
    """

    version: int | None
    method: str
    certifies: str
    delta: float
    threshold: float
    threshold_source: str
    samples: int
    classes: int
    window: int
    triplet_error: CertifiedRate
    false_accept: CertifiedRate
    false_reject: CertifiedRate
    statement: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Certificate:
        version = doc.get("version")
        return cls(
            version=None if version is None else int(version),
            method=str(doc["method"]),
            certifies=str(doc["certifies"]),
            delta=float(doc["delta"]),
            threshold=float(doc["threshold"]),
            threshold_source=str(doc["threshold_source"]),
            samples=int(doc["samples"]),
            classes=int(doc["classes"]),
            window=int(doc["window"]),
            triplet_error=CertifiedRate.from_json(doc["triplet_error"]),
            false_accept=CertifiedRate.from_json(doc["false_accept"]),
            false_reject=CertifiedRate.from_json(doc["false_reject"]),
            statement=str(doc["statement"]),
            raw=doc,
        )


@dataclass(frozen=True)
class StepOutcome:
    """What one sample did (``?wait=true``); distances squared, before the sample's update."""

    seq: int
    outcome: str
    hinge: float | None
    d_pos: float | None
    d_neg: float | None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StepOutcome:
        return cls(
            int(doc["seq"]),
            str(doc["outcome"]),
            _opt_float(doc.get("hinge")),
            _opt_float(doc.get("d_pos")),
            _opt_float(doc.get("d_neg")),
        )


@dataclass(frozen=True)
class Ingested:
    """Answer of ``POST .../samples``: seqs ``first_seq..last_seq`` are durably logged.

    ``version`` and ``results`` are set only when the request waited for the samples to apply.
    """

    accepted: int
    first_seq: int
    last_seq: int
    version: int | None = None
    results: list[StepOutcome] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Ingested:
        results = doc.get("results")
        return cls(
            int(doc["accepted"]),
            int(doc["first_seq"]),
            int(doc["last_seq"]),
            None if doc.get("version") is None else int(doc["version"]),
            None if results is None else [StepOutcome.from_json(r) for r in results],
            doc,
        )


@dataclass(frozen=True)
class Distance:
    """``squared_distance = ||L(a - b)||^2`` (Eq. 2); ``distance`` its square root (Eq. 1).
    ``restricted_distance`` (``D_R`` in [0, 1), the BRM paper, Eq. 7) and its square: from a ``brm``
    model always, from the others when asked (``restricted=True``); else None."""

    distance: float
    squared_distance: float
    version: int
    restricted_distance: float | None = None
    restricted_squared_distance: float | None = None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Distance:
        return cls(
            float(doc["distance"]),
            float(doc["squared_distance"]),
            int(doc["version"]),
            _opt_float(doc.get("restricted_distance")),
            _opt_float(doc.get("restricted_squared_distance")),
        )


@dataclass(frozen=True, eq=False)
class Distances:
    """One-to-many distances, one entry per row of ``b`` (the restricted ones as in
    :class:`Distance`; None from ``.npy`` answers, which carry the squared distances only)."""

    distances: Array
    squared_distances: Array
    version: int
    restricted_distances: Array | None = None
    restricted_squared_distances: Array | None = None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Distances:
        def optional(key: str) -> Array | None:
            value = doc.get(key)
            return None if value is None else np.asarray(value, dtype=np.float64)

        return cls(
            np.asarray(doc["distances"], dtype=np.float64),
            np.asarray(doc["squared_distances"], dtype=np.float64),
            int(doc["version"]),
            optional("restricted_distances"),
            optional("restricted_squared_distances"),
        )


@dataclass(frozen=True)
class Verdict:
    """``same = squared_distance <= threshold``; ``calibrated`` tells whether the model's own
    threshold was calibrated; ``threshold_source`` says which threshold decided: ``caller``,
    ``calibrated``, ``fallback:window`` or ``fallback:margin`` (None from a service that does
    not say).

    >>> v = Verdict.from_json({"same": True, "squared_distance": 0.2, "threshold": 0.5,
    ...     "calibrated": True, "version": 9, "threshold_source": "caller"})
    >>> v.same, v.threshold_source
    (True, 'caller')
    """

    same: bool
    squared_distance: float
    threshold: float
    calibrated: bool
    version: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    threshold_source: str | None = None

    @property
    def operating_point(self) -> dict[str, Any] | None:
        """With a ``far`` / ``frr`` target: ``{target, threshold, far_estimate, far_bound,
        frr_estimate, frr_bound, negatives, positives, delta, version, ...}``."""
        point: dict[str, Any] | None = self.raw.get("operating_point")
        return point

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Verdict:
        source = doc.get("threshold_source")
        return cls(
            bool(doc["same"]),
            float(doc["squared_distance"]),
            float(doc["threshold"]),
            bool(doc["calibrated"]),
            int(doc["version"]),
            doc,
            None if source is None else str(source),
        )


@dataclass(frozen=True, eq=False)
class Transformed:
    """``z = x L^T`` for every row of ``x``."""

    z: Array
    version: int

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Transformed:
        return cls(np.asarray(doc["z"], dtype=np.float64), int(doc["version"]))


@dataclass(frozen=True, eq=False)
class MetricSnapshot:
    """``L`` and the ``version`` (seq of the last applied sample) it belongs to."""

    L: Array
    version: int

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MetricSnapshot:
        return cls(np.asarray(doc["L"], dtype=np.float64), int(doc["version"]))


@dataclass(frozen=True)
class Event:
    """A frame of ``WS .../events``: the model's state after a change.

    ``dropped`` counts frames the service dropped because this reader was slow (0 if it
    does not say).
    """

    version: int
    samples_seen: int
    classes: Any
    updates: dict[str, int]
    verification: VerificationState
    dropped: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Event:
        return cls(
            int(doc["version"]),
            int(doc["samples_seen"]),
            doc.get("classes"),
            {str(k): int(v) for k, v in doc.get("updates", {}).items()},
            VerificationState.from_json(doc.get("verification") or {}),
            int(doc.get("dropped", 0)),
            doc,
        )


@dataclass(frozen=True)
class Ack:
    """The service logged frame ``id`` as seqs ``first_seq..last_seq``.

    ``replayed`` is true when the frame id had been acknowledged before (a resend).
    """

    id: int | str
    first_seq: int
    last_seq: int
    replayed: bool = False


@dataclass
class Progress:
    """Counters of one ingestion stream, updated on every ack (``on_progress`` gets it)."""

    sent_samples: int = 0
    acked_samples: int = 0
    acked_frames: int = 0
    pending_frames: int = 0
    replayed_frames: int = 0
    replayed_samples: int = 0
    reconnects: int = 0
    last_ack: Ack | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def samples_per_s(self) -> float:
        """Acknowledged samples per second since the stream opened."""
        elapsed = self.elapsed_s
        return self.acked_samples / elapsed if elapsed > 0 else 0.0


# -- gallery and identification ----------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """One gallery item of an identify answer (``y`` None: the item has no label)."""

    id: ItemId
    y: Label | None
    squared_distance: float
    same: bool

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Match:
        return cls(doc["id"], doc.get("y"), float(doc["squared_distance"]), bool(doc["same"]))


@dataclass(frozen=True)
class Identified:
    """``identify`` of one vector: matches in ascending distance (ties by id), the ``version``
    of ``L`` they are exact for, and the threshold ``same`` was decided with."""

    matches: list[Match]
    version: int
    threshold: float
    threshold_source: str
    calibrated: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Identified:
        return cls([Match.from_json(m) for m in doc["matches"]], *_decided(doc), doc)

    @property
    def unknown(self) -> bool:
        """No match passes the threshold: nobody the gallery knows."""
        return not any(m.same for m in self.matches)

    @property
    def operating_point(self) -> dict[str, Any] | None:
        """The certified operating point that decided (a ``far`` / ``frr`` target)."""
        point: dict[str, Any] | None = self.raw.get("operating_point")
        return point


@dataclass(frozen=True)
class IdentifiedMany:
    """``identify`` of several vectors: one list of matches per vector, in order. From the
    binary answer the ids and labels are their string forms (``.npz`` holds no mixed types)."""

    results: list[list[Match]]
    version: int
    threshold: float
    threshold_source: str
    calibrated: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> IdentifiedMany:
        results = [[Match.from_json(m) for m in r["matches"]] for r in doc["results"]]
        return cls(results, *_decided(doc), doc)

    @property
    def unknown(self) -> list[bool]:
        """Per vector: no match passes the threshold (nobody the gallery knows)."""
        return [not any(m.same for m in matches) for matches in self.results]

    @property
    def operating_point(self) -> dict[str, Any] | None:
        """The certified operating point that decided (a ``far`` / ``frr`` target)."""
        point: dict[str, Any] | None = self.raw.get("operating_point")
        return point


def _decided(doc: dict[str, Any]) -> tuple[int, float, str, bool]:
    source = str(doc["threshold_source"])
    return int(doc["version"]), float(doc["threshold"]), source, bool(doc["calibrated"])


@dataclass(frozen=True)
class Enrolled:
    """An enrol's answer: items sent, how many replaced an enrolled id, the gallery's size."""

    enrolled: int
    replaced: int
    size: int
    replayed: bool = False


@dataclass(frozen=True)
class GalleryPage:
    """One page of a gallery's ids (in the order of their string form) and its item count;
    ``next_cursor`` (None after the last page) fetches the next."""

    count: int
    ids: list[ItemId]
    next_cursor: str | None
