"""The online learner: one-pass triplets (Sec. III-A) feeding the OPML/COPML updates.

:class:`Learner` is the object the service runs and checkpoints; the scikit-learn style
estimators in :mod:`service.core.estimators` wrap it. It is not thread-safe: one writer at a
time (the service owns all concurrency).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

import numpy as np
from scipy.linalg.blas import dtrmm
from threadpoolctl import ThreadpoolController

from service.core import steps
from service.core._validation import (
    Array,
    check_int,
    check_matrix,
    check_metric,
    check_vector,
    label_key,
)
from service.core.calibration import ThresholdCalibrator
from service.core.certificates import Certificate, Method
from service.core.holdout import HELD_OUT, Flags, Holdout, check_flags, check_holdout_config
from service.core.race import DEFAULT_GAMMA, Race
from service.core.tracks import Tracks
from service.core.update import OUTCOMES as OUTCOMES
from service.core.update import STEP_SCALE, StepResult, StepResults

Algorithm = Literal["opml", "copml"]
Normalize = Literal["none", "l2"]

#: 2: step rules, scale estimate, divergence monitor, race (format 1 = the paper's rule only).
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

    ``gamma`` is the triplet step size (the paper's gamma_2 for COPML), ``gamma_pair`` the
    COPML pair step size (gamma_1), ``margin`` the hinge margin (Eq. 4). ``step`` says in which
    units they are read (:mod:`service.core.steps`): ``"scaled"`` (default) in units of the
    stream's typical squared difference, so the same values work at any input scale and
    dimension; ``"paper"`` in the input's units, the paper's literal rule. ``None`` means the
    rule's default: scaled ``gamma = 0.05``, ``gamma_pair = 0.1``; paper ``gamma = 1e-3`` (the
    largest step that keeps all ten Table II data sets within the paper's bar,
    ``benchmarks/results/gamma_grid.md``) and ``gamma_pair = 1e-2``. ``gamma="auto"``
    (scaled only) races a grid of step sizes during the first ``auto_warmup`` triplets and
    keeps the winner (:mod:`service.core.race`). ``normalize="l2"`` scales every input (samples
    and query vectors alike) to unit norm. Every value has a documented range
    (:mod:`service.core.steps`); outside it, ``ValueError`` naming the argument. ``holdout``,
    ``holdout_window``, ``pac_bayes_prefix`` and ``pac_bayes_window`` configure risk
    certificates (:mod:`service.core.holdout`).

    >>> LearnerConfig(dim=3).algorithm, LearnerConfig(dim=3).step, LearnerConfig(dim=3).gamma
    ('copml', 'scaled', 0.05)
    >>> LearnerConfig(dim=3, step="paper").gamma
    0.001
    >>> LearnerConfig(dim=3, gamma=1e300)
    Traceback (most recent call last):
    ...
    ValueError: gamma: must be in (0, 1], got 1e+300
    """

    dim: int
    algorithm: Algorithm = "copml"
    gamma: float | Literal["auto"] | None = None
    gamma_pair: float | None = None
    margin: float = 1.0
    normalize: Normalize = "none"
    seed: int = 0
    calibration_window: int = 1000
    step: steps.Step | None = None
    auto_warmup: int = 1000
    holdout: float = 0.0
    holdout_window: int = 5000
    pac_bayes_prefix: int = 1000
    pac_bayes_window: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", check_int(self.dim, "dim", 1, MAX_DIM))
        if self.algorithm not in ("opml", "copml"):
            raise ValueError(f"algorithm: must be 'opml' or 'copml', got {self.algorithm!r}")
        if self.normalize not in ("none", "l2"):
            raise ValueError(f"normalize: must be 'none' or 'l2', got {self.normalize!r}")
        step, gamma, gamma_pair, margin = steps.resolve(
            self.step, self.gamma, self.gamma_pair, self.margin
        )
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "gamma_pair", gamma_pair)
        object.__setattr__(self, "margin", margin)
        object.__setattr__(self, "seed", check_int(self.seed, "seed", 0, 2**128 - 1))
        window = check_int(self.calibration_window, "calibration_window", 1, 1_000_000)
        object.__setattr__(self, "calibration_window", window)
        warmup = check_int(self.auto_warmup, "auto_warmup", 10, 100_000)
        object.__setattr__(self, "auto_warmup", warmup)
        names = ("holdout", "holdout_window", "pac_bayes_prefix", "pac_bayes_window")
        checked = check_holdout_config(*(getattr(self, name) for name in names))
        for name, value in zip(names, checked, strict=True):
            object.__setattr__(self, name, value)


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


