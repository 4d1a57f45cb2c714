"""The online learner: one-pass triplets (Sec. III-A) feeding one of five updates.

:class:`Learner` is the object the service runs and checkpoints; the scikit-learn style
estimators in :mod:`service.core.estimators` wrap it. It is not thread-safe: one writer at a
time (the service owns all concurrency).

Algorithms (``LearnerConfig.algorithm``), all on the same buffer, triplets and generator:

* ``opml`` / ``copml``: the paper's closed-form step (Eq. 16), COPML with the cold-start pair
  step (Eq. 20): :mod:`service.core.update`; step sizes read in units of the stream's scale
  (``step="scaled"``) or the input's (``step="paper"``), :mod:`service.core.steps`;
  ``gamma="auto"`` races step sizes (:mod:`service.core.race`); a divergence monitor cuts a
  runaway step (:mod:`service.core.health`); one copy of ``L`` per race candidate
  (:class:`~service.core.tracks.Tracks`, which holds every algorithm's ``L``, entry bound and
  calibrator);
* ``sgd``: online SGD on the (smoothed) triplet margin loss for the same ``L``, OPML's explicit
  twin, O(d^2): :mod:`service.core.sgd`;
* ``sgd_psd``: projected SGD on ``M = L^T L``, the convex setting of seed 000, O(d^3) per
  active step: :mod:`service.core.psd`;
* ``brm``: online BRM-R, learning ``L`` under the boundary-restricted distance (seed 003),
  O(d^2): :mod:`service.core.brm`. Its verification calibrator works on ``D_R^2``.

``step`` is one field whose values depend on the algorithm: ``"scaled"`` (default) or
``"paper"`` for ``opml`` / ``copml``, ``"constant"``, ``"descent"`` (default) or ``"invsqrt"`` for
the gradient learners (:data:`STEP_VALUES`). The divergence monitor, ``gamma="auto"`` and
``auto_warmup`` belong to ``opml`` / ``copml``: the gradient learners have their own step
machinery (the ``descent`` cap, the lazy decay), and :attr:`Learner.health`,
:attr:`Learner.race` and :attr:`Learner.effective` are ``None`` for them.

Every learner also reports step-mass diagnostics (:meth:`Learner.stability`,
:mod:`service.core.stability`) and the restricted distance of its metric
(:meth:`Learner.restricted_squared_distances`).

Why one module of this length: :class:`LearnerConfig` (every algorithm's hyperparameters and
their cross-field ranges) and :class:`Learner` (the one object the service checkpoints: dispatch
by algorithm, holdout routing, the step rules' tracks, state format and queries) are the core's
public surface; the algorithms' kernels live in their own modules.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

import numpy as np
from numba import njit
from scipy.linalg.blas import dtrmm
from threadpoolctl import ThreadpoolController

from service.core import steps
from service.core._validation import (
    Array,
    check_int,
    check_matrix,
    check_metric,
    check_nonnegative,
    check_positive,
    check_vector,
    label_key,
    label_keys,
)
from service.core.brm import canonical_factor, restricted_root, restricted_squared_norms
from service.core.calibration import ThresholdCalibrator
from service.core.certificates import Certificate, Method
from service.core.gradient import CONSTANT, KINDS, STEP_RULES, learn_batch_gradient
from service.core.holdout import HELD_OUT, Flags, Holdout, check_flags, check_holdout_config
from service.core.race import DEFAULT_GAMMA, Race
from service.core.rehearsal import DEFAULT_MEMORY, Reservoir
from service.core.stability import Stability, StabilityTracker
from service.core.tracks import Tracks
from service.core.update import (
    BOUND,
    PASSIVE,
    SGD_UPDATE,
    SHRUNK_UPDATE,
    STEP_SCALE,
    TRIPLET_UPDATE,
    StepResult,
    StepResults,
    nan_filled,
)
from service.core.update import OUTCOMES as OUTCOMES

Algorithm = Literal["opml", "copml", "sgd", "sgd_psd", "brm"]
StepRule = Literal["constant", "descent", "invsqrt"]
#: ``step`` of any algorithm: the OPML/COPML unit rules or the gradient learners' schedules.
Step = steps.Step | StepRule
Normalize = Literal["none", "l2"]

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
#:            ``M = I``); ``brm`` 0.3, the best of a grid on seed 003's Table 3 protocol
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
}
GRADIENT_ALGORITHMS = ("sgd", "sgd_psd", "brm")
#: The ``step`` values each algorithm accepts (the first OPML/COPML, the second the others').
STEP_VALUES: dict[str, tuple[str, ...]] = {
    name: steps.STEPS if name in ("opml", "copml") else STEP_RULES for name in ALGORITHM_DEFAULTS
}
#: ``gamma_pair`` of the gradient learners (``sgd``'s pair step; unused by the other two).
GRADIENT_GAMMA_PAIR = 1e-2

#: The default of a field whose default depends on the algorithm (``margin``): replaced by
#: its :data:`ALGORITHM_DEFAULTS` value when the config is made.
BY_ALGORITHM: Any = None

#: Outcomes of steps that measured both distances of a triplet (they feed the calibrator).
_MEASURED = np.zeros(len(OUTCOMES), dtype=bool)
_MEASURED[[TRIPLET_UPDATE, SHRUNK_UPDATE, PASSIVE, SGD_UPDATE]] = True

#: 2: step rules, scale estimate, divergence monitor, race, tracks (format 1: before them;
#: still read, OPML/COPML then resume with ``step="paper"``, the rule they ran).
STATE_FORMAT = 2


def _quiet() -> np.errstate:
    """Enormous query inputs may overflow to inf, an honest answer: no numpy warning."""
    return np.errstate(over="ignore", invalid="ignore")


#: From this dimension on, pinning BLAS to one thread (~12 us) pays for itself in learn_one.
_THREADED_DIM = 256

#: One-to-many queries go through the gallery in blocks of this many rows, so that a block of
#: differences and its image stay in the core's L2 cache (one pass over the gallery in memory).
_QUERY_BLOCK = 1024
#: ... on one BLAS thread from this many multiply-adds on (a second thread loses more than it
#: gains on this 2-core machine when the other core is busy; the event loop needs it).
_PINNED_WORK = 1 << 22


@functools.cache
def _blas() -> ThreadpoolController:
    """BLAS thread control, made once (enumerating the loaded libraries costs ~0.5 ms)."""
    return ThreadpoolController()


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
    ``gamma_pair = 1e-2``. ``gamma="auto"`` (scaled only) races a grid of step sizes during the
    first ``auto_warmup`` triplets and keeps the winner (:mod:`service.core.race`). For the
    gradient learners ``step`` is their schedule (``"constant"``, ``"descent"``, ``"invsqrt"``)
    and ``eta``, ``mu``, ``kappa``, ``lam`` their hyperparameters: :data:`ALGORITHM_DEFAULTS`
    (``eta = gamma / 2 = 5e-4`` makes hinge ``sgd`` the first-order twin of OPML under the
    paper's rule, ``eta = 2 gamma`` does it for ``sgd_psd``). A field left at its default takes
    the algorithm's value; one the algorithm does not use stays ``None``.
    ``normalize="l2"`` scales every input (samples and query vectors alike) to unit norm.
    Every value has a documented range; outside it, ``ValueError`` naming the argument.
    ``holdout``, ``holdout_window``, ``pac_bayes_prefix`` and ``pac_bayes_window`` configure
    risk certificates (:mod:`service.core.holdout`). ``rehearsal`` (OPML / COPML; default 0, range
    0 ... 16) makes every learned sample followed by that many steps on samples drawn from a
    reservoir of ``rehearsal_memory`` past ones (default 1,000, range 1 ... 100,000): more than one
    pass over the stream, at ``1 + rehearsal`` times the CPU (:mod:`service.core.rehearsal`).

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
        if self.algorithm in GRADIENT_ALGORITHMS:
            self._resolve(defaults)
        else:
            self._resolve_opml(defaults)
        object.__setattr__(self, "seed", check_int(self.seed, "seed", 0, 2**128 - 1))
        window = check_int(self.calibration_window, "calibration_window", 1, 1_000_000)
        object.__setattr__(self, "calibration_window", window)
        names = ("holdout", "holdout_window", "pac_bayes_prefix", "pac_bayes_window")
        checked = check_holdout_config(*(getattr(self, name) for name in names))
        for name, value in zip(names, checked, strict=True):
            object.__setattr__(self, name, value)

    @property
    def steps_per_sample(self) -> int:
        """Steps the learner takes per learned sample: ``1 + rehearsal`` (1 without rehearsal
        and for the gradient learners), what the writer sizes its batches by.

        >>> LearnerConfig(dim=2).steps_per_sample
        1
        >>> LearnerConfig(dim=2, rehearsal=2).steps_per_sample
        3
        """
        return 1 + (self.rehearsal or 0)

    def _refuse(self, names: tuple[str, ...], where: str) -> None:
        for name in names:
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: not used by {where}")

    def _resolve_opml(self, defaults: dict[str, Any]) -> None:
        """OPML / COPML: the step rule's units, defaults and ranges (:mod:`service.core.steps`)."""
        self._refuse(("eta", "mu", "kappa", "lam"), f"algorithm {self.algorithm!r}")
        margin = defaults["margin"] if self.margin is BY_ALGORITHM else self.margin
        step, gamma, gamma_pair, margin = steps.resolve(
            self.step, self.gamma, self.gamma_pair, margin
        )
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "gamma_pair", gamma_pair)
        object.__setattr__(self, "margin", margin)
        warmup = defaults["auto_warmup"] if self.auto_warmup is None else self.auto_warmup
        object.__setattr__(self, "auto_warmup", check_int(warmup, "auto_warmup", 10, 100_000))
        for name, (low, high) in REHEARSAL_RANGES.items():
            value = defaults[name] if getattr(self, name) is None else getattr(self, name)
            object.__setattr__(self, name, check_int(value, name, low, high))

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


