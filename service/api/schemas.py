"""Request and response bodies of the HTTP/WS contract (pydantic; they make the OpenAPI schema).

Shapes are checked here; values that depend on the model (vector length ``dim``, finiteness)
are checked in one place, :mod:`service.api.parsing`.

The wire contract: one declarative class per body and answer (models, samples, queries,
gallery, certificates); the HTTP API reference of the docs (docs/reference/) is generated
from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic_core import CoreSchema

from service.core.holdout import MAX_WINDOW

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
MAX_LABEL_CHARS = 128
MAX_ID_CHARS = 256

LABEL_MESSAGE = f"a label is a string of 1-{MAX_LABEL_CHARS} characters or an integer"


class _OneError:
    """Marks a union whose failure is ONE error at the field, with its own message, instead of
    one per member at ``<field>.int``, ``<field>.constrained-str`` (pydantic's default). The
    union stays pydantic-core's: no Python call per value."""

    def __init__(self, error_type: str, message: str) -> None:
        self.error_type, self.message = error_type, message

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        schema = handler(source)
        if schema["type"] != "union":
            raise TypeError(f"_OneError marks a union, not {schema['type']}")
        custom = {"custom_error_type": self.error_type, "custom_error_message": self.message}
        return cast(CoreSchema, {**schema, **custom})


ModelName = Annotated[str, Field(pattern=NAME_PATTERN, examples=["faces"])]
#: A label: a string of 1-128 characters or an integer (an integer means its decimal string).
#: Anything else (a float, a boolean, a list, ``""``, ``null``) is one error at its place:
#: :data:`LABEL_MESSAGE`.
Label = Annotated[
    StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=MAX_LABEL_CHARS)],
    _OneError("label", LABEL_MESSAGE),
    Field(examples=["alice", 3]),
]
#: Numbers only: strict, so ``"2"`` and ``true`` are refused rather than coerced (ints are fine).
Vector = Annotated[list[StrictFloat], Field(min_length=1, examples=[[0.1, 0.2, 0.3]])]
Matrix = Annotated[list[Vector], Field(min_length=1)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


Rate = Annotated[float, Field(gt=0, lt=0.5, allow_inf_nan=False)]


class OperatingPointTarget(_Body):
    """``{"far": x}`` or ``{"frr": x}``: a target false-accept or false-reject rate."""

    far: Rate | None = None
    frr: Rate | None = None

    @model_validator(mode="after")
    def _one(self) -> OperatingPointTarget:
        if (self.far is None) == (self.frr is None):
            raise ValueError('give exactly one of "far" and "frr"')
        return self


def _one_decision(body: Any) -> None:
    """At most one of ``threshold``, ``far`` and ``frr``."""
    given = [n for n in ("threshold", "far", "frr") if getattr(body, n) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of threshold, far and frr (got {', '.join(given)})")


class ModelCreate(_Body):
    """``POST /v1/models``; omitted hyperparameters take the core's defaults, which depend on
    the algorithm (``service.core.config.ALGORITHM_DEFAULTS``). A hyperparameter the chosen
    algorithm does not use is refused (422 naming it), as are combinations out of range
    (``margin >= 1`` for ``brm``, ``2 eta lam >= 1``, ``kappa`` without ``step="descent"``)."""

    name: ModelName
    dim: StrictInt = Field(ge=1, description="Vector length d (at most OPML_MAX_DIM).")
    algorithm: Literal["copml", "opml", "sgd", "sgd_psd", "brm", "lda"] = "copml"
    step: Literal["scaled", "paper", "constant", "descent", "invsqrt"] | None = Field(
        default=None,
        description="Step rule; its values depend on the algorithm (another one: 422 naming "
        'body.step). opml/copml: "scaled" (default) reads gamma, gamma_pair and margin in '
        'units of the stream\'s running mean squared difference (scale-free); "paper" in the '
        "input's own units, the paper's literal rule. sgd, sgd_psd, brm: \"constant\" (eta), "
        '"descent" (default: min(eta, cap)), "invsqrt" (eta / sqrt(t)).',
    )
    # None: the core's default for the algorithm and its step rule (service.core.steps). The
    # upper bounds depend on the step rule: the core checks them (a 422 naming the field).
    gamma: PositiveFloat | Literal["auto"] | None = Field(
        default=None,
        description='OPML/COPML triplet step size, or "auto" (step "scaled" only): the service '
        "keeps racing three step sizes a factor 2 apart around the served one (initially "
        "0.025, 0.05, 0.1), scored on each block of auto_warmup / 2 triplets, and serves the "
        "leader (3x the CPU of a fixed step). Range: (0, 1] scaled, (0, 1e6] paper; default "
        "0.05 scaled, 1e-3 paper. Not used by the others.",
    )
    gamma_pair: PositiveFloat | None = Field(
        default=None,
        description="Cold-start pair step: COPML's gamma_1 (range (0, 1] scaled, (0, 1e6] "
        "paper; default 0.1 scaled, 1e-2 paper), sgd's explicit twin of it (range (0, 1e6], "
        "default 1e-2).",
    )
    margin: PositiveFloat | None = Field(
        default=None,
        description="Hinge margin (Eq. 4; default 1). opml/copml: in the step rule's units, "
        "range (0, 100] scaled, (0, 1e12] paper; sgd, sgd_psd: (0, 1e12]; brm: its tau in "
        "D_R^2 units, in (0, 1) (default 0.1).",
    )
    auto_warmup: int | None = Field(
        default=None,
        ge=10,
        le=100_000,
        description='opml/copml with gamma "auto": twice the race\'s scoring block in '
        "triplets (default 1000: blocks of 500; a running score forgets with a horizon of "
        "about two blocks). Not used by the others.",
    )
    rehearsal: StrictInt | None = Field(
        default=None,
        ge=0,
        le=16,
        description="opml/copml: after each learned sample, this many more steps on samples "
        "drawn uniformly from a reservoir of past learned ones (default 0: one pass; each "
        "costs one more step per sample). Not used by the others.",
    )
    rehearsal_memory: StrictInt | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="opml/copml: the rehearsal reservoir's size in samples (default 1000; "
        "rehearsal_memory x d float64 in memory and in every checkpoint). Not used by the others.",
    )
    precondition: Literal["none", "whiten"] | None = Field(
        default=None,
        description='opml/copml/sgd: "whiten" learns L on W x, W the within-class whitening '
        'kept online, and serves L W (default "none"; not combined with rehearsal).',
    )
    refresh: StrictInt | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description='lda, and precondition "whiten": learned samples between two refreshes of '
        "the metric (lda) or of W from the within-class statistics (default 1000; each is "
        "O(d^3)). Not used by the others.",
    )
    shrinkage: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description='lda, and precondition "whiten": shrinkage of the pooled within-class '
        "covariance towards a multiple of the identity with its trace, in [0, 1] (default 0: "
        "none); makes it definite when d is close to the number of samples.",
    )
    normalize: Literal["none", "l2"] = "none"
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    calibration_window: int = Field(
        default=1000, ge=1, le=100_000, description="Pairs kept for EER."
    )
    holdout: float = Field(
        default=0.0,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description="Fraction of samples routed (by a seeded draw) to the certification "
        "reservoir: never learned, used by GET .../certificate.",
    )
    holdout_window: int = Field(
        default=5000, ge=1, le=MAX_WINDOW, description="The reservoir keeps the last this many."
    )
    pac_bayes_prefix: int = Field(
        default=1000,
        ge=1,
        le=2**62,
        description="PAC-Bayes: the prior is L after this many training samples.",
    )
    pac_bayes_window: int = Field(
        default=0,
        ge=0,
        le=MAX_WINDOW,
        description="PAC-Bayes: training samples after the prefix kept as the bound set "
        "(0: method=pac-bayes is off).",
    )
    operating_point: Literal["eer"] | OperatingPointTarget = Field(
        default="eer",
        description='How plain verify / identify choose their threshold: "eer" (the '
        'calibrated equal-error threshold), {"far": x} or {"frr": x} with x in (0, 0.5): the '
        "threshold whose certified false-accept (false-reject) rate, an upper bound at "
        "delta = 0.05 on held-out samples, is at most x (needs holdout).",
    )
    eta: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Gradient step eta_0 of sgd (default 5e-4), sgd_psd (2e-3), brm (0.3).",
    )
    mu: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Loss smoothing of sgd (default 0: hinge) and sgd_psd (default 0.1).",
    )
    kappa: float | None = Field(
        default=None,
        gt=0,
        le=0.5,
        allow_inf_nan=False,
        description="Fraction of the descent cap, in (0, 0.5] (default 0.5; step=descent only).",
    )
    lam: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Decay lambda of sgd, sgd_psd, brm (default 0), with 2 eta lam < 1.",
    )


