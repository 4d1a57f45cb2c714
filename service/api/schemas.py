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


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCreate(_Body):
    """``POST /v1/models``; omitted hyperparameters take the core's defaults, which depend on
    the algorithm (``service.core.learner.ALGORITHM_DEFAULTS``). A hyperparameter the chosen
    algorithm does not use is refused (422 naming it), as are combinations out of range
    (``margin >= 1`` for ``brm``, ``2 eta lam >= 1``, ``kappa`` without ``step="descent"``)."""

    name: ModelName
    dim: int = Field(ge=1, description="Vector length d (at most OPML_MAX_DIM).")
    algorithm: Literal["copml", "opml", "sgd", "sgd_psd", "brm"] = "copml"
    gamma: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="OPML/COPML triplet step size (default 1e-3); not used by the others.",
    )
    gamma_pair: float = Field(
        default=1e-2,
        gt=0,
        allow_inf_nan=False,
        description="Cold-start pair step: COPML's gamma_1, sgd's explicit twin of it.",
    )
    margin: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Hinge margin (Eq. 4; default 1); brm's tau in D_R^2 units, < 1 (default 0.1).",
    )
    normalize: Literal["none", "l2"] = "none"
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    calibration_window: int = Field(
        default=1000, ge=1, le=100_000, description="Pairs kept for EER."
    )
    step: Literal["constant", "descent", "invsqrt"] | None = Field(
        default=None,
        description="Step rule of sgd, sgd_psd, brm (default descent): eta, min(eta, cap), "
        "eta / sqrt(t).",
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
    gradient: int = Field(description="Gradient steps of sgd, sgd_psd and brm.")


class Stability(BaseModel):
    """Step-mass diagnostics (seed-specs 4.3), **not a generalisation bound**. ``gamma_hat``
    (Lemma 2's uniform-stability parameter) is a number only for ``sgd_psd`` with ``mu > 0``
    while every step met the non-expansiveness condition; null otherwise."""

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


class ModelOut(BaseModel):
    """A model: its hyperparameters and its live state (one consistent snapshot)."""

    name: str
    dim: int
    algorithm: str
    gamma: float | None
    gamma_pair: float
    margin: float
    normalize: str
    seed: int
    calibration_window: int
    step: str | None = None
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
        description="Step-mass diagnostics (seed-specs 4.3), not a bound; null only from a "
        "process of a version without them.",
    )
    metric_puts: int = Field(description="PUT metric replacements applied.")
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