@dataclass
class _Stats:
    samples_seen: int = 0
    #: Steps by outcome code (indexes :data:`OUTCOMES`).
    outcomes: Any = field(default_factory=lambda: np.zeros(len(OUTCOMES), dtype=np.int64))


def normalize_rows(X: Array, how: Normalize) -> Array:
    """Rows of ``X`` scaled to unit L2 norm (``how="l2"``; a zero row stays zero), else ``X``.

    Overflow-safe: each row is divided by its largest magnitude before its norm is taken.
    """
    if how == "none":
        return X
    return _unit_rows(X, np.empty(X.shape))


def _unit_rows(X: Array, out: Array) -> Array:
    """``X``'s rows at unit L2 norm, written into ``out`` (:func:`_unit_rows_into`)."""
    _unit_rows_into(np.ascontiguousarray(X, dtype=np.float64), out)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def _unit_rows_into(X: Array, out: Array) -> None:
    """Row by row, ``y = x / max|x|``, then ``y / ||y||`` into ``out`` (a zero row stays
    zero). One compiled pass that holds no GIL: in the service this runs in the learner's
    thread beside a busy event loop, where each of the six NumPy calls it replaces waited for
    the GIL on its return (a fifth of a batch's time at d = 64)."""
    n, d = X.shape
    for i in range(n):
        scale = 0.0
        for j in range(d):
            scale = max(scale, abs(X[i, j]))
        if scale == 0.0:
            scale = 1.0
        total = 0.0
        for j in range(d):
            v = X[i, j] / scale
            out[i, j] = v
            total += v * v
        norm = math.sqrt(total)
        if norm == 0.0:
            norm = 1.0
        for j in range(d):
            out[i, j] = out[i, j] / norm