class Updates(BaseModel):
    """Steps by outcome. ``triplet`` counts every OPML update (``shrunk`` is its subset that
    ran with a reduced step size); ``pair`` the COPML cold-start updates."""

    triplet: int
    shrunk: int
    pair: int
    passive: int
    new_class: int
    single_class: int
    skipped: int
    held_out: int = Field(description="Samples routed to the certification reservoir.")
    gradient: int = Field(description="Gradient steps of sgd, sgd_psd and brm.")


class Stability(BaseModel):
    """Step-mass diagnostics (docs/algorithms/gradient.md), **not a generalisation bound**.
    ``gamma_hat`` (Lemma 2's uniform-stability parameter) is a number only for ``sgd_psd`` with ``mu
    > 0`` while every step met the non-expansiveness condition; null otherwise."""

    n_samples: int
    n_steps: int = Field(description="Steps that formed a triplet or pair.")
    n_updates: int = Field(description="Steps that changed L.")
    sum_eta: float
    step_mass_max: float
    step_mass_mean: float | None
    B: float | None = Field(description="Largest ||x|| learned.")
    lipschitz: float | None
    smoothness: float | None
    capped_fraction: float | None
    gamma_hat: float | None


class Verification(BaseModel):
    """The online-calibrated verification threshold (squared-distance units; ``D_R^2`` for a
    ``brm`` model)."""

    threshold: float | None = Field(description="EER threshold of the window (null: no pairs).")
    calibrated: bool = Field(description="True once the window holds enough pairs.")
    eer: float | None = Field(description="Equal error rate of the window at the threshold.")
    accuracy: float | None = Field(description="Prequential triplet accuracy (d_pos < d_neg).")
    pairs: int = Field(description="Pairs in the window.")
    min_pairs: int = Field(description="Pairs needed before calibrated becomes true.")