class Learner:
    """OPML / COPML learning one sample at a time, with the queries of the live metric.

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

    The learner's own view of its run (JSON-safe dicts, for the model document, ``/events`` and
    metrics): :attr:`health` (divergence monitor, :mod:`service.core.health`), :attr:`race`
    (``gamma="auto"``, :mod:`service.core.race`) and :attr:`effective` (the step sizes and
    margin in input units, as the next step will use them).
    """

    def __init__(self, config: LearnerConfig) -> None:
        self.config = config
        d = config.dim
        self._R: Array | None = None  # triangular factor of L for one-to-many (see _factor)
        self._buffer: Array = np.empty((4, d))
        self._classes: list[str] = []
        self._index: dict[str, int] = {}
        self._rng = np.random.default_rng(config.seed)
        self._stats = _Stats()
        # Running scale [S, n] of step="scaled" (service.core.update), kept in every mode.
        self._stream: Array = np.zeros(2)
        auto = config.gamma == steps.AUTO
        gamma = DEFAULT_GAMMA if auto else float(config.gamma)  # type: ignore[arg-type]
        self._tracks = Tracks(np.eye(d), [gamma], config.calibration_window)
        # The race copies L at the first learned sample (a PUT before it is raced from).
        self._race = Race(config.auto_warmup) if auto else None
        #: Held-out routing, the certification reservoir, the PAC-Bayes prior and window.
        self.holdout = Holdout(config, functools.partial(normalize_rows, how=config.normalize))

    # -- read-only views -------------------------------------------------------------------

    @property
    def L(self) -> Array:
        """The transformation matrix (a read-only view; copy it to keep it)."""
        view = self._tracks.L.view()
        view.flags.writeable = False
        return view

    @property
    def calibrator(self) -> ThresholdCalibrator:
        """The verification threshold calibrator of the served metric."""
        return self._tracks.calibrator

    @property
    def health(self) -> dict[str, Any]:
        """The divergence monitor of the served metric: ``state`` (``"ok"``, ``"diverging"``,
        ``"stabilised"``), ``shrunk_rate``, ``growth`` / ``growth_rate`` (log10 of the growth of
        ``||L||_F`` since the start / over the last window), ``frobenius_norm``,
        ``times_tripped``, ``step_scale`` (the factor the trips left on the step sizes) and
        ``updates``. See :mod:`service.core.health` for the policy."""
        return self._tracks.health()

    @property
    def race(self) -> dict[str, Any] | None:
        """``gamma="auto"``: the race's ``state`` (``"racing"`` / ``"done"``), ``grid``,
        ``warmup``, progress, ``serving`` / ``winner`` step size, each rung's scores
        (``rounds``) and the live candidates with their health; None otherwise."""
        if self._race is None:
            return None
        return self._race.report(self._tracks if self._race.started else None)

    @property
    def effective(self) -> dict[str, float | None]:
        """The served metric's step sizes and margin in input units, as the next step would
        use them (``gamma_t``, ``gamma_pair_t``, ``margin_t`` of :mod:`service.core.update`,
        with the divergence monitor's ``step_scale`` applied), and ``scale``, the running mean
        squared difference ``S`` (None before the first difference; the scaled figures are
        None then too). ``margin`` is what the hinge (Eq. 4) and a fallback verification
        threshold are in squared-distance units."""
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
        """The hinge margin (Eq. 4) in squared-distance units of the input: what the
        ``fallback:margin`` verification threshold is. ``config.margin`` under
        ``step="paper"``, and under ``step="scaled"`` before the stream formed a difference
        (no scale known yet); else ``effective["margin"]``.

        >>> learner = Learner(LearnerConfig(dim=2, margin=2.0))
        >>> learner.margin
        2.0
        >>> _ = learner.learn_many([[0.0, 0.0], [3.0, 4.0]], ["a", "a"])  # |a|^2 = 25
        >>> learner.margin
        50.0
        """
        margin = self.effective["margin"]
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
        results, held = self.holdout.route(X, keys, flags, self._learn, lambda: self._tracks.L)
        if held:
            self._stats.samples_seen += held
            self._stats.outcomes[HELD_OUT] += held
        return results

    def _learn(self, X: Array, keys: list[str]) -> StepResults:
        """Learn validated rows: classes first (buffer rows), then the compiled loop."""
        n = len(keys)
        self._R = None  # L changes below
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
        # Every sample draws one uniform, used when it forms a triplet (Sec. III-A), so the
        # stream of draws does not depend on how samples are batched.
        uniforms = self._rng.random(n)
        race = self._race
        if race is not None and not race.started:
            race.start(self._tracks)
        racing = race is not None and not race.done
        cfg = self.config
        args = (
            cfg.algorithm == "copml",
            cfg.step == "scaled",
            cast(float, cfg.gamma_pair),
            float(cfg.margin),
            self._stream,
        )
        pinned = n > 1 or self.dim >= _THREADED_DIM or racing
        # The step is memory-bound with an inner dimension of 2: one BLAS thread is as fast
        # on an idle machine and several times faster on a busy one.
        with _blas().limit(limits=1, user_api="blas") if pinned else contextlib.nullcontext():
            if race is None or not racing:
                all_codes, all_values = self._tracks.learn(
                    self._buffer, rows, slots, known, uniforms, *args
                )
                codes, values = all_codes[:, 0], all_values[:, 0]
            else:
                codes, values = self._race_segments(race, rows, slots, known, uniforms, args)
        self._stats.samples_seen += n
        if n == 1:
            self._stats.outcomes[int(codes[0])] += 1
        else:
            self._stats.outcomes += np.bincount(codes, minlength=len(OUTCOMES))
        return StepResults(codes, values)

    def _race_segments(
        self,
        race: Race,
        rows: Array,
        slots: Any,
        known: Any,
        uniforms: Array,
        args: tuple[Any, ...],
    ) -> tuple[Any, Array]:
        """Learn a batch during a race: cut where a rung ends (at a fixed triplet count, so
        any batching gives the same state); each segment's results are its served track's."""
        n = len(rows)
        forms = (slots != known) & (known >= 2)  # the samples that form a triplet
        codes = np.empty(n, dtype=np.int64)
        values = np.empty((n, 4))
        start = 0
        for end in race.cuts(forms):
            part = slice(start, end)
            served = self._tracks.served
            seg_codes, seg_values = self._tracks.learn(
                self._buffer, rows[part], slots[part], known[part], uniforms[part], *args
            )
            codes[part] = seg_codes[:, served]
            values[part] = seg_values[:, served]
            race.record(self._tracks, forms[part], seg_values)
            start = end
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
        self._R = None

    def certificate(
        self, delta: float = 0.05, method: Method = "binomial", threshold: float | None = None
    ) -> Certificate:
        """Bounds on the triplet error, false accept and false reject rates of the current
        metric at ``threshold`` (default: the served one, whose margin fallback is
        :attr:`margin`), holding together with probability
        ``>= 1 - delta`` (see :mod:`service.core.certificates`)."""
        cal = self.calibrator.calibration()
        return self.holdout.certificate(
            self._tracks.L, cal, delta, method, threshold, self.version, margin=self.margin
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
            z = self._tracks.L @ (X[0] - X[1])
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
        LT = self._tracks.L.T
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
            R = self._R = np.asfortranarray(np.linalg.qr(self._tracks.L, mode="r"))
        return R

    def transform(self, X: Any) -> Array:
        """``X L^T``: rows mapped into the learned space (Euclidean there = Eq. 1 here)."""
        with _quiet():
            out: Array = self._prepare(X, "X") @ self._tracks.L.T
        return out

    # -- state -----------------------------------------------------------------------------

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """Arrays and JSON-safe metadata holding everything needed to resume exactly.

        Arrays: ``L`` (the served metric), ``buffer`` (H, one row per class) and
        ``calibration`` (its threshold window); while a ``gamma="auto"`` race runs, also
        ``tracks_L`` and ``tracks_calibration`` (every candidate's) and ``race_pairs`` (the
        current rung's measurements). A store must keep every array it is given.
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
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, Array], meta: dict[str, Any]) -> Learner:
        """Rebuild a learner from :meth:`to_state` output; ValueError if it is inconsistent.

        Format 1 (before step rules existed) resumes as ``step="paper"``, the rule it ran.
        """
        fmt = meta.get("format")
        if fmt not in (1, STATE_FORMAT):
            raise ValueError(f"state: unsupported format {fmt!r}")
        config = dict(meta["config"])
        if fmt == 1:
            config.setdefault("step", "paper")
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
        learner.holdout.restore(arrays, meta.get("holdout"), learner._stats.samples_seen)
        return learner


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) the learning kernel for the types it gets.

    The first compilation takes seconds; a service calls this before it reports ready, so no
    request waits for it. Later processes load the cached machine code in well under a second.
    """
    algorithm: Algorithm
    for algorithm in ("opml", "copml"):
        learner = Learner(LearnerConfig(dim=2, algorithm=algorithm))
        learner.learn_many(np.eye(2)[[0, 0, 1, 1]], ["a", "a", "b", "b"])
        learner.learn_one([0.0, 1.0], "b")
