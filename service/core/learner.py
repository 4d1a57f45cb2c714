"""The online learner: one-pass triplets (Sec. III-A) feeding one of five updates.

:class:`Learner` is the object the service runs and checkpoints; the scikit-learn style
estimators in :mod:`service.core.estimators` wrap it. It is not thread-safe: one writer at a
time (the service owns all concurrency).

Algorithms (``LearnerConfig.algorithm``), all on the same buffer, triplets and generator:

* ``opml`` / ``copml``: the paper's closed-form step (Eq. 16), COPML with the cold-start pair
  step (Eq. 20): :mod:`service.core.update`;
* ``sgd``: online SGD on the (smoothed) triplet margin loss for the same ``L``, OPML's explicit
  twin, O(d^2): :mod:`service.core.sgd`;
* ``sgd_psd``: projected SGD on ``M = L^T L``, the convex setting of seed 000, O(d^3) per
  active step: :mod:`service.core.psd`;
* ``brm``: online BRM-R, learning ``L`` under the boundary-restricted distance (seed 003),
  O(d^2): :mod:`service.core.brm`. Its verification calibrator works on ``D_R^2``.

Every learner also reports step-mass diagnostics (:meth:`Learner.stability`,
:mod:`service.core.stability`) and the restricted distance of its metric
(:meth:`Learner.restricted_squared_distances`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.linalg.blas import dtrmm
from threadpoolctl import ThreadpoolController

from service.core._validation import (
    Array,
    check_matrix,
    check_metric,
    check_nonnegative,
    check_positive,
    check_vector,
    label_key,
)
from service.core.brm import canonical_factor, restricted_root, restricted_squared_norms
from service.core.calibration import ThresholdCalibrator
from service.core.certificates import Certificate, Method
from service.core.gradient import CONSTANT, KINDS, STEP_RULES, learn_batch_gradient
from service.core.holdout import HELD_OUT, Flags, Holdout, check_flags, check_holdout_config
from service.core.stability import Stability, StabilityTracker
from service.core.update import OUTCOMES as OUTCOMES
from service.core.update import (
    PASSIVE,
    SGD_UPDATE,
    SHRUNK_UPDATE,
    TRIPLET_UPDATE,
    StepResult,
    StepResults,
    learn_batch,
)

Algorithm = Literal["opml", "copml", "sgd", "sgd_psd", "brm"]
StepRule = Literal["constant", "descent", "invsqrt"]
Normalize = Literal["none", "l2"]

#: Each algorithm's own hyperparameters and their defaults. A field missing from an
#: algorithm's row is not used by it: it stays ``None`` and setting it is a ValueError
#: (``kappa`` belongs to ``step="descent"`` only). ``gamma_pair`` is used by ``copml`` and
#: ``sgd`` (the cold-start pair step) and kept, unused, by the others. Ranges where each update
#: is defined (else ValueError naming the field):
#:
#: ======== ====================================================================================
#: gamma    > 0: OPML's step (Eqs. 12, 16)
#: margin   > 0; for ``brm`` (its tau, a gap of ``D_R^2`` in [0, 1)) also < 1
#: step     ``"constant"``, ``"descent"`` or ``"invsqrt"`` (:mod:`service.core.sgd`)
#: eta      > 0: the gradient step eta_0. Defaults: ``sgd`` ``gamma / 2`` and ``sgd_psd``
#:          ``2 gamma``, the first-order match of OPML's step (``L -> L (I - gamma A)``, i.e.
#:          ``M -> M - 2 gamma A`` near ``M = I``); ``brm`` 0.3, the best of a grid on seed
#:          003's Table 3 protocol (``benchmarks/results/learners.md``)
#: mu       >= 0: smoothing of the loss (0 = hinge); ``sgd``, ``sgd_psd``
#: kappa    in (0, 0.5]: the descent cap's fraction (1 would collapse a direction of L)
#: lam      >= 0 with ``2 eta lam < 1`` (and ``gamma_pair lam < 1`` for ``sgd``): the decay
#:          factor ``1 - 2 eta lam`` stays positive
#: ======== ====================================================================================
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "opml": {"gamma": 1e-3, "margin": 1.0},
    "copml": {"gamma": 1e-3, "margin": 1.0},
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

#: The default of a field whose default depends on the algorithm (``margin``): replaced by
#: its :data:`ALGORITHM_DEFAULTS` value when the config is made.
BY_ALGORITHM: Any = None

#: Outcomes of steps that measured both distances of a triplet (they feed the calibrator).
_MEASURED = np.zeros(len(OUTCOMES), dtype=bool)
_MEASURED[[TRIPLET_UPDATE, SHRUNK_UPDATE, PASSIVE, SGD_UPDATE]] = True

STATE_FORMAT = 1


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


@dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of one model, validated on construction.

    ``gamma`` is the OPML/COPML triplet step size (the paper's gamma_2 for COPML),
    ``gamma_pair`` the cold-start pair step size (gamma_1; for ``sgd`` the step ``s`` of the
    explicit twin). The defaults come from ``benchmarks/results/gamma_grid.md`` (z-scored
    features): ``gamma = 1e-3`` is the largest step that keeps all ten Table II data sets within
    the paper's bar (at 3e-3 optdigits, d = 64, already fails), and ``gamma_pair = 1e-2`` gives
    the best cold start (Table IV) at every gamma tried. ``normalize="l2"`` scales every input
    (samples and query vectors alike) to unit norm, where the paper's ``gamma < 1/4`` guarantee
    holds. The gradient learners' ``step``, ``eta``, ``mu``, ``kappa``, ``lam`` and each
    algorithm's defaults and ranges: :data:`ALGORITHM_DEFAULTS` (``eta = gamma / 2 = 5e-4``
    makes hinge ``sgd`` OPML's first-order twin, ``eta = 2 gamma`` does it for ``sgd_psd``).
    A field left at its default takes the algorithm's value; one the algorithm does not use
    stays ``None``. ``holdout``, ``holdout_window``, ``pac_bayes_prefix`` and
    ``pac_bayes_window`` configure risk certificates (:mod:`service.core.holdout`).

    >>> LearnerConfig(dim=3).algorithm
    'copml'
    >>> LearnerConfig(dim=3, gamma=-1)
    Traceback (most recent call last):
    ...
    ValueError: gamma: must be a finite number > 0, got -1
    >>> c = LearnerConfig(dim=3, algorithm="brm")
    >>> c.margin, c.step, c.eta, c.gamma
    (0.1, 'descent', 0.3, None)
    >>> LearnerConfig(dim=3, algorithm="sgd", gamma=0.1)
    Traceback (most recent call last):
    ...
    ValueError: gamma: not used by algorithm 'sgd'
    """

    dim: int
    algorithm: Algorithm = "copml"
    gamma: float | None = None
    gamma_pair: float = 1e-2
    margin: float = BY_ALGORITHM
    normalize: Normalize = "none"
    seed: int = 0
    calibration_window: int = 1000
    step: StepRule | None = None
    eta: float | None = None
    mu: float | None = None
    kappa: float | None = None
    lam: float | None = None
    holdout: float = 0.0
    holdout_window: int = 5000
    pac_bayes_prefix: int = 1000
    pac_bayes_window: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int | np.integer):
            raise ValueError(f"dim: must be an integer, got {self.dim!r}")
        if self.dim < 1:
            raise ValueError(f"dim: must be >= 1, got {self.dim}")
        if self.algorithm not in ALGORITHM_DEFAULTS:
            known = ", ".join(repr(name) for name in ALGORITHM_DEFAULTS)
            raise ValueError(f"algorithm: must be one of {known}, got {self.algorithm!r}")
        if self.normalize not in ("none", "l2"):
            raise ValueError(f"normalize: must be 'none' or 'l2', got {self.normalize!r}")
        object.__setattr__(self, "dim", int(self.dim))
        object.__setattr__(self, "gamma_pair", check_positive(self.gamma_pair, "gamma_pair"))
        self._resolve(ALGORITHM_DEFAULTS[self.algorithm])
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if self.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {self.seed}")
        object.__setattr__(self, "seed", int(self.seed))
        if self.calibration_window < 1:
            raise ValueError(f"calibration_window: must be >= 1, got {self.calibration_window}")
        names = ("holdout", "holdout_window", "pac_bayes_prefix", "pac_bayes_window")
        checked = check_holdout_config(*(getattr(self, name) for name in names))
        for name, value in zip(names, checked, strict=True):
            object.__setattr__(self, name, value)

    def _resolve(self, defaults: dict[str, Any]) -> None:
        """Fill the algorithm's defaults, refuse fields it does not use, check the ranges."""
        algorithm = self.algorithm
        step = defaults.get("step") if self.step is None else self.step
        if "step" not in defaults:
            if self.step is not None:
                raise ValueError(f"step: not used by algorithm {algorithm!r}")
        elif step not in STEP_RULES:
            names = ", ".join(repr(rule) for rule in STEP_RULES)
            raise ValueError(f"step: must be one of {names}, got {step!r}")
        object.__setattr__(self, "step", step)
        for name in ("gamma", "eta", "mu", "kappa", "lam"):
            value = getattr(self, name)
            if name not in defaults or (name == "kappa" and step != "descent"):
                if value is not None:
                    where = f"step {step!r}" if name == "kappa" else f"algorithm {algorithm!r}"
                    raise ValueError(f"{name}: not used by {where}")
                continue
            value = defaults[name] if value is None else value
            check = check_positive if name in ("gamma", "eta", "kappa") else check_nonnegative
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
        if self.lam and algorithm == "sgd" and self.gamma_pair * self.lam >= 1.0:
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
    scale = np.abs(X).max(axis=1, keepdims=True)
    scale[scale == 0.0] = 1.0
    Y = X / scale
    norms = np.sqrt(np.einsum("ij,ij->i", Y, Y))[:, None]
    norms[norms == 0.0] = 1.0
    out: Array = Y / norms
    return out