class CheckpointOut(BaseModel):
    seq: int = Field(description="Last seq included in the latest checkpoint.")
    age_s: float | None = Field(description="Seconds since it was written (null: none yet).")


class Health(BaseModel):
    """The divergence monitor of the served metric (:mod:`service.core.health`): it trips when
    more than 10 % of recent triplet updates needed the shrink guard or ``||L||_F`` grew 10x
    within 100 updates; a trip cuts every later step (``step_scale``) and is counted."""

    state: Literal["ok", "diverging", "stabilised"] = Field(
        description='"ok": never tripped; "diverging": tripped within the last 100 steps; '
        '"stabilised": tripped before, none since.'
    )
    shrunk_rate: float = Field(description="Running share of triplet updates that were shrunk.")
    growth: float | None = Field(
        description="log10(||L||_F / ||L_0||_F) against the metric the model started from."
    )
    growth_rate: float = Field(description="The same over the last complete 100-update window.")
    frobenius_norm: float = Field(description="||L||_F as tracked by the monitor.")
    times_tripped: int
    step_scale: float = Field(description="Factor the trips left on gamma and gamma_pair.")
    updates: int = Field(description="Updates that changed L (triplet and pair).")


class Effective(BaseModel):
    """The served metric's step sizes and margin in input units, as the next step uses them
    (``step_scale`` applied); ``scale`` is the running mean squared difference (null before
    the first difference, and the scaled figures with it)."""

    scale: float | None
    gamma: float | None
    gamma_pair: float | None
    margin: float | None