@njit(cache=True, error_model="numpy")
def _negatives(uniforms: Array, known: Any, slots: Any) -> Any:
    """Per sample, the slot of its negative class, drawn by its uniform among the ``known``
    classes other than its own (``slots``): ``floor(u (known - 1))``, that slot skipped. The
    arithmetic of ``(u * max(known - 1, 0)).astype(int64)`` then ``+= (negative >= slot)``,
    in one compiled pass that keeps the GIL (see :func:`~service.core._validation.all_finite`:
    those were five NumPy calls)."""
    n = uniforms.shape[0]
    negatives = np.empty(n, dtype=np.int64)
    for t in range(n):
        others = max(known[t] - 1, 0)
        negative = np.int64(uniforms[t] * others)
        if negative >= slots[t]:
            negative += 1
        negatives[t] = negative
    return negatives


def _normalized_minus(X: Array, how: Normalize, A: Array, out: Array) -> Array:
    """``normalize_rows(X, how) - A`` written into ``out``: bit for bit the same operations,
    without a temporary per step (one allocation fewer per block of a one-to-many query)."""
    if how == "none":
        return np.subtract(X, A, out=out)
    return np.subtract(_unit_rows(X, out), A, out=out)


def _tracker(config: LearnerConfig) -> StabilityTracker:
    """The step-mass accounting of ``config``'s algorithm (nominal steps, see its module).

    OPML / COPML: ``gamma`` and ``gamma_pair`` in their step rule's units (the learner sets
    the triplet step to the served track's ``gamma`` before each batch: the race's winner
    after a ``gamma="auto"`` race)."""
    if config.algorithm in GRADIENT_ALGORITHMS:
        assert config.eta is not None and config.step is not None  # set by LearnerConfig
        return StabilityTracker(
            eta_triplet=config.eta,
            eta_pair=0.5 * cast(float, config.gamma_pair),  # sgd's pair step s = 2 eta
            rule=STEP_RULES.index(config.step),
            mu=config.mu,
            lam=config.lam or 0.0,
            convex=config.algorithm == "sgd_psd",
        )
    gamma = DEFAULT_GAMMA if config.gamma == steps.AUTO else cast(float, config.gamma)
    return StabilityTracker(gamma, cast(float, config.gamma_pair), CONSTANT, mu=None, lam=0.0)


