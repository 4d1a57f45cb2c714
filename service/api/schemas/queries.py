"""Query, gallery, identify, ROC and certificate bodies and answers, and problems."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)

from service.api.schemas.base import (
    MAX_ID_CHARS,
    Label,
    Matrix,
    Rate,
    Vector,
    _Body,
    _one_decision,
)


class DistanceBody(_Body):
    a: Vector
    b: Vector | Matrix = Field(description="One vector, or a list of vectors (one to many).")


class DistanceOut(BaseModel):
    distance: float
    squared_distance: float
    restricted_distance: float | None = Field(
        default=None,
        description="D_R in [0, 1) (brm models always; others with ?restricted=true).",
    )
    restricted_squared_distance: float | None = None
    version: int


class DistancesOut(BaseModel):
    distances: list[float]
    squared_distances: list[float]
    restricted_distances: list[float] | None = None
    restricted_squared_distances: list[float] | None = None
    version: int


class VerifyBody(_Body):
    a: Vector
    b: Vector
    threshold: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    far: Rate | None = Field(
        default=None,
        description="Target false-accept rate in (0, 0.5): decide at the threshold whose "
        "certified false-accept rate is at most this (instead of threshold).",
    )
    frr: Rate | None = Field(
        default=None, description="Target false-reject rate in (0, 0.5) (as far)."
    )

    @model_validator(mode="after")
    def _at_most_one(self) -> VerifyBody:
        _one_decision(self)
        return self


class OperatingPointOut(BaseModel):
    """A threshold chosen for a target rate, with its certified rates (held-out samples)."""

    kind: Literal["far", "frr"] = Field(description="Which rate the target is.")
    target: float
    threshold: float = Field(description="same <=> distance <= threshold.")
    far_estimate: float = Field(description="False accepts among the held-out negative pairs.")
    far_bound: float = Field(
        description="Certified upper bound on the false-accept rate (a far target: the target)."
    )
    frr_estimate: float
    frr_bound: float = Field(
        description="Certified upper bound on the false-reject rate (an frr target: the target)."
    )
    negatives: int = Field(description="Disjoint held-out negative pairs evaluated.")
    positives: int = Field(description="Disjoint held-out positive pairs evaluated.")
    delta: float = Field(
        description="Both bounds hold together w.p. >= 1 - delta (delta/2 for the target's "
        "rate by a fixed-sequence test, delta/2 for the other by a union bound over the grid)."
    )
    version: int | None = Field(description="The version whose metric is certified.")
    method: str
    grid: int = Field(description="Candidate thresholds (fixed from the calibration window).")
    distance: str = Field(description='"squared" or "restricted" (brm: D_R^2).')
    window_far: float | None = Field(description="The calibration window's estimate.")
    window_frr: float | None
    statement: str


class VerifyOut(BaseModel):
    same: bool = Field(
        description="squared_distance <= threshold; for brm restricted_squared_distance <= "
        "threshold."
    )
    squared_distance: float
    restricted_squared_distance: float | None = Field(
        default=None, description="D_R^2 in [0, 1): brm models, which decide on it."
    )
    threshold: float
    calibrated: bool
    threshold_source: str = Field(
        description='"caller", "calibrated", "fallback:window", "fallback:margin", or "far" / '
        '"frr" (an operating point).'
    )
    operating_point: OperatingPointOut | None = Field(
        default=None, description='With threshold_source "far" / "frr".'
    )
    version: int


class TransformBody(_Body):
    x: Matrix


class TransformOut(BaseModel):
    z: list[list[float]]
    version: int


class MetricBody(_Body):
    L: Matrix


class MetricOut(BaseModel):
    L: list[list[float]]
    version: int


#: A gallery item's id: a string of 1-256 characters or an integer (its decimal string: ``3``
#: and ``"3"`` are one item).
ItemId = Annotated[
    StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)],
    Field(examples=["alice-0001", 17]),
]


class GalleryItem(_Body):
    id: ItemId
    x: Vector
    y: Label | None = Field(default=None, description="The item's label (class), if any.")


class EnrolBody(_Body):
    """``POST .../gallery``: items to enrol; an id already enrolled is replaced."""

    items: list[GalleryItem] = Field(min_length=1)


class Enrolled(BaseModel):
    enrolled: int = Field(description="Items in the request.")
    replaced: int = Field(description="Of them, how many replaced an item with the same id.")
    size: int = Field(description="Items in the gallery after this enrol.")


class GalleryPage(BaseModel):
    count: int = Field(description="Items in the gallery.")
    ids: list[int | str] = Field(description="This page's ids, in the order of their string form.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null after the last."
    )


class IdentifyBody(_Body):
    """``POST .../identify``: one vector ``x`` or a list ``xs``; its ``k`` nearest items."""

    x: Vector | None = None
    xs: Matrix | None = None
    k: int = Field(default=1, ge=1, description="Matches per vector (at most the gallery size).")
    threshold: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Squared distance for `same`."
    )
    far: Rate | None = Field(default=None, description="Target false-accept rate (as verify).")
    frr: Rate | None = Field(default=None, description="Target false-reject rate (as verify).")

    @model_validator(mode="after")
    def _one_form(self) -> IdentifyBody:
        if (self.x is None) == (self.xs is None):
            raise ValueError("send either {x} or {xs: [...]}")
        _one_decision(self)
        return self


class MatchOut(BaseModel):
    id: int | str
    y: int | str | None
    squared_distance: float
    same: bool = Field(description="squared_distance <= threshold.")


class _Decided(BaseModel):
    version: int = Field(description="Seq of the last sample applied to the L that answered.")
    threshold: float = Field(description="The threshold `same` was decided with.")
    threshold_source: str = Field(
        description='"caller", "calibrated", "fallback:window", "fallback:margin", or "far" / '
        '"frr" (an operating point).'
    )
    calibrated: bool
    operating_point: OperatingPointOut | None = Field(
        default=None, description='With threshold_source "far" / "frr".'
    )


class Identified(_Decided):
    matches: list[MatchOut] = Field(description="Ascending squared distance, ties by id.")
    unknown: bool = Field(
        default=False, description="No match passes the threshold: nobody the gallery knows."
    )


class MatchesOut(BaseModel):
    matches: list[MatchOut]
    unknown: bool = Field(default=False, description="No match passes the threshold.")


class RocPointOut(BaseModel):
    threshold: float
    far_estimate: float
    far_bound: float
    frr_estimate: float
    frr_bound: float
    window_far: float | None = Field(description="The calibration window's (not certified).")
    window_frr: float | None


class RocOut(BaseModel):
    """``GET .../roc``: the served metric's ROC on the held-out reservoir."""

    points: list[RocPointOut] = Field(description="Ascending threshold.")
    negatives: int
    positives: int
    delta: float = Field(description="Every bound of the curve holds together w.p. 1 - delta.")
    version: int | None
    method: str
    distance: str
    statement: str