class RaceScore(BaseModel):
    gamma: float
    score: float | None = Field(description="Prequential verification ROC AUC of the rung.")
    tripped: bool = Field(description="Its divergence monitor tripped (ranked last).")


class RaceRound(BaseModel):
    rung: int
    triplets: int = Field(description="Triplets raced when the rung ended.")
    candidates: list[RaceScore]
    kept: list[float] = Field(description="The step sizes that went on.")


class RaceCandidate(Health):
    gamma: float


class Race(BaseModel):
    """``gamma: "auto"``: the race of step sizes (:mod:`service.core.race`)."""

    state: Literal["racing", "done"]
    grid: list[float]
    warmup: int
    triplets: int = Field(description="Triplets raced so far.")
    rung: int
    rungs: int
    winner: float | None = Field(
        description="The step size kept (null: the race goes on for as long as the model learns)."
    )
    rounds: list[RaceRound]
    serving: float | None = Field(
        default=None, description="The step size of the metric served now (null: not started)."
    )
    candidates: list[RaceCandidate] | None = Field(
        default=None, description="The live candidates and their monitors (null: not started)."
    )


class ModelOut(BaseModel):
    """A model: its hyperparameters and its live state (one consistent snapshot)."""

    name: str
    dim: int
    algorithm: str
    step: Literal["scaled", "paper", "constant", "descent", "invsqrt"] | None = Field(
        default=None,
        description="opml/copml: scaled or paper; sgd, sgd_psd, brm: constant, descent or "
        "invsqrt (null only from a process of a version without step rules).",
    )
    gamma: float | Literal["auto"] | None
    gamma_pair: float | None = Field(description="null for lda (no steps).")
    margin: float
    normalize: str
    seed: int
    calibration_window: int
    auto_warmup: int | None = Field(
        default=None, description='opml/copml: the gamma "auto" warm-up (null for the others).'
    )
    rehearsal: int | None = Field(
        default=None,
        description="opml/copml: rehearsal steps after each learned sample (null for the others "
        "and from a process of a version without rehearsal).",
    )
    rehearsal_memory: int | None = Field(
        default=None, description="opml/copml: the rehearsal reservoir's size (null as rehearsal)."
    )
    precondition: Literal["none", "whiten"] = Field(
        default="none",
        description='opml/copml/sgd: "whiten" serves L W (W: within-class whitening).',
    )
    refresh: int | None = Field(
        default=None, description='lda and precondition "whiten": samples between refreshes.'
    )
    shrinkage: float | None = Field(
        default=None, description='lda and precondition "whiten": covariance shrinkage.'
    )
    holdout: float
    holdout_window: int
    pac_bayes_prefix: int
    pac_bayes_window: int
    operating_point: str | dict[str, float] = Field(
        default="eer", description='"eer", {"far": x} or {"frr": x}: what plain verify uses.'
    )
    eta: float | None = None
    mu: float | None = None
    kappa: float | None = None
    lam: float | None = None
    version: int = Field(description="Seq of the last applied sample (0 before any).")
    samples_seen: int
    logged_seq: int = Field(description="Last seq in the log; logged_seq - version = lag.")
    classes: int = Field(description="Number of classes seen (rows of the buffer H).")
    updates: Updates
    verification: Verification
    stability: Stability | None = Field(
        default=None,
        description="Step-mass diagnostics (docs/algorithms/gradient.md), not a bound; null "
        "only from a process of a version without them.",
    )
    metric_puts: int = Field(description="PUT metric replacements applied.")
    health: Health | None = Field(
        default=None,
        description="opml/copml: the divergence monitor; null for sgd, sgd_psd and brm (their "
        "kernels do not track ||L||_F; the descent cap bounds their steps instead).",
    )
    race: Race | None = Field(default=None, description='gamma "auto": the race (else null).')
    effective: Effective | None = Field(
        default=None,
        description="opml/copml: step sizes and margin in input units; null for the others "
        "(their hyperparameters are in input units already).",
    )
    checkpoint: CheckpointOut
    created_at: float
    owner: bool = Field(
        description="True if this process holds the model's lease (applies the log and writes "
        "checkpoints); false: it answers from a read replica that follows the log."
    )
    fencing_token: int | None = Field(
        description="The lease's fencing token while this process owns the model, else null."
    )
    staleness_s: float | None = Field(
        description="Seconds since this process last read up to the end of the model's log: "
        "its answers include every sample acknowledged before then (null: not yet)."
    )


