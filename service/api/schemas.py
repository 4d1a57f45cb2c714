"""Request and response bodies of the HTTP/WS contract (pydantic; they make the OpenAPI schema).

Shapes are checked here; values that depend on the model (vector length ``dim``, finiteness)
are checked in one place, :mod:`service.api.parsing`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
MAX_LABEL_CHARS = 128

ModelName = Annotated[str, Field(pattern=NAME_PATTERN, examples=["faces"])]
#: A label: a string of 1-128 characters or an integer (an integer means its decimal string).
Label = Annotated[
    StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=MAX_LABEL_CHARS)],
    Field(examples=["alice", 3]),
]
#: Numbers only: strict, so ``"2"`` and ``true`` are refused rather than coerced (ints are fine).
Vector = Annotated[list[StrictFloat], Field(min_length=1, examples=[[0.1, 0.2, 0.3]])]
Matrix = Annotated[list[Vector], Field(min_length=1)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCreate(_Body):
    """``POST /v1/models``; omitted hyperparameters take the core's defaults."""

    name: ModelName
    dim: StrictInt = Field(ge=1, description="Vector length d (at most OPML_MAX_DIM).")
    algorithm: Literal["copml", "opml"] = "copml"
    step: Literal["scaled", "paper"] = Field(
        default="scaled",
        description='Step rule: "scaled" reads gamma, gamma_pair and margin in units of the '
        "stream's running mean squared difference (scale-free); \"paper\" in the input's own "
        "units, the paper's literal rule.",
    )
    # None: the core's default for its step rule (service.core.steps). The upper bounds
    # depend on the step rule: the core checks them (a 422 naming the field).
    gamma: PositiveFloat | Literal["auto"] | None = Field(
        default=None,
        description='Triplet step size, or "auto" (step "scaled" only): the service races '
        "0.025, 0.05, 0.1 and 0.2 on the stream's first auto_warmup triplets and keeps the "
        "best. Range: (0, 1] scaled, (0, 1e6] paper; default 0.05 scaled, 1e-3 paper.",
    )
    gamma_pair: PositiveFloat | None = Field(
        default=None,
        description="COPML pair step. Range: (0, 1] scaled, (0, 1e6] paper; default 0.1 "
        "scaled, 1e-2 paper.",
    )
    margin: PositiveFloat = Field(
        default=1.0,
        description="Hinge margin (Eq. 4), in the step rule's units. Range: (0, 100] scaled, "
        "(0, 1e12] paper.",
    )
    auto_warmup: int = Field(
        default=1000,
        ge=10,
        le=100_000,
        description='gamma "auto": triplets raced before the winner is kept (k = 4 learners '
        "during the first half, 2 during the second).",
    )
    normalize: Literal["none", "l2"] = "none"
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    calibration_window: int = Field(
        default=1000, ge=1, le=100_000, description="Pairs kept for EER."
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


class Verification(BaseModel):
    """The online-calibrated verification threshold (squared-distance units)."""

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
    winner: float | None = Field(description="The step size kept (null while racing).")
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
    step: Literal["scaled", "paper"]
    gamma: float | Literal["auto"]
    gamma_pair: float
    margin: float
    normalize: str
    seed: int
    calibration_window: int
    auto_warmup: int
    version: int = Field(description="Seq of the last applied sample (0 before any).")
    samples_seen: int
    logged_seq: int = Field(description="Last seq in the log; logged_seq - version = lag.")
    classes: int = Field(description="Number of classes seen (rows of the buffer H).")
    updates: Updates
    verification: Verification
    metric_puts: int = Field(description="PUT metric replacements applied.")
    health: Health
    race: Race | None = Field(description='gamma "auto": the race (null otherwise).')
    effective: Effective
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


class Sample(_Body):
    x: Vector
    y: Label


class IngestBody(_Body):
    """Either one sample ``{x, y}`` or a batch ``{samples: [...]}`` (applied in list order)."""

    x: Vector | None = None
    y: Label | None = None
    samples: list[Sample] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> IngestBody:
        single = self.x is not None or self.y is not None
        if single == (self.samples is not None):
            raise ValueError("send either {x, y} or {samples: [...]}")
        if single and (self.x is None or self.y is None):
            raise ValueError("a single sample needs both x and y")
        return self

    def as_samples(self) -> list[Sample]:
        if self.samples is not None:
            return self.samples
        assert self.x is not None and self.y is not None
        return [Sample(x=self.x, y=self.y)]


FrameId = StrictInt | Annotated[StrictStr, Field(min_length=1, max_length=256)]


class StreamFrame(IngestBody):
    """A client frame of ``WS /v1/models/{name}/stream``."""

    id: FrameId


class BinaryHeader(_Body):
    """The JSON header of a binary ``/stream`` frame; the float64 block after it holds one
    row of ``dim`` values per label."""

    id: FrameId
    y: list[Label] = Field(min_length=1)


class Accepted(BaseModel):
    accepted: int
    first_seq: int
    last_seq: int


class StepOut(BaseModel):
    seq: int
    outcome: str
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
    version: int


class DistancesOut(BaseModel):
    distances: list[float]
    squared_distances: list[float]
    version: int


class VerifyBody(_Body):
    a: Vector
    b: Vector
    threshold: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class VerifyOut(BaseModel):
    same: bool
    squared_distance: float
    threshold: float
    calibrated: bool
    threshold_source: str = Field(
        description='"caller", "calibrated", "fallback:window" or "fallback:margin".'
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


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None