class IdentifiedMany(_Decided):
    results: list[MatchesOut] = Field(description="One per row of xs, in order.")


class BoundOut(BaseModel):
    """One certified quantity: ``errors`` in ``m`` disjoint tuples, the ``empirical`` rate and
    the ``bound`` the true rate stays below (with the certificate's confidence)."""

    m: int = Field(description="Disjoint tuples (triplets or pairs) evaluated.")
    errors: float = Field(description="Errors among them (PAC-Bayes: expected Gibbs errors).")
    empirical: float = Field(description="errors / m.")
    bound: float = Field(description="High-confidence upper bound on the true rate.")
    delta: float = Field(description="The share of delta this bound spends.")
    sigma: float | None = Field(default=None, description="PAC-Bayes: posterior scale chosen.")
    kl_divergence: float | None = Field(default=None, description="PAC-Bayes: KL(Q || P).")


class CertificateOut(BaseModel):
    """``GET .../certificate``: bounds on the errors of the metric of one snapshot."""

    version: int | None = Field(description="The version whose metric is certified.")
    method: Literal["binomial", "kl", "pac-bayes"]
    certifies: Literal["served", "gibbs"] = Field(
        description='"served": the metric and threshold queries use; "gibbs": the randomised '
        "metric around it (PAC-Bayes), not the served one."
    )
    delta: float = Field(description="The three bounds hold together with prob. >= 1 - delta.")
    validity: str = Field(
        description='"per-request" (a sequence of certificates: docs/guides/certificates.md).'
    )
    threshold: float = Field(description="The verification threshold certified (squared).")
    threshold_source: str
    samples: int = Field(description="Samples the tuples came from (reservoir or bound set).")
    classes: int = Field(description="Classes among them.")
    window: int = Field(description="Capacity of the reservoir (or PAC-Bayes window).")
    triplet_error: BoundOut
    false_accept: BoundOut
    false_reject: BoundOut
    statement: str = Field(description="What is certified, under which assumption.")
    details: dict[str, Any] = Field(default_factory=dict)


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None