class Learner:
    """Online metric learning one sample at a time, with the queries of the live metric.

    >>> learner = Learner(LearnerConfig(dim=4, margin=4.0, seed=1))
    >>> learner.learn_one([0.0, 0.0, 0.0, 1.0], "a").outcome
    'new_class'
    >>> learner.learn_one([0.0, 0.0, 0.1, 1.0], "a").outcome   # COPML cold start
    'pair_update'
    >>> learner.learn_one([1.0, 0.0, 0.0, 0.0], "b").outcome
    'new_class'
    >>> r = learner.learn_one([0.0, 0.1, 0.0, 1.0], "a")
    >>> r.outcome, r.d_pos < r.d_neg
    ('triplet_update', True)
    >>> learner.version, learner.classes
    (4, ['a', 'b'])
    >>> round(learner.squared_distance([0, 0, 0, 1], [0, 0, 0, 1]), 6)
    0.0
    >>> learner.health["state"], learner.race is None
    ('ok', True)
    >>> Learner(LearnerConfig(dim=4, algorithm="sgd")).health is None
    True

    The learner's own view of its run (JSON-safe dicts, for the model document, ``/events`` and
    metrics): :attr:`health` (divergence monitor, :mod:`service.core.health`), :attr:`race`
    (``gamma="auto"``, :mod:`service.core.race`) and :attr:`effective` (the step sizes and
    margin in input units, as the next step will use them); all three ``None`` for the
    gradient learners, which have their own step machinery (:mod:`service.core.gradient`).
    """

    def __init__(self, config: LearnerConfig) -> None:
        self.config = config
        d = config.dim
        # The gradient learners keep their lazy decay outside L: the served L is
        # scale * tracks.L for them (1 for OPML/COPML and without decay).
        self._scale = 1.0
        self._served: Array | None = None  # scale * tracks.L when scale != 1 (see _metric)
        self._R: Array | None = None  # triangular factor of L for one-to-many (see _factor)
        self._canonical: Array | None = None  # L of the restricted distance (see brm)
        self._buffer: Array = np.empty((4, d))
        self._classes: list[str] = []
        self._index: dict[str, int] = {}
        self._rng = np.random.default_rng(config.seed)
        self._stats = _Stats()
        self._stability = _tracker(config)
        # Running scale [S, n] of step="scaled" (service.core.update), kept in every OPML mode.
        self._stream: Array = np.zeros(2)
        self._gradient = config.algorithm in GRADIENT_ALGORITHMS
        auto = config.gamma == steps.AUTO
        if self._gradient:
            # One track: L, its entry bound (state[0, BOUND]) and its calibrator; the track's
            # step size is informative only (the gradient kernels read the config).
            gamma = cast(float, config.eta)
        else:
            gamma = DEFAULT_GAMMA if auto else cast(float, config.gamma)
        self._tracks = Tracks(np.eye(d), [gamma], config.calibration_window)
        # The race copies L at the first learned sample (a PUT before it is raced from).
        self._race = Race(cast(int, config.auto_warmup)) if auto else None
        #: Rehearsal's reservoir (``rehearsal > 0``; :mod:`service.core.rehearsal`).
        self._reservoir = (
            Reservoir(d, cast(int, config.rehearsal_memory)) if config.rehearsal else None
        )
        #: Held-out routing, the certification reservoir, the PAC-Bayes prior and window.
        self.holdout = Holdout(config, functools.partial(normalize_rows, how=config.normalize))

    # -- read-only views -------------------------------------------------------------------

    @property
    def L(self) -> Array:
        """The transformation matrix (a read-only view; copy it to keep it)."""
        view = self._metric().view()
        view.flags.writeable = False
        return view

    def _metric(self) -> Array:
        """The served ``L``: the served track's, or ``scale`` times it (once per change)."""
        if self._scale == 1.0:
            return self._tracks.L
        if self._served is None:
            self._served = self._scale * self._tracks.L
        return self._served

    def _changed(self) -> None:
        """``L`` changed: drop what was derived from it."""
        self._served = self._R = self._canonical = None

    @property
    def calibrator(self) -> ThresholdCalibrator:
        """The verification threshold calibrator of the served metric."""
        return self._tracks.calibrator

    @property
    def health(self) -> dict[str, Any] | None:
        """OPML / COPML: the divergence monitor of the served metric: ``state`` (``"ok"``,
        ``"diverging"``, ``"stabilised"``), ``shrunk_rate``, ``growth`` / ``growth_rate``
        (log10 of the growth of ``||L||_F`` since the start / over the last window),
        ``frobenius_norm``, ``times_tripped``, ``step_scale`` (the factor the trips left on the
        step sizes) and ``updates``. See :mod:`service.core.health` for the policy. ``None``
        for the gradient learners: their kernels do not track ``||L||_F`` (the ``descent``
        cap bounds their steps instead)."""
        return None if self._gradient else self._tracks.health()

    @property
    def race(self) -> dict[str, Any] | None:
        """``gamma="auto"``: the race's ``state`` (``"racing"`` / ``"done"``), ``grid``,
        ``warmup``, progress, ``serving`` / ``winner`` step size, each rung's scores
        (``rounds``) and the live candidates with their health; None otherwise."""
        if self._race is None:
            return None
        return self._race.report(self._tracks if self._race.started else None)

    @property
    def effective(self) -> dict[str, float | None] | None:
        """OPML / COPML: the served metric's step sizes and margin in input units, as the next
        step would use them (``gamma_t``, ``gamma_pair_t``, ``margin_t`` of
        :mod:`service.core.update`, with the divergence monitor's ``step_scale`` applied), and
        ``scale``, the running mean squared difference ``S`` (None before the first
        difference; the scaled figures are None then too). ``margin`` is what the hinge
        (Eq. 4) and a fallback verification threshold are in squared-distance units. ``None``
        for the gradient learners (their config is in input units already)."""
        if self._gradient:
            return None
        cfg, tracks = self.config, self._tracks
        scale = float(self._stream[0]) if self._stream[1] > 0 else None
        cut = float(tracks.state[tracks.served, STEP_SCALE])
        gamma = float(tracks.gammas[tracks.served]) * cut
        pair = cast(float, cfg.gamma_pair) * cut
        if cfg.step == "paper":
            return {"scale": scale, "gamma": gamma, "gamma_pair": pair, "margin": cfg.margin}
        if not scale:
            return {"scale": scale, "gamma": None, "gamma_pair": None, "margin": None}
        return {
            "scale": scale,
            "gamma": gamma / scale,
            "gamma_pair": pair / scale,
            "margin": cfg.margin * scale,
        }

    @property
    def margin(self) -> float:
        """The hinge margin (Eq. 4) in squared-distance units of the input (for ``brm``: of
        ``D_R^2``): what the ``fallback:margin`` verification threshold is. ``config.margin``
        under ``step="paper"``, for the gradient learners, and under ``step="scaled"`` before
        the stream formed a difference (no scale known yet); else ``effective["margin"]``.

        >>> learner = Learner(LearnerConfig(dim=2, margin=2.0))
        >>> learner.margin
        2.0
        >>> _ = learner.learn_many([[0.0, 0.0], [3.0, 4.0]], ["a", "a"])  # |a|^2 = 25
        >>> learner.margin
        50.0
        """
        effective = self.effective
        margin = None if effective is None else effective["margin"]
        return self.config.margin if margin is None else margin

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def version(self) -> int:
        """Number of samples so far: learned and held out."""
        return self._stats.samples_seen

    @property
    def classes(self) -> list[str]:
        """Class keys in order of first appearance."""
        return list(self._classes)

    @property
    def n_classes(self) -> int:
        return len(self._classes)

    @property
    def counts(self) -> dict[str, int]:
        """Steps by outcome (every outcome of :data:`OUTCOMES`, zeros included)."""
        return dict(zip(OUTCOMES, self._stats.outcomes.tolist(), strict=True))

    def buffer(self, label: int | str) -> Array:
        """A copy of ``h_k``, the latest (normalised) sample of class ``label``: with
        ``rehearsal > 0``, the class's latest anchor, which may be a rehearsed sample."""
        key = label_key(label, "label")
        if key not in self._index:
            raise ValueError(f"label: class {key!r} has not been seen")
        row: Array = self._buffer[self._index[key]].copy()
        return row

    # -- learning --------------------------------------------------------------------------

    def learn_one(self, x: Any, y: int | str, holdout: bool = False) -> StepResult:
        """Learn one labelled sample (or hold it out: ``holdout=True``, or routed so by the
        ``holdout`` fraction); ValueError (and no state change) on bad input."""
        xs = check_vector(x, self.dim, "x")
        key = label_key(y, "y")
        return self._route(xs[None, :], [key], check_flags(holdout, 1))[0]

    def learn_many(self, X: Any, y: Any, holdout: Any = None) -> StepResults:
        """Learn the rows of ``X`` in order; the same final state as a :meth:`learn_one` loop.

        ``holdout``: booleans, True for rows to hold out (besides those routed by the
        ``holdout`` fraction). Everything is validated before the first sample is learned, so
        bad input anywhere in the batch changes nothing. The results are a sequence of
        :class:`StepResult`.
        """
        Xs = check_matrix(X, self.dim, "X")
        labels = list(y) if not isinstance(y, str) else [y]
        if len(labels) != Xs.shape[0]:
            raise ValueError(f"y: expected {Xs.shape[0]} labels, got {len(labels)}")
        keys = label_keys(labels, "y")
        return self._route(Xs, keys, check_flags(holdout, len(keys)))

    def _route(self, X: Array, keys: list[str], flags: Flags | None) -> StepResults:
        """Held-out rows to the reservoir, the others through :meth:`_learn`."""
        results, held = self.holdout.route(X, keys, flags, self._learn, self._metric)
        if held:
            self._stats.samples_seen += held
            self._stats.outcomes[HELD_OUT] += held
        return results

    def _learn(self, X: Array, keys: list[str]) -> StepResults:
        """Learn validated rows: classes first (buffer rows), then the compiled loop."""
        n = len(keys)
        self._changed()  # L changes below
        # C-contiguous and writable: the types the kernel is compiled (and cached) for.
        rows = np.require(normalize_rows(X, self.config.normalize), np.float64, ["C", "W"])
        slots = np.empty(n, dtype=np.int64)
        known = np.empty(n, dtype=np.int64)
        index, classes = self._index, self._classes
        found = list(map(index.get, keys))
        if None in found:  # new classes: each takes the next slot as it first appears
            for t, key in enumerate(keys):
                known[t] = len(classes)
                slot = index.get(key)
                if slot is None:
                    slot = index[key] = len(classes)
                    classes.append(key)
                slots[t] = slot
        else:  # all known (the common case): the same slots, in one pass
            slots[:] = cast(list[int], found)
            known.fill(len(classes))
        self._reserve(len(classes))
        self._stability.reserve(len(classes))
        # Every sample draws one uniform, used when it forms a triplet (Sec. III-A), so the
        # stream of draws does not depend on how samples are batched (with rehearsal, a fixed
        # number more: service.core.rehearsal).
        arrival: Any = None
        reservoir = self._reservoir
        if reservoir is None:
            uniforms = self._rng.random(n)
        else:
            rehearsal = cast(int, self.config.rehearsal)
            draws = self._rng.random((n, reservoir.draws_per_arrival(rehearsal)))
            rows, slots, known, uniforms, arrival = reservoir.expand(
                rows, slots, known, draws, rehearsal
            )
        # ... which picks the negative uniformly among the other seen classes (learn_batch
        # does the same arithmetic for OPML/COPML; the others take these rows).
        negatives = _negatives(uniforms, known, slots)
        fro2 = nan_filled((n,))  # ||A_t||_F^2 of the gradient learners' steps
        race = self._race
        if race is not None and not race.started:
            race.start(self._tracks)
        racing = race is not None and not race.done
        pinned = (
            len(rows) > 1
            or self.dim >= _THREADED_DIM
            or racing
            or self.config.algorithm == "sgd_psd"
        )
        # The step is memory-bound with an inner dimension of 2: one BLAS thread is as fast
        # on an idle machine and several times faster on a busy one. (sgd_psd's
        # eigendecompositions always run on one: the same rounding in learn_one.)
        with _blas().limit(limits=1, user_api="blas") if pinned else contextlib.nullcontext():
            if self._gradient:
                codes, values = self._run_gradient(rows, slots, known, negatives, fro2)
            elif race is None or not racing:
                all_codes, all_values = self._run_tracks(
                    rows, slots, known, uniforms, negatives, fro2, arrival=arrival
                )
                codes, values = all_codes[:, 0], all_values[:, 0]
            else:
                codes, values = self._race_segments(
                    race, rows, slots, known, uniforms, negatives, arrival
                )
        if arrival is not None:  # the arrivals' own results (rehearsed steps are not samples)
            codes, values = codes[arrival], values[arrival]
        self._stats.samples_seen += n
        if n == 1:
            self._stats.outcomes[int(codes[0])] += 1
        else:
            self._stats.outcomes += np.bincount(codes, minlength=len(OUTCOMES))
        return StepResults(codes, values)

    def _trained(self) -> int:
        """Samples learned so far (held-out ones excluded): the gradient learners' step
        counter ``t``, so that holding samples out does not change the step sizes, and
        ``learn_one`` and ``learn_many`` agree however held-out rows are interleaved."""
        return self._stats.samples_seen - int(self._stats.outcomes[HELD_OUT])

    def _run_tracks(
        self,
        rows: Array,
        slots: Any,
        known: Any,
        uniforms: Array,
        negatives: Any,
        fro2: Array,
        t0: int = 0,
        arrival: Any = None,
    ) -> tuple[Any, Array]:
        """OPML / COPML: a batch (or a race segment starting ``t0`` rows into it) through
        every track; the step masses at the served track's step size. Returns every track's
        ``codes`` ``(n, k)`` and ``values`` ``(n, k, 4)``. ``arrival``: with rehearsal, the rows
        that are samples received (only they feed the calibrators)."""
        cfg, tracks = self.config, self._tracks
        self._stability.eta_triplet = float(tracks.gammas[tracks.served])
        all_codes, all_values = tracks.learn(
            self._buffer,
            rows,
            slots,
            known,
            uniforms,
            cfg.algorithm == "copml",
            cfg.step == "scaled",
            cast(float, cfg.gamma_pair),
            float(cfg.margin),
            self._stream,
            arrival,
        )
        served = all_codes[:, tracks.served]
        self._stability.observe(rows, slots, known, negatives, served, fro2, self._trained() + t0)
        return all_codes, all_values

    def _race_segments(
        self,
        race: Race,
        rows: Array,
        slots: Any,
        known: Any,
        uniforms: Array,
        negatives: Any,
        arrival: Any = None,
    ) -> tuple[Any, Array]:
        """Learn a batch during a race: cut where a rung ends (at a fixed triplet count, so
        any batching gives the same state); each segment's results are its served track's.
        With rehearsal only the arrivals' triplets count and are scored (``arrival``)."""
        n = len(rows)
        forms = (slots != known) & (known >= 2)  # the samples that form a triplet
        if arrival is not None:
            forms &= arrival
        codes = np.empty(n, dtype=np.int64)
        values = np.empty((n, 4))
        fro2 = np.full(n, np.nan)
        start = 0
        for end in race.cuts(forms):
            part = slice(start, end)
            served = self._tracks.served
            seg_codes, seg_values = self._run_tracks(
                rows[part],
                slots[part],
                known[part],
                uniforms[part],
                negatives[part],
                fro2[part],
                start,
                None if arrival is None else arrival[part],
            )
            codes[part] = seg_codes[:, served]
            values[part] = seg_values[:, served]
            race.record(self._tracks, forms[part], seg_values)
            start = end
        return codes, values

    def _run_gradient(
        self, rows: Array, slots: Any, known: Any, negatives: Any, fro2: Array
    ) -> tuple[Any, Array]:
        """``sgd``, ``sgd_psd``, ``brm``: one batch through their compiled loop, on the one
        track's ``L`` (the stored factor) and entry bound; the calibrator takes the measured
        steps."""
        cfg = self.config
        assert cfg.step is not None  # set by LearnerConfig
        n = len(rows)
        codes = np.empty(n, dtype=np.int64)
        values = np.empty((n, 4))
        tracks = self._tracks
        state = np.array([self._scale, tracks.state[0, BOUND]])
        learn_batch_gradient(
            KINDS[cfg.algorithm],
            tracks.L,
            self._buffer,
            rows,
            slots,
            known,
            negatives,
            self._trained(),
            cfg.eta,
            cfg.gamma_pair,
            cfg.mu or 0.0,
            cfg.kappa or 0.0,
            cfg.lam,
            STEP_RULES.index(cfg.step),
            cfg.margin,
            state,
            codes,
            values,
            fro2,
        )
        self._scale, tracks.state[0, BOUND] = float(state[0]), float(state[1])
        self._stability.observe(rows, slots, known, negatives, codes, fro2, self._trained())
        if n == 1:  # learn_one: spare it the array bookkeeping below
            code = int(codes[0])
            tracks.counts[0, code] += 1
            if _MEASURED[code]:
                self.calibrator.observe(float(values[0, 1]), float(values[0, 2]))
        else:
            measured = _MEASURED[codes]
            self.calibrator.observe_many(values[measured, 1], values[measured, 2])
            tracks.counts[0] += np.bincount(codes, minlength=len(OUTCOMES))
        return codes, values

    def _reserve(self, rows: int) -> None:
        """Grow the buffer H (doubling) to hold ``rows`` classes."""
        if rows > len(self._buffer):
            grown = np.empty((max(rows, 2 * len(self._buffer)), self.dim))
            grown[: len(self._buffer)] = self._buffer
            self._buffer = grown

    def _remember(self, key: str, x: Array) -> None:
        c = len(self._classes)
        self._reserve(c + 1)
        self._buffer[c] = x
        self._index[key] = c
        self._classes.append(key)

    def set_metric(self, L: Any) -> None:
        """Replace ``L`` (warm start from a matrix learned elsewhere); the rest is kept."""
        self._tracks.set_metric(check_metric(L, self.dim, "L"))
        self._scale = 1.0
        self._changed()

    def certificate(
        self, delta: float = 0.05, method: Method = "binomial", threshold: float | None = None
    ) -> Certificate:
        """Bounds on the triplet error, false accept and false reject rates of the current
        metric at ``threshold`` (default: the served one, whose margin fallback is
        :attr:`margin`), holding together with probability ``>= 1 - delta`` (see
        :mod:`service.core.certificates`)."""
        cal = self.calibrator.calibration()  # (brm: refused by the holdout, as on the wire)
        return self.holdout.certificate(
            self._metric(), cal, delta, method, threshold, self.version, margin=self.margin
        )

    # -- queries on the current metric (Eqs. 1, 2) -----------------------------------------

    def _prepare(self, X: Any, name: str) -> Array:
        return normalize_rows(check_matrix(X, self.dim, name), self.config.normalize)

    def squared_distance(self, a: Any, b: Any) -> float:
        """``||L(a - b)||^2`` (Eq. 2)."""
        d = self.dim
        X = np.empty((2, d))
        X[0] = check_vector(a, d, "a")
        X[1] = check_vector(b, d, "b")
        X = normalize_rows(X, self.config.normalize)  # row by row: as for each one alone
        with _quiet():  # enormous inputs may overflow to inf: an honest answer
            z = self._metric() @ (X[0] - X[1])
            return float(z @ z)

    def distance(self, a: Any, b: Any) -> float:
        """``sqrt((a - b)^T M (a - b))`` with ``M = L^T L`` (Eq. 1)."""
        return math.sqrt(self.squared_distance(a, b))

    def squared_distances(self, a: Any, B: Any) -> Array:
        """``||L(a - b_i)||^2`` for every row ``b_i`` of ``B`` (one to many).

        The gallery is processed in blocks of :data:`_QUERY_BLOCK` rows (normalise, subtract
        ``a``, map, square-sum while the block is in cache). A large gallery (at least 4d rows)
        is mapped by ``R``, the triangular factor of ``L = QR`` (``||L x|| = ||R x||``, ``Q``
        orthogonal): a triangular product (BLAS ``dtrmm``) is half the multiply-adds of
        ``x L^T``. ``R`` is computed once per ``L`` (O(d^3), amortised over those 4d rows and
        kept for the next query). Both ways agree to rounding (~1e-15 relative).
        """
        d = self.dim
        A = self._prepare(np.atleast_2d(check_vector(a, d, "a")), "a")
        Bs = check_matrix(B, d, "b")
        n = len(Bs)
        out: Array = np.empty(n)
        R = self._factor() if n >= 4 * d else None
        block = min(n, _QUERY_BLOCK)
        diff = np.empty((block, d))
        image = np.empty((block, d)) if R is None else diff
        LT = self._metric().T
        pinned = _blas().limit(limits=1, user_api="blas") if n * d * d >= _PINNED_WORK else None
        with _quiet(), pinned or contextlib.nullcontext():
            for start in range(0, n, block):
                rows = Bs[start : start + block]
                k = len(rows)
                D = _normalized_minus(rows, self.config.normalize, A, diff[:k])
                if R is None:
                    Z = np.matmul(D, LT, out=image[:k])
                    out[start : start + k] = np.einsum("ij,ij->i", Z, Z)
                else:  # in place on D^T (Fortran order): Z^T = R D^T
                    ZT = dtrmm(1.0, R, D.T, side=0, lower=0, trans_a=0, diag=0, overwrite_b=1)
                    out[start : start + k] = np.einsum("ij,ij->j", ZT, ZT)
        return out

    def _factor(self) -> Array:
        """``R`` of ``L = QR`` (upper triangular, Fortran order for BLAS), cached until ``L``
        changes. Concurrent readers of an unchanging ``L`` may both compute it: harmless."""
        R = self._R
        if R is None:
            R = self._R = np.asfortranarray(np.linalg.qr(self._metric(), mode="r"))
        return R

    def transform(self, X: Any) -> Array:
        """``X L^T``: rows mapped into the learned space (Euclidean there = Eq. 1 here)."""
        with _quiet():
            out: Array = self._prepare(X, "X") @ self._metric().T
        return out

    # -- the restricted distance (seed 003, service.core.brm) --------------------------------

    def _restricted_factor(self) -> Array:
        """``brm``: its own ``L``; any other metric: the canonical factor of ``M`` (3.2),
        computed once per ``L`` (O(d^3))."""
        if self.config.algorithm == "brm":
            return self._metric()
        if self._canonical is None:
            self._canonical = canonical_factor(self._metric())
        return self._canonical

    def restricted_squared_distances(self, a: Any, B: Any) -> Array:
        """``D_R^2(a, b_i)`` in [0, 1) for every row ``b_i`` of ``B`` (seed 003 Eq. 7, Sigmoid,
        ``p = 2``): ``(1/d) sum_j tanh(|z_j| / 2)^2`` with ``z = L_R (a - b_i)``, ``L_R`` the
        learner's own ``L`` for ``brm`` and the canonical factor of ``M`` otherwise.

        Never NaN: each difference is scaled by its largest entry before it is mapped, so a
        coordinate beyond float64 is ``inf`` and saturates (``R = 1``).
        """
        d = self.dim
        A = self._prepare(np.atleast_2d(check_vector(a, d, "a")), "a")
        return self._restricted(A, self._prepare(check_matrix(B, d, "b"), "b"))

    def restricted_squared_pairs(self, A: Any, B: Any) -> Array:
        """``D_R^2(a_i, b_i)`` for the row pairs of ``A`` and ``B`` (same shape)."""
        As = self._prepare(A, "A")
        Bs = self._prepare(B, "B")
        if As.shape != Bs.shape:
            raise ValueError(f"B: expected shape {As.shape} (as A), got {Bs.shape}")
        return self._restricted(As, Bs)

    def _restricted(self, A: Array, B: Array) -> Array:
        """``D_R^2`` of the rows of ``B`` against ``A`` (one row, or one per row of ``B``), in
        blocks of :data:`_QUERY_BLOCK` rows that stay in cache."""
        LT = self._restricted_factor().T
        out: Array = np.empty(len(B))
        with _quiet():
            for start in range(0, len(B), _QUERY_BLOCK):
                rows = slice(start, start + _QUERY_BLOCK)
                half = 0.5 * B[rows] - 0.5 * (A if len(A) == 1 else A[rows])  # never overflows
                top = np.abs(half).max(axis=1, keepdims=True)
                top[top == 0.0] = 1.0
                Z = np.abs(np.divide(half, top, out=half) @ LT)
                Z *= top  # finite or inf, never inf * 0
                Z *= 2.0
                out[rows] = restricted_squared_norms(Z)
        return out

    def restricted_squared_distance(self, a: Any, b: Any) -> float:
        """``D_R^2(a, b)`` in [0, 1) (see :meth:`restricted_squared_distances`)."""
        row = check_vector(b, self.dim, "b")[None, :]
        return float(self.restricted_squared_distances(a, row)[0])

    def restricted_distance(self, a: Any, b: Any) -> float:
        """``D_R(a, b)`` in [0, 1) (seed 003 Eq. 7; a saturated distance reads as the largest
        double below 1)."""
        return float(restricted_root(self.restricted_squared_distance(a, b)))

    # -- diagnostics -----------------------------------------------------------------------

    def stability(self) -> Stability:
        """Step-mass stability diagnostics (:mod:`service.core.stability`); not a bound."""
        return self._stability.report(self.n_classes)

    # -- state -----------------------------------------------------------------------------

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """Arrays and JSON-safe metadata holding everything needed to resume exactly.

        Arrays: ``L`` (the served track's; for ``sgd`` / ``brm`` the stored factor: the served
        ``L`` is ``meta["scale"]`` times it, their lazy decay, 1 for every other algorithm and
        without decay), ``buffer`` (H, one row per class) and ``calibration`` (its threshold
        window); while a ``gamma="auto"`` race runs, also ``tracks_L`` and
        ``tracks_calibration`` (every candidate's) and ``race_pairs`` (the current rung's
        measurements); with ``rehearsal > 0``, ``rehearsal_rows`` and ``rehearsal_slots`` (the
        reservoir). A store must keep every array it is given.
        """
        rng = self._rng.bit_generator.state
        track_arrays, track_meta = self._tracks.to_state()
        arrays = {"buffer": self._buffer[: len(self._classes)].copy(), **track_arrays}
        meta: dict[str, Any] = {
            "format": STATE_FORMAT,
            "config": asdict(self.config),
            "classes": list(self._classes),
            "rng": {
                "bit_generator": rng["bit_generator"],
                "state": str(rng["state"]["state"]),
                "inc": str(rng["state"]["inc"]),
                "has_uint32": int(rng["has_uint32"]),
                "uinteger": int(rng["uinteger"]),
            },
            "samples_seen": self._stats.samples_seen,
            "outcomes": {k: v for k, v in self.counts.items() if v},
            "scale": self._scale,
            "stability": self._stability.to_state(len(self._classes)),
            "stream": self._stream.tolist(),  # floats survive JSON exactly (repr round-trips)
            "tracks": track_meta,
            "race": None,
        }
        if self._race is not None:
            pairs, meta["race"] = self._race.to_state()
            if not self._race.done:
                arrays["race_pairs"] = pairs
        held_arrays, meta["holdout"] = self.holdout.to_state()
        arrays.update(held_arrays)
        if self._reservoir is not None:
            rehearsal_arrays, meta["rehearsal"] = self._reservoir.to_state()
            arrays.update(rehearsal_arrays)
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, Array], meta: dict[str, Any]) -> Learner:
        """Rebuild a learner from :meth:`to_state` output; ValueError if it is inconsistent.

        Format 1 (before step rules existed) resumes OPML / COPML as ``step="paper"``, the
        rule it ran (the gradient learners keep their own ``step``).
        """
        fmt = meta.get("format")
        if fmt not in (1, STATE_FORMAT):
            raise ValueError(f"state: unsupported format {fmt!r}")
        config = dict(meta["config"])
        if fmt == 1:
            config = legacy_config(config)
        learner = cls(LearnerConfig(**config))
        d = learner.dim
        L = np.array(check_metric(arrays["L"], d, "L"), dtype=np.float64, order="C")
        if fmt == 1:
            learner.set_metric(L)
            learner._tracks.calibrators = [
                ThresholdCalibrator.from_state(arrays["calibration"], meta["calibration"])
            ]
        else:
            learner._tracks = Tracks.from_state(arrays, meta["tracks"], L, d)
            stream = np.array(meta["stream"], dtype=np.float64)
            if stream.shape != (2,) or not np.isfinite(stream).all() or (stream < 0).any():
                raise ValueError("state: stream scale is not two finite numbers >= 0")
            learner._stream = stream
            if (meta["race"] is None) != (learner._race is None):
                raise ValueError("state: race state does not match gamma")
            if meta["race"] is not None:
                pairs = arrays.get("race_pairs", np.empty((0, 0, 2)))
                learner._race = Race.from_state(pairs, meta["race"])
                race = learner._race
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
        learner._scale = check_positive(meta.get("scale", 1.0), "scale")
        learner._stability.restore(meta.get("stability"), len(classes))
        learner.holdout.restore(arrays, meta.get("holdout"), learner._stats.samples_seen)
        return learner