def _normalized_minus(X: Array, how: Normalize, A: Array, out: Array) -> Array:
    """``normalize_rows(X, how) - A`` written into ``out``: bit for bit the same operations,
    without the temporaries (``max |x| = max(max x, -min x)``; two passes and three
    allocations fewer per block of a one-to-many query)."""
    if how == "none":
        return np.subtract(X, A, out=out)
    scale = np.maximum(X.max(axis=1), -X.min(axis=1))
    scale[scale == 0.0] = 1.0
    np.divide(X, scale[:, None], out=out)
    norms = np.sqrt(np.einsum("ij,ij->i", out, out))
    norms[norms == 0.0] = 1.0
    np.divide(out, norms[:, None], out=out)
    return np.subtract(out, A, out=out)


def _tracker(config: LearnerConfig) -> StabilityTracker:
    """The step-mass accounting of ``config``'s algorithm (nominal steps, see its module)."""
    if config.algorithm in GRADIENT_ALGORITHMS:
        assert config.eta is not None and config.step is not None  # set by LearnerConfig
        return StabilityTracker(
            eta_triplet=config.eta,
            eta_pair=0.5 * config.gamma_pair,  # sgd's pair step s = 2 eta
            rule=STEP_RULES.index(config.step),
            mu=config.mu,
            lam=config.lam or 0.0,
            convex=config.algorithm == "sgd_psd",
        )
    assert config.gamma is not None
    return StabilityTracker(config.gamma, config.gamma_pair, CONSTANT, mu=None, lam=0.0)