class ModelList(BaseModel):
    models: list[ModelOut]


HoldoutFlag = Annotated[
    StrictBool,
    Field(description="True: route the sample to the certification reservoir (never learned)."),
]


class SampleFields(Protocol):
    """A sample's fields as validated: a :class:`Sample` of a batch, or the single-sample
    body itself (its ``holdout`` None when absent)."""

    @property
    def x(self) -> list[float]: ...
    @property
    def y(self) -> Any: ...
    @property
    def holdout(self) -> bool | None: ...


class Sample(_Body):
    x: Vector
    y: Label
    holdout: HoldoutFlag = False


class IngestBody(_Body):
    """Either one sample ``{x, y, holdout?}`` or a batch ``{samples: [...]}`` (applied in list
    order).

    ``x`` and ``y`` may be absent (the batch form), not ``null``: a ``null`` is validated like
    any other value and refused at its field (their type has no ``None``; the default is not
    validated)."""

    x: Vector = None  # type: ignore[assignment]
    y: Label = None  # type: ignore[assignment]
    holdout: HoldoutFlag | None = None
    samples: list[Sample] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> IngestBody:
        single = self.x is not None or self.y is not None
        if single == (self.samples is not None):
            raise ValueError("send either {x, y} or {samples: [...]}")
        if single and (self.x is None or self.y is None):
            raise ValueError("a single sample needs both x and y")
        if not single and self.holdout is not None:
            raise ValueError("in a batch, holdout is a field of each sample")
        return self

    def located(self, loc: list[str | int]) -> tuple[Sequence[SampleFields], list[str | int], bool]:
        """The samples of this body found at ``loc`` in the request, where they are and
        whether they are a list (each sample adds its index to ``loc``): the batch under
        ``samples``, or this body itself as the one sample (its fields are validated already,
        as this body's: no :class:`Sample` is made of them)."""
        if self.samples is not None:
            return self.samples, [*loc, "samples"], True
        assert self.x is not None and self.y is not None
        return (self,), loc, False


FrameId = StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=256)]


class StreamFrame(IngestBody):
    """A client frame of ``WS /v1/models/{name}/stream``."""

    id: FrameId


class BinaryHeader(_Body):
    """The JSON header of a binary ``/stream`` frame; the float64 block after it holds one
    row of ``dim`` values per label."""

    id: FrameId
    y: list[Label] = Field(min_length=1)
    holdout: list[StrictBool] | None = Field(
        default=None, description="One flag per label: true routes it to the reservoir."
    )

    @model_validator(mode="after")
    def _one_flag_per_label(self) -> BinaryHeader:
        if self.holdout is not None and len(self.holdout) != len(self.y):
            raise ValueError(f"holdout: expected {len(self.y)} flags (one per label)")
        return self


class Accepted(BaseModel):
    accepted: int
    first_seq: int
    last_seq: int


class StepOut(BaseModel):
    seq: int
    outcome: str = Field(
        description="new_class, pair_update, triplet_update, shrunk_update, passive, "
        "single_class, skipped, or held_out (routed to the certification reservoir: not "
        "learned; hinge and distances null)."
    )
    hinge: float | None
    d_pos: float | None
    d_neg: float | None
    gamma: float | None = Field(default=None, description="Step size used (null: L unchanged).")


class Applied(Accepted):
    """``?wait=true``: the samples are applied; ``results`` is null only for a replay whose
    per-sample results are no longer kept."""

    version: int
    results: list[StepOut] | None


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
    far_bound: float = Field(description="Upper confidence bound on the false-accept rate.")
    frr_estimate: float
    frr_bound: float
    negatives: int = Field(description="Disjoint held-out negative pairs evaluated.")
    positives: int = Field(description="Disjoint held-out positive pairs evaluated.")
    delta: float = Field(description="All bounds of the grid hold together w.p. >= 1 - delta.")
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