def legacy_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config stored before step rules existed, as :class:`LearnerConfig` reads it now:
    OPML / COPML ran the paper's rule (``step`` absent or ``None``), so they keep it; the
    gradient learners' ``step`` is theirs already.

    >>> legacy_config({"dim": 2, "algorithm": "opml", "gamma": 0.001, "step": None})["step"]
    'paper'
    >>> legacy_config({"dim": 2})["step"]
    'paper'
    >>> legacy_config({"dim": 2, "algorithm": "sgd", "step": "invsqrt"})["step"]
    'invsqrt'
    """
    out = dict(config)
    if out.get("algorithm", "copml") not in GRADIENT_ALGORITHMS and out.get("step") is None:
        out["step"] = "paper"
    return out


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) the learning kernel for the types it gets.

    The first compilation takes seconds; a service calls this before it reports ready, so no
    request waits for it. Later processes load the cached machine code in well under a second.
    """
    normalize_rows(np.eye(2), "l2")
    calibrator = ThresholdCalibrator(window=4)
    calibrator.observe_many(np.ones(2), np.zeros(2))
    calibrator.calibration()
    _negatives(np.zeros(1), np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    algorithm: Algorithm
    for algorithm in ("opml", "copml", *GRADIENT_ALGORITHMS):  # type: ignore[assignment]
        learner = Learner(LearnerConfig(dim=2, algorithm=algorithm))
        learner.learn_many(np.eye(2)[[0, 0, 1, 1]], ["a", "a", "b", "b"])
        learner.learn_one([0.0, 1.0], "b")