class Learner:
    """Online metric learning one sample at a time, with the queries of the live metric.

    >>> learner = Learner(LearnerConfig(dim=4, gamma=0.05, margin=2.0, seed=1))
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
    """

    def __init__(self, config: LearnerConfig) -> None:
        self.config = config
        d = config.dim
        self._L: Array = np.eye(d)
        self._bound = 1.0  # an upper bound of max |L_ij| (see service.core.update)
        # The served L is scale * _L: the lazy decay of the gradient learners (sgd, brm).
        self._scale = 1.0
        self._served: Array | None = None  # scale * _L when scale != 1 (see _metric)
        self._R: Array | None = None  # triangular factor of L for one-to-many (see _factor)
        self._canonical: Array | None = None  # L of the restricted distance (see brm)
        self._buffer: Array = np.empty((4, d))
        self._classes: list[str] = []
        self._index: dict[str, int] = {}
        self._rng = np.random.default_rng(config.seed)
        self._stats = _Stats()
        self._stability = _tracker(config)
        self.calibrator = ThresholdCalibrator(config.calibration_window)
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
        """The served ``L``: ``_L`` itself, or ``scale * _L`` (computed once per change)."""
        if self._scale == 1.0:
            return self._L
        if self._served is None:
            self._served = self._scale * self._L
        return self._served

    def _changed(self) -> None:
        """``L`` changed: drop what was derived from it."""
        self._served = self._R = self._canonical = None

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
        """A copy of ``h_k``, the latest (normalised) sample of class ``label``."""
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
        keys = [label_key(label, f"y[{i}]") for i, label in enumerate(labels)]
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
        for t, key in enumerate(keys):
            known[t] = len(classes)
            slot = index.get(key)
            if slot is None:
                slot = index[key] = len(classes)
                classes.append(key)
            slots[t] = slot
        self._reserve(len(classes))
        self._stability.reserve(len(classes))
        # Every sample draws one uniform, used when it forms a triplet (Sec. III-A), so the
        # stream of draws does not depend on how samples are batched.
        uniforms = self._rng.random(n)
        # ... which picks the negative uniformly among the other seen classes (learn_batch
        # does the same arithmetic for OPML/COPML; the others take these rows).
        negatives = (uniforms * np.maximum(known - 1, 0)).astype(np.int64)
        negatives += negatives >= slots
        codes = np.empty(n, dtype=np.int64)
        values = np.empty((n, 4))
        fro2 = np.full(n, np.nan)  # ||A_t||_F^2 of the gradient learners' steps
        if n == 1 and self.dim < _THREADED_DIM and self.config.algorithm != "sgd_psd":
            self._run(rows, slots, known, uniforms, negatives, codes, values, fro2)
        else:
            # The step is memory-bound with an inner dimension of 2: one BLAS thread is as
            # fast on an idle machine and several times faster on a busy one. (sgd_psd's
            # eigendecompositions always run on one: the same rounding in learn_one.)
            with _blas().limit(limits=1, user_api="blas"):
                self._run(rows, slots, known, uniforms, negatives, codes, values, fro2)
        self._stability.observe(rows, slots, known, negatives, codes, fro2, self._trained())
        self._stats.samples_seen += n
        if n == 1:  # learn_one: spare it the array bookkeeping below
            code = int(codes[0])
            self._stats.outcomes[code] += 1
            if _MEASURED[code]:
                self.calibrator.observe(float(values[0, 1]), float(values[0, 2]))
        else:
            measured = _MEASURED[codes]
            self.calibrator.observe_many(values[measured, 1], values[measured, 2])
            self._stats.outcomes += np.bincount(codes, minlength=len(OUTCOMES))
        return StepResults(codes, values)

    def _trained(self) -> int:
        """Samples learned so far (held-out ones excluded): the gradient learners' step
        counter ``t``, so that holding samples out does not change the step sizes, and
        ``learn_one`` and ``learn_many`` agree however held-out rows are interleaved."""
        return self._stats.samples_seen - int(self._stats.outcomes[HELD_OUT])

    def _run(
        self,
        rows: Array,
        slots: Any,
        known: Any,
        uniforms: Array,
        negatives: Any,
        codes: Any,
        values: Array,
        fro2: Array,
    ) -> None:
        """One batch through its algorithm's compiled loop."""
        cfg = self.config
        if cfg.algorithm not in GRADIENT_ALGORITHMS:
            self._bound = learn_batch(
                self._L,
                self._buffer,
                rows,
                slots,
                known,
                uniforms,
                cfg.algorithm == "copml",
                cfg.gamma,
                cfg.gamma_pair,
                cfg.margin,
                self._bound,
                codes,
                values,
            )
            return
        assert cfg.step is not None  # set by LearnerConfig
        state = np.array([self._scale, self._bound])
        learn_batch_gradient(
            KINDS[cfg.algorithm],
            self._L,
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
        self._scale, self._bound = float(state[0]), float(state[1])

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
        self._L = np.array(check_metric(L, self.dim, "L"), dtype=np.float64, order="C")
        self._bound = float(np.abs(self._L).max())
        self._scale = 1.0
        self._changed()

    def certificate(
        self, delta: float = 0.05, method: Method = "binomial", threshold: float | None = None
    ) -> Certificate:
        """Bounds on the triplet error, false accept and false reject rates of the current
        metric at ``threshold`` (default: the served one), holding together with probability
        ``>= 1 - delta`` (see :mod:`service.core.certificates`)."""
        if self.config.algorithm == "brm":
            # The certificates count errors of ||L(a - b)||^2; a brm model decides on D_R^2,
            # which is not a function of it (service.core.brm): a bound on the other
            # distance would be no bound on what the model serves.
            raise ValueError(
                "algorithm: certificates are not available for 'brm' (they bound decisions "
                "on ||L(a - b)||^2, a brm model decides on the restricted distance)"
            )
        cal = self.calibrator.calibration()
        return self.holdout.certificate(self._metric(), cal, delta, method, threshold, self.version)

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

        ``arrays["L"]`` is the stored factor: the served ``L`` is ``meta["scale"]`` times it
        (the lazy decay of ``sgd`` / ``brm``; 1 for every other algorithm and without decay).
        """
        rng = self._rng.bit_generator.state
        pairs, cal_meta = self.calibrator.to_state()
        arrays = {
            "L": self._L.copy(),
            "buffer": self._buffer[: len(self._classes)].copy(),
            "calibration": pairs,
        }
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
            "calibration": cal_meta,
            "scale": self._scale,
            "stability": self._stability.to_state(len(self._classes)),
        }
        held_arrays, meta["holdout"] = self.holdout.to_state()
        arrays.update(held_arrays)
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, Array], meta: dict[str, Any]) -> Learner:
        """Rebuild a learner from :meth:`to_state` output; ValueError if it is inconsistent."""
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"state: unsupported format {meta.get('format')!r}")
        learner = cls(LearnerConfig(**meta["config"]))
        d = learner.dim
        learner.set_metric(arrays["L"])
        classes = [str(k) for k in meta["classes"]]
        buffer = check_matrix(np.asarray(arrays["buffer"]).reshape(-1, d), d, "buffer")
        if len(buffer) != len(classes) or len(set(classes)) != len(classes):
            raise ValueError("state: buffer rows and classes do not match")
        for key, row in zip(classes, buffer, strict=True):
            learner._remember(key, row)
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
        learner.calibrator = ThresholdCalibrator.from_state(
            arrays["calibration"], meta["calibration"]
        )
        learner.holdout.restore(arrays, meta.get("holdout"), learner._stats.samples_seen)
        return learner


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) the learning kernel for the types it gets.

    The first compilation takes seconds; a service calls this before it reports ready, so no
    request waits for it. Later processes load the cached machine code in well under a second.
    """
    algorithm: Algorithm
    for algorithm in ("opml", "copml", *GRADIENT_ALGORITHMS):  # type: ignore[assignment]
        learner = Learner(LearnerConfig(dim=2, algorithm=algorithm))
        learner.learn_many(np.eye(2)[[0, 0, 1, 1]], ["a", "a", "b", "b"])
        learner.learn_one([0.0, 1.0], "b")
