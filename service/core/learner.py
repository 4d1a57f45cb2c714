"""The online learner: one-pass triplets (Sec. III-A) feeding the OPML/COPML updates.

:class:`Learner` is the object the service runs and checkpoints; the scikit-learn style
estimators in :mod:`service.core.estimators` wrap it. It is not thread-safe: one writer at a
time (the service owns all concurrency).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from threadpoolctl import ThreadpoolController

from service.core._validation import (
    Array,
    check_matrix,
    check_metric,
    check_positive,
    check_vector,
    label_key,
)
from service.core.calibration import ThresholdCalibrator
from service.core.update import EntryBound, StepResult, pair_step, triplet_step

Algorithm = Literal["opml", "copml"]
Normalize = Literal["none", "l2"]

#: Every outcome a step can have. ``new_class``: first sample of its class, buffered only.
#: ``pair_update``: COPML cold-start pair step (Eq. 20). ``triplet_update``: OPML step (Eq. 16).
#: ``shrunk_update``: OPML step with gamma reduced to keep ``I + gamma A`` positive definite.
#: ``passive``: hinge <= 0, ``L`` untouched. ``single_class``: OPML (no pre-stage) while one
#: class has been seen, buffered only. ``skipped``: the step would overflow float64; ``L``
#: untouched (see :mod:`service.core.update`).
OUTCOMES = (
    "new_class",
    "pair_update",
    "triplet_update",
    "shrunk_update",
    "passive",
    "single_class",
    "skipped",
)
TRIPLET_OUTCOMES = frozenset({"triplet_update", "shrunk_update", "passive"})

STATE_FORMAT = 1
_NEW_CLASS = StepResult("new_class")
_SINGLE_CLASS = StepResult("single_class")


def _quiet() -> np.errstate:
    """Overflow in a step is detected and handled (outcome ``skipped``): no numpy warning."""
    return np.errstate(over="ignore", invalid="ignore")


#: From this dimension on, pinning BLAS to one thread (~12 us) pays for itself in learn_one.
_THREADED_DIM = 256


@functools.cache
def _blas() -> ThreadpoolController:
    """BLAS thread control, made once (enumerating the loaded libraries costs ~0.5 ms)."""
    return ThreadpoolController()


@dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of one model, validated on construction.

    ``gamma`` is the triplet step size (the paper's gamma_2 for COPML), ``gamma_pair`` the
    COPML pair step size (gamma_1). ``normalize="l2"`` scales every input (samples and query
    vectors alike) to unit norm, where the paper's ``gamma < 1/4`` guarantee holds.

    >>> LearnerConfig(dim=3).algorithm
    'copml'
    >>> LearnerConfig(dim=3, gamma=-1)
    Traceback (most recent call last):
    ...
    ValueError: gamma: must be a finite number > 0, got -1
    """

    dim: int
    algorithm: Algorithm = "copml"
    gamma: float = 1e-3
    gamma_pair: float = 1e-3
    margin: float = 1.0
    normalize: Normalize = "none"
    seed: int = 0
    calibration_window: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int | np.integer):
            raise ValueError(f"dim: must be an integer, got {self.dim!r}")
        if self.dim < 1:
            raise ValueError(f"dim: must be >= 1, got {self.dim}")
        if self.algorithm not in ("opml", "copml"):
            raise ValueError(f"algorithm: must be 'opml' or 'copml', got {self.algorithm!r}")
        if self.normalize not in ("none", "l2"):
            raise ValueError(f"normalize: must be 'none' or 'l2', got {self.normalize!r}")
        object.__setattr__(self, "dim", int(self.dim))
        object.__setattr__(self, "gamma", check_positive(self.gamma, "gamma"))
        object.__setattr__(self, "gamma_pair", check_positive(self.gamma_pair, "gamma_pair"))
        object.__setattr__(self, "margin", check_positive(self.margin, "margin"))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if self.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {self.seed}")
        object.__setattr__(self, "seed", int(self.seed))
        if self.calibration_window < 1:
            raise ValueError(f"calibration_window: must be >= 1, got {self.calibration_window}")


@dataclass
class _Stats:
    samples_seen: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


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


