"""Model documents: the create body and the model answer with its parts."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
    StrictInt,
)

from service.api.schemas.base import (
    ModelName,
    OperatingPointTarget,
    PositiveFloat,
    _Body,
)
from service.core.holdout import MAX_WINDOW


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
    precondition: Literal["none", "whiten", "discriminant"] | None = Field(
        default=None,
        description='opml/copml/sgd: "whiten" learns L on W x, W the within-class whitening '
        'kept online, and serves L W; "discriminant" does the same with W the root of LDA\'s '
        "metric, each discriminant direction weighted by how well it separates the classes, "
        "plus 0.03 times the Euclidean one of the features scaled by their within-class spread, "
        "and follows W at each refresh; its gamma starts a step schedule that decays with the "
        'samples learned (default "none"; not combined with rehearsal).',
    )
    refresh: StrictInt | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="lda, and a precondition: learned samples between two refreshes of "
        "the metric (lda) or of W from the within-class statistics (default 1000, "
        '"discriminant" max(250, 2 d); each is O(d^3)). Not used by the others.',
    )
    shrinkage: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="lda, and a precondition: shrinkage of the pooled within-class "
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
    precondition: Literal["none", "whiten", "discriminant"] = Field(
        default="none",
        description='opml/copml/sgd: "whiten" / "discriminant" serve L W (W: the within-class '
        "whitening / the discriminant weighting).",
    )
    refresh: int | None = Field(
        default=None, description="lda and a precondition: samples between refreshes."
    )
    shrinkage: float | None = Field(
        default=None, description="lda and a precondition: covariance shrinkage."
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
