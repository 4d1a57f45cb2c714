"""A model's hyperparameters: :class:`LearnerConfig`, its defaults by algorithm and its checks.

Every value has a documented range; a config outside it is refused with a ``ValueError`` naming
the field, before any learner exists. ``step`` is one field whose values depend on the algorithm
(:data:`STEP_VALUES`): ``"scaled"`` (default) or ``"paper"`` for ``opml`` / ``copml``
(:mod:`service.core.steps`), ``"constant"``, ``"descent"`` (default) or ``"invsqrt"`` for the
gradient learners (:mod:`service.core.sgd`). The held-out settings are checked by
:mod:`service.core.holdout`, the step rules' by :mod:`service.core.steps`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from service.core import steps
from service.core._validation import check_int, check_nonnegative, check_positive
from service.core.gradient import STEP_RULES
from service.core.holdout import check_holdout_config
from service.core.operating_points import check_operating_point
from service.core.race import CANDIDATES
from service.core.rehearsal import DEFAULT_MEMORY

Algorithm = Literal["opml", "copml", "sgd", "sgd_psd", "brm", "lda"]
StepRule = Literal["constant", "descent", "invsqrt"]
#: ``step`` of any algorithm: the OPML/COPML unit rules or the gradient learners' schedules.
Step = steps.Step | StepRule
Normalize = Literal["none", "l2"]
Precondition = Literal["none", "whiten", "discriminant"]

#: Each algorithm's own hyperparameters and their defaults. A field missing from an
#: algorithm's row is not used by it: it stays ``None`` and setting it is a ValueError
#: (``kappa`` belongs to ``step="descent"`` only). ``gamma_pair`` is used by ``copml`` and
#: ``sgd`` (the cold-start pair step) and kept, unused, by the others. ``opml`` / ``copml``
#: take ``gamma``, ``gamma_pair`` and ``margin`` from their step rule
#: (:data:`service.core.steps.DEFAULTS`: scaled ``0.05 / 0.1 / 1``, paper ``1e-3 / 1e-2 / 1``).
#: Ranges where each update is defined (else ValueError naming the field); those of ``opml`` /
#: ``copml`` (``gamma``, ``gamma_pair``, ``margin``, ``auto_warmup``, per step rule) are
#: :mod:`service.core.steps`'s table:
#:
#: ========== ==================================================================================
#: step       ``opml`` / ``copml``: ``"scaled"`` (default) or ``"paper"``
#:            (:mod:`service.core.steps`); ``sgd``, ``sgd_psd``, ``brm``: ``"constant"``,
#:            ``"descent"`` (default) or ``"invsqrt"`` (:mod:`service.core.sgd`)
#: gamma_pair > 0: ``sgd``'s pair step (default 1e-2)
#: margin     > 0; for ``brm`` (its tau, a gap of ``D_R^2`` in [0, 1)) also < 1
#: eta        > 0: the gradient step eta_0. Defaults: ``sgd`` ``gamma / 2`` and ``sgd_psd``
#:            ``2 gamma`` with the paper rule's ``gamma = 1e-3``, the first-order match of
#:            OPML's step (``L -> L (I - gamma A)``, i.e. ``M -> M - 2 gamma A`` near
#:            ``M = I``); ``brm`` 0.3, the best of a grid on the BRM paper's Table 3 protocol
#:            (``benchmarks/results/learners.md``)
#: mu         >= 0: smoothing of the loss (0 = hinge); ``sgd``, ``sgd_psd``
#: kappa      in (0, 0.5]: the descent cap's fraction (1 would collapse a direction of L)
#: lam        >= 0 with ``2 eta lam < 1`` (and ``gamma_pair lam < 1`` for ``sgd``): the decay
#:            factor ``1 - 2 eta lam`` stays positive
#: ========== ==================================================================================
#: ``rehearsal`` (steps on reservoir samples after each learned sample) and
#: ``rehearsal_memory`` (the reservoir's size): OPML / COPML only (:mod:`service.core.rehearsal`).
REHEARSAL_DEFAULTS: dict[str, int] = {"rehearsal": 0, "rehearsal_memory": DEFAULT_MEMORY}
#: Their ranges: each rehearsal step costs one more step per sample; the reservoir is
#: ``rehearsal_memory x d`` float64 in memory and in every checkpoint.
REHEARSAL_RANGES: dict[str, tuple[int, int]] = {
    "rehearsal": (0, 16),
    "rehearsal_memory": (1, 100_000),
}
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "opml": {"step": "scaled", "margin": 1.0, "auto_warmup": 1000, **REHEARSAL_DEFAULTS},
    "copml": {"step": "scaled", "margin": 1.0, "auto_warmup": 1000, **REHEARSAL_DEFAULTS},
    "sgd": {"step": "descent", "eta": 5e-4, "mu": 0.0, "kappa": 0.5, "lam": 0.0, "margin": 1.0},
    "sgd_psd": {
        "step": "descent",
        "eta": 2e-3,
        "mu": 0.1,
        "kappa": 0.5,
        "lam": 0.0,
        "margin": 1.0,
    },
    "brm": {"step": "descent", "eta": 0.3, "kappa": 0.5, "lam": 0.0, "margin": 0.1},
    "lda": {"margin": 1.0},
}
GRADIENT_ALGORITHMS = ("sgd", "sgd_psd", "brm")
#: The ``step`` values each algorithm accepts (the first OPML/COPML, the second the others').
STEP_VALUES: dict[str, tuple[str, ...]] = {
    name: steps.STEPS if name in ("opml", "copml") else STEP_RULES for name in ALGORITHM_DEFAULTS
}
STEP_VALUES["lda"] = ()
#: The within-class statistics' settings (:mod:`service.core.within`), used by ``lda`` and by
#: ``precondition="whiten"`` / ``"discriminant"`` (``opml``, ``copml``, ``sgd``): refresh every
#: ``refresh`` learned samples (1 ... 1,000,000; each refresh is O(d^3)), shrinkage in [0, 1]
#: (0 = none).
WITHIN_DEFAULTS: dict[str, Any] = {"refresh": 1000, "shrinkage": 0.0}
#: ``refresh``'s default under ``precondition="discriminant"``: ``max(250, 2 d)``. Its served
#: metric follows ``W`` (:mod:`service.core.within`), so a fresher ``W`` serves the statistics
#: of more of the stream; ``2 d`` keeps a refresh's O(d^3), amortised, of the order of the
#: O(d^2) steps for wide inputs (``docs/design/discriminant-metric.md``).
DISCRIMINANT_REFRESH = 250
#: ``gamma``'s default (``step="scaled"``) under ``precondition="discriminant"``, the start of
#: its step schedule (``Learner._schedule``): the steps start from a metric already close to the
#: batch discriminant one, and refine it rather than build it, so they start at a fifth of the
#: plain default (``docs/design/discriminant-metric.md``).
DISCRIMINANT_GAMMA = 0.01
#: The algorithms a ``precondition`` applies to.
WHITENED_ALGORITHMS = ("opml", "copml", "sgd")
#: ``gamma_pair`` of the gradient learners (``sgd``'s pair step; unused by the other two).
GRADIENT_GAMMA_PAIR = 1e-2

#: The default of a field whose default depends on the algorithm (``margin``): replaced by
#: its :data:`ALGORITHM_DEFAULTS` value when the config is made.
BY_ALGORITHM: Any = None

#: Largest model dimension the core accepts (``L`` alone is 8 GiB there).
MAX_DIM = 32768


@dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of one model, validated on construction.

    ``gamma`` is the OPML/COPML triplet step size (the paper's gamma_2 for COPML),
    ``gamma_pair`` the cold-start pair step size (gamma_1; for ``sgd`` the step ``s`` of the
    explicit twin), ``margin`` the hinge margin (Eq. 4). ``step`` is one field whose values
    depend on the algorithm (:data:`STEP_VALUES`). For ``opml`` / ``copml`` it says in which
    units ``gamma``, ``gamma_pair`` and ``margin`` are read (:mod:`service.core.steps`):
    ``"scaled"`` (default) in units of the stream's typical squared difference, so the same
    values work at any input scale and dimension; ``"paper"`` in the input's units, the paper's
    literal rule. ``None`` means the rule's default: scaled ``gamma = 0.05``,
    ``gamma_pair = 0.1``; paper ``gamma = 1e-3`` (the largest step that keeps all ten Table II
    data sets within the paper's bar, ``benchmarks/results/gamma_grid.md``) and
    ``gamma_pair = 1e-2``. ``gamma="auto"`` (scaled only) keeps racing three step sizes around
    the served one, scored on blocks of ``auto_warmup / 2`` triplets
    (:mod:`service.core.race`). For the gradient learners ``step`` is their schedule
    (``"constant"``, ``"descent"``, ``"invsqrt"``) and ``eta``, ``mu``, ``kappa``, ``lam``
    their hyperparameters: :data:`ALGORITHM_DEFAULTS` (``eta = gamma / 2 = 5e-4`` makes
    hinge ``sgd`` the first-order twin of OPML under the paper's rule, ``eta = 2 gamma``
    does it for ``sgd_psd``). A field left at its default takes the algorithm's value; one the
    algorithm does not use stays ``None``.
    ``normalize="l2"`` scales every input (samples and query vectors alike) to unit norm.
    Every value has a documented range; outside it, ``ValueError`` naming the argument.
    ``holdout``, ``holdout_window``, ``pac_bayes_prefix`` and ``pac_bayes_window`` configure
    risk certificates (:mod:`service.core.holdout`). ``rehearsal`` (OPML / COPML; default 0, range
    0 ... 16) makes every learned sample followed by that many steps on samples drawn from a
    reservoir of ``rehearsal_memory`` past ones (default 1,000, range 1 ... 100,000): more than one
    pass over the stream, at ``1 + rehearsal`` times the CPU (:mod:`service.core.rehearsal`).
    ``algorithm="lda"`` serves Fisher's discriminant metric from within-class statistics kept
    online, ``precondition="whiten"`` (``opml``, ``copml``, ``sgd``; not with rehearsal) learns
    on within-class whitened inputs and serves ``L W``, ``precondition="discriminant"`` the
    same on discriminant-weighted inputs (its ``gamma``, default 0.01 :data:`DISCRIMINANT_GAMMA`,
    starts a step schedule that decays with the samples learned); they refresh every ``refresh``
    learned samples (default 1,000, discriminant ``max(250, 2 d)``; 1 ... 1,000,000) with
    ``shrinkage`` in [0, 1] (default 0) (:mod:`service.core.within`).

    >>> LearnerConfig(dim=3).algorithm, LearnerConfig(dim=3).step, LearnerConfig(dim=3).gamma
    ('copml', 'scaled', 0.05)
    >>> LearnerConfig(dim=3, step="paper").gamma
    0.001
    >>> LearnerConfig(dim=3, gamma=1e300)
    Traceback (most recent call last):
    ...
    ValueError: gamma: must be in (0, 1], got 1e+300
    >>> c = LearnerConfig(dim=3, algorithm="brm")
    >>> c.margin, c.step, c.eta, c.gamma, c.auto_warmup
    (0.1, 'descent', 0.3, None, None)
    >>> LearnerConfig(dim=3, algorithm="sgd", gamma=0.1)
    Traceback (most recent call last):
    ...
    ValueError: gamma: not used by algorithm 'sgd'
    >>> LearnerConfig(dim=3, algorithm="sgd", step="paper")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: step: must be one of 'constant', 'descent', 'invsqrt' for algorithm 'sgd', ...
    """

    dim: int
    algorithm: Algorithm = "copml"
    gamma: float | Literal["auto"] | None = None
    gamma_pair: float | None = None
    margin: float = BY_ALGORITHM
    normalize: Normalize = "none"
    seed: int = 0
    calibration_window: int = 1000
    step: Step | None = None
    auto_warmup: int | None = None
    eta: float | None = None
    mu: float | None = None
    kappa: float | None = None
    lam: float | None = None
    holdout: float = 0.0
    holdout_window: int = 5000
    pac_bayes_prefix: int = 1000
    pac_bayes_window: int = 0
    rehearsal: int | None = None
    rehearsal_memory: int | None = None
    #: How plain verify / identify choose their threshold: ``"eer"`` (the calibrated one),
    #: ``{"far": x}`` or ``{"frr": x}`` (certified; :mod:`service.core.operating_points`).
    operating_point: str | dict[str, float] = "eer"
    precondition: Precondition = "none"
    refresh: int | None = None
    shrinkage: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", check_int(self.dim, "dim", 1, MAX_DIM))
        if self.algorithm not in ALGORITHM_DEFAULTS:
            known = ", ".join(repr(name) for name in ALGORITHM_DEFAULTS)
            raise ValueError(f"algorithm: must be one of {known}, got {self.algorithm!r}")
        if self.normalize not in ("none", "l2"):
            raise ValueError(f"normalize: must be 'none' or 'l2', got {self.normalize!r}")
        defaults = ALGORITHM_DEFAULTS[self.algorithm]
        if self.step is not None and self.step not in STEP_VALUES[self.algorithm]:
            allowed = ", ".join(repr(rule) for rule in STEP_VALUES[self.algorithm])
            where = f"for algorithm {self.algorithm!r}"
            raise ValueError(f"step: must be one of {allowed} {where}, got {self.step!r}")
        if self.algorithm == "lda":
            self._resolve_lda(defaults)
        elif self.algorithm in GRADIENT_ALGORITHMS:
            self._resolve(defaults)
        else:
            self._resolve_opml(defaults)
        self._resolve_within()
        object.__setattr__(self, "seed", check_int(self.seed, "seed", 0, 2**128 - 1))
        window = check_int(self.calibration_window, "calibration_window", 1, 1_000_000)
        object.__setattr__(self, "calibration_window", window)
        names = ("holdout", "holdout_window", "pac_bayes_prefix", "pac_bayes_window")
        checked = check_holdout_config(*(getattr(self, name) for name in names))
        for name, value in zip(names, checked, strict=True):
            object.__setattr__(self, name, value)
        point = check_operating_point(self.operating_point)
        object.__setattr__(self, "operating_point", point)

    @property
    def steps_per_sample(self) -> int:
        """Steps the learner takes per learned sample: ``1 + rehearsal`` (1 without rehearsal
        and for the gradient learners), times the race's candidates under ``gamma="auto"``:
        what the writer sizes its batches by.

        >>> LearnerConfig(dim=2).steps_per_sample
        1
        >>> LearnerConfig(dim=2, rehearsal=2).steps_per_sample
        3
        >>> LearnerConfig(dim=2, gamma="auto").steps_per_sample
        3
        """
        return (1 + (self.rehearsal or 0)) * (CANDIDATES if self.gamma == steps.AUTO else 1)

    def _refuse(self, names: tuple[str, ...], where: str) -> None:
        for name in names:
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: not used by {where}")

    def _resolve_opml(self, defaults: dict[str, Any]) -> None:
        """OPML / COPML: the step rule's units, defaults and ranges (:mod:`service.core.steps`)."""
        self._refuse(("eta", "mu", "kappa", "lam"), f"algorithm {self.algorithm!r}")
        margin = defaults["margin"] if self.margin is BY_ALGORITHM else self.margin
        gamma: Any = self.gamma
        if gamma is None and self.precondition == "discriminant" and self.step in (None, "scaled"):
            gamma = DISCRIMINANT_GAMMA
        step, gamma, gamma_pair, margin = steps.resolve(self.step, gamma, self.gamma_pair, margin)
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "gamma_pair", gamma_pair)
        object.__setattr__(self, "margin", margin)
        warmup = defaults["auto_warmup"] if self.auto_warmup is None else self.auto_warmup
        object.__setattr__(self, "auto_warmup", check_int(warmup, "auto_warmup", 10, 100_000))
        for name, (low, high) in REHEARSAL_RANGES.items():
            value = defaults[name] if getattr(self, name) is None else getattr(self, name)
            object.__setattr__(self, name, check_int(value, name, low, high))

    @property
    def within(self) -> bool:
        """Whether the learner keeps within-class statistics (``lda`` or whitening)."""
        return self.algorithm == "lda" or self.precondition != "none"

    def _resolve_within(self) -> None:
        """``precondition``, ``refresh`` and ``shrinkage`` (:mod:`service.core.within`)."""
        if self.precondition not in ("none", "whiten", "discriminant"):
            allowed = "'none', 'whiten' or 'discriminant'"
            raise ValueError(f"precondition: must be {allowed}, got {self.precondition!r}")
        if self.precondition != "none":
            name = repr(self.precondition)
            if self.algorithm not in WHITENED_ALGORITHMS:
                where = f"algorithm {self.algorithm!r}"
                raise ValueError(f"precondition: {name} is for opml, copml and sgd, not {where}")
            if self.rehearsal:
                raise ValueError(f"rehearsal: not used with precondition {name}")
        if not self.within:
            self._refuse(("refresh", "shrinkage"), "precondition 'none'")
            return
        refresh = self.refresh
        if refresh is None:
            refresh = WITHIN_DEFAULTS["refresh"]
            if self.precondition == "discriminant":
                refresh = max(DISCRIMINANT_REFRESH, 2 * self.dim)
        object.__setattr__(self, "refresh", check_int(refresh, "refresh", 1, 1_000_000))
        shrink = WITHIN_DEFAULTS["shrinkage"] if self.shrinkage is None else self.shrinkage
        shrink = check_nonnegative(shrink, "shrinkage")
        if shrink > 1.0:
            raise ValueError(f"shrinkage: must be in [0, 1], got {shrink!r}")
        object.__setattr__(self, "shrinkage", shrink)

    def _resolve_lda(self, defaults: dict[str, Any]) -> None:
        """``lda``: no step machinery; ``margin`` is only the verification fallback."""
        names = ("gamma", "gamma_pair", "step", "auto_warmup", "eta", "mu", "kappa", "lam")
        self._refuse((*names, "rehearsal", "rehearsal_memory"), "algorithm 'lda'")
        margin = defaults["margin"] if self.margin is BY_ALGORITHM else self.margin
        object.__setattr__(self, "margin", check_positive(margin, "margin"))

    def _resolve(self, defaults: dict[str, Any]) -> None:
        """The gradient learners: fill the algorithm's defaults, refuse fields it does not use,
        check the ranges."""
        algorithm = self.algorithm
        self._refuse(("auto_warmup",), f"algorithm {algorithm!r} (no gamma='auto')")
        self._refuse(("rehearsal", "rehearsal_memory"), f"algorithm {algorithm!r}")
        step = defaults["step"] if self.step is None else self.step
        object.__setattr__(self, "step", step)
        pair = GRADIENT_GAMMA_PAIR if self.gamma_pair is None else self.gamma_pair
        object.__setattr__(self, "gamma_pair", check_positive(pair, "gamma_pair"))
        for name in ("gamma", "eta", "mu", "kappa", "lam"):
            value = getattr(self, name)
            if name not in defaults or (name == "kappa" and step != "descent"):
                if value is not None:
                    where = f"step {step!r}" if name == "kappa" else f"algorithm {algorithm!r}"
                    raise ValueError(f"{name}: not used by {where}")
                continue
            value = defaults[name] if value is None else value
            check = check_positive if name in ("eta", "kappa") else check_nonnegative
            object.__setattr__(self, name, check(value, name))
        margin = defaults["margin"] if self.margin is BY_ALGORITHM else self.margin
        margin = check_positive(margin, "margin")
        if algorithm == "brm" and margin >= 1.0:
            raise ValueError(f"margin: must be < 1 for brm (D_R^2 is in [0, 1)), got {margin!r}")
        object.__setattr__(self, "margin", margin)
        if self.kappa is not None and self.kappa > 0.5:
            raise ValueError(f"kappa: must be in (0, 0.5], got {self.kappa!r}")
        if self.lam and self.eta is not None and 2.0 * self.eta * self.lam >= 1.0:
            raise ValueError(f"lam: must satisfy 2 eta lam < 1, got lam = {self.lam!r}")
        if self.lam and algorithm == "sgd" and cast(float, self.gamma_pair) * self.lam >= 1.0:
            raise ValueError(f"lam: must satisfy gamma_pair lam < 1, got lam = {self.lam!r}")