class Learner:
    """OPML / COPML learning one sample at a time, with the queries of the live metric.

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
        self._bound = EntryBound(self._L)
        self._buffer: Array = np.empty((4, d))
        self._classes: list[str] = []
        self._index: dict[str, int] = {}
        self._rng = np.random.default_rng(config.seed)
        self._stats = _Stats()
        self.calibrator = ThresholdCalibrator(config.calibration_window)
        self._ab: Array = np.empty((2, d))

    # -- read-only views -------------------------------------------------------------------

    @property
    def L(self) -> Array:
        """The transformation matrix (a read-only view; copy it to keep it)."""
        view = self._L.view()
        view.flags.writeable = False
        return view

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def version(self) -> int:
        """Number of samples learned so far."""
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
        return {name: self._stats.outcomes.get(name, 0) for name in OUTCOMES}

    def buffer(self, label: int | str) -> Array:
        """A copy of ``h_k``, the latest (normalised) sample of class ``label``."""
        key = label_key(label, "label")
        if key not in self._index:
            raise ValueError(f"label: class {key!r} has not been seen")
        row: Array = self._buffer[self._index[key]].copy()
        return row

    # -- learning --------------------------------------------------------------------------

    def learn_one(self, x: Any, y: int | str) -> StepResult:
        """Learn one labelled sample; ValueError (and no state change) on bad input."""
        xs = check_vector(x, self.dim, "x")
        key = label_key(y, "y")
        row = normalize_rows(xs[None, :], self.config.normalize)[0]
        if self.dim < _THREADED_DIM:
            with _quiet():
                return self._step(row, key)
        with _blas().limit(limits=1, user_api="blas"), _quiet():
            return self._step(row, key)

    def learn_many(self, X: Any, y: Any) -> list[StepResult]:
        """Learn the rows of ``X`` in order; the same final state as a :meth:`learn_one` loop.

        Everything is validated before the first sample is learned, so bad input anywhere in
        the batch changes nothing.
        """
        Xs = check_matrix(X, self.dim, "X")
        labels = list(y) if not isinstance(y, str) else [y]
        if len(labels) != Xs.shape[0]:
            raise ValueError(f"y: expected {Xs.shape[0]} labels, got {len(labels)}")
        keys = [label_key(label, f"y[{i}]") for i, label in enumerate(labels)]
        rows = normalize_rows(Xs, self.config.normalize)
        # The step is memory-bound with an inner dimension of 2: one BLAS thread is as fast on
        # an idle machine and several times faster on a busy one (benchmarks/core_timing.py).
        with _blas().limit(limits=1, user_api="blas"), _quiet():
            return [self._step(row, key) for row, key in zip(rows, keys, strict=True)]

    def _step(self, x: Array, key: str) -> StepResult:
        stats = self._stats
        slot = self._index.get(key)
        if slot is None:
            step = _NEW_CLASS
            self._remember(key, x)
        else:
            c = len(self._classes)
            h = self._buffer[slot]
            if c == 1:
                if self.config.algorithm == "copml":
                    step = pair_step(self._L, x - h, self.config.gamma_pair, self._bound)
                else:
                    step = _SINGLE_CLASS
            else:
                # The negative class, uniform among the other c - 1 (Sec. III-A).
                j = int(self._rng.random() * (c - 1))
                if j >= slot:
                    j += 1
                ab = self._ab
                np.subtract(x, h, out=ab[0])
                np.subtract(x, self._buffer[j], out=ab[1])
                step = triplet_step(self._L, ab, self.config.gamma, self.config.margin, self._bound)
                if step.outcome in TRIPLET_OUTCOMES:
                    assert step.d_pos is not None and step.d_neg is not None
                    self.calibrator.observe(step.d_pos, step.d_neg)
            h[:] = x
        stats.samples_seen += 1
        stats.outcomes[step.outcome] += 1
        return step

    def _remember(self, key: str, x: Array) -> None:
        c = len(self._classes)
        if c == len(self._buffer):
            grown = np.empty((2 * c, self.dim))
            grown[:c] = self._buffer[:c]
            self._buffer = grown
        self._buffer[c] = x
        self._index[key] = c
        self._classes.append(key)

    def set_metric(self, L: Any) -> None:
        """Replace ``L`` (warm start from a matrix learned elsewhere); the rest is kept."""
        self._L = np.array(check_metric(L, self.dim, "L"), dtype=np.float64, order="C")
        self._bound = EntryBound(self._L)

    # -- queries on the current metric (Eqs. 1, 2) -----------------------------------------

    def _prepare(self, X: Any, name: str) -> Array:
        return normalize_rows(check_matrix(X, self.dim, name), self.config.normalize)

    def squared_distance(self, a: Any, b: Any) -> float:
        """``||L(a - b)||^2`` (Eq. 2)."""
        A = self._prepare(np.atleast_2d(check_vector(a, self.dim, "a")), "a")
        B = self._prepare(np.atleast_2d(check_vector(b, self.dim, "b")), "b")
        with _quiet():  # enormous inputs may overflow to inf: an honest answer
            z = self._L @ (A[0] - B[0])
            return float(z @ z)

    def distance(self, a: Any, b: Any) -> float:
        """``sqrt((a - b)^T M (a - b))`` with ``M = L^T L`` (Eq. 1)."""
        return math.sqrt(self.squared_distance(a, b))

    def squared_distances(self, a: Any, B: Any) -> Array:
        """``||L(a - b_i)||^2`` for every row ``b_i`` of ``B`` (one to many)."""
        A = self._prepare(np.atleast_2d(check_vector(a, self.dim, "a")), "a")
        Bs = self._prepare(B, "b")
        with _quiet():
            Z = (Bs - A) @ self._L.T
            out: Array = np.einsum("ij,ij->i", Z, Z)
        return out

    def transform(self, X: Any) -> Array:
        """``X L^T``: rows mapped into the learned space (Euclidean there = Eq. 1 here)."""
        with _quiet():
            out: Array = self._prepare(X, "X") @ self._L.T
        return out

    # -- state -----------------------------------------------------------------------------

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """Arrays and JSON-safe metadata holding everything needed to resume exactly."""
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
            "outcomes": dict(self._stats.outcomes),
            "calibration": cal_meta,
        }
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
        learner._stats.outcomes.update({str(k): int(v) for k, v in meta["outcomes"].items()})
        learner.calibrator = ThresholdCalibrator.from_state(
            arrays["calibration"], meta["calibration"]
        )
        return learner
