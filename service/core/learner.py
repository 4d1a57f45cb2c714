"""Learning: one-pass triplets (Sec. III-A) feeding one of five updates.

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
* ``sgd_psd``: projected SGD on ``M = L^T L``, the convex setting of the stability paper
  (Chen et al., AAAI 2023), O(d^3) per active step: :mod:`service.core.psd`;
* ``brm``: online BRM-R, learning ``L`` under the boundary-restricted distance (the BRM paper),
  O(d^2): :mod:`service.core.brm`. Its verification calibrator works on ``D_R^2``;
* ``lda``: Fisher's discriminant directions from within-class statistics kept online in
  O(d^2) per sample and turned into ``L`` every ``refresh`` samples (O(d^3) then):
  :mod:`service.core.within`. Its triplets are only measured (outcome ``passive``: ``L`` does
  not move between refreshes), which feeds the verification calibrator; the calibrator's
  window spans refreshes, so right after one it mixes distances of two metrics.

``precondition="whiten"`` or ``"discriminant"`` (``opml``, ``copml``, ``sgd``): the learner
learns its ``L`` by its own rule on ``W x`` and serves ``L W`` (:attr:`Learner.L`, every query,
snapshot and certificate), ``W`` the within-class whitening or the discriminant weighting; how
``W`` arrives and what a refresh does to ``L``: :mod:`service.core.within`.

``step`` is one field whose values depend on the algorithm: ``"scaled"`` (default) or
``"paper"`` for ``opml`` / ``copml``, ``"constant"``, ``"descent"`` (default) or ``"invsqrt"`` for
the gradient learners (:data:`~service.core.config.STEP_VALUES`). The divergence monitor,
``gamma="auto"`` and ``auto_warmup`` belong to ``opml`` / ``copml``: the gradient learners have
their own step machinery (the ``descent`` cap, the lazy decay), and :attr:`Learner.health`,
:attr:`Learner.race` and :attr:`Learner.effective` are ``None`` for them.

Every learner also reports step-mass diagnostics (:meth:`Learner.stability`,
:mod:`service.core.stability`) and the restricted distance of its metric
(:meth:`Learner.restricted_squared_distances`).

The learner's configuration and its checks are :mod:`service.core.config`, its state format
:mod:`service.core.state`, and the queries of its metric :mod:`service.core.view` (the
learner answers them with a view of its current ``L``, the one a snapshot holds).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from service.core import health, state, steps
from service.core._threads import blas
from service.core._validation import (
    Array,
    check_matrix,
    check_metric,
    check_vector,
    label_key,
    label_keys,
)
from service.core.calibration import ThresholdCalibrator
from service.core.certificates import Certificate, Method
from service.core.config import GRADIENT_ALGORITHMS, Algorithm, LearnerConfig
from service.core.draws import negative_slots, tracker_for
from service.core.gradient import KINDS, STEP_RULES, learn_batch_gradient
from service.core.holdout import HELD_OUT, Flags, Holdout, check_flags
from service.core.normalize import normalize_rows
from service.core.race import DEFAULT_GAMMA, Race
from service.core.rehearsal import Reservoir
from service.core.stability import Stability
from service.core.tracks import Tracks
from service.core.update import (
    BOUND,
    OUTCOMES,
    PASSIVE,
    SGD_UPDATE,
    SHRUNK_UPDATE,
    STEP_SCALE,
    TRIPLET_UPDATE,
    StepResult,
    StepResults,
    nan_filled,
)
from service.core.view import MetricQueries, MetricView
from service.core.within import (
    WithinClass,
    apply,
    discriminant,
    fisher,
    measured_batch,
    next_refresh,
    whitening,
)

#: Outcomes of steps that measured both distances of a triplet (they feed the calibrator).
_MEASURED = np.zeros(len(OUTCOMES), dtype=bool)
_MEASURED[[TRIPLET_UPDATE, SHRUNK_UPDATE, PASSIVE, SGD_UPDATE]] = True

#: From this dimension on, pinning BLAS to one thread (~12 us) pays for itself in learn_one.
_THREADED_DIM = 256


@dataclass
class _Stats:
    samples_seen: int = 0
    #: Steps by outcome code (indexes :data:`OUTCOMES`).
    outcomes: Any = field(default_factory=lambda: np.zeros(len(OUTCOMES), dtype=np.int64))


class Learner(MetricQueries):
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
        self._view: MetricView | None = None  # the queries of the current L (see _metric_view)
        self._buffer: Array = np.empty((4, d))
        self._classes: list[str] = []
        self._index: dict[str, int] = {}
        self._rng = np.random.default_rng(config.seed)
        self._stats = _Stats()
        self._stability = tracker_for(config)
        # Running scale [S, n] of step="scaled" (service.core.update), kept in every OPML mode.
        self._stream: Array = np.zeros(2)
        self._gradient = config.algorithm in GRADIENT_ALGORITHMS
        self._lda = config.algorithm == "lda"
        auto = config.gamma == steps.AUTO
        if self._lda:
            gamma = 0.0
        elif self._gradient:
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
        #: Within-class statistics (``lda``, ``precondition="whiten"``) and the whitening ``W``.
        self._within = WithinClass(d) if config.within else None
        #: ``W``: None until the first refresh that finds the covariance definite (and
        #: without ``precondition="whiten"``).
        self._W: Array | None = None
        #: Samples learned when the first ``W`` formed (0 before): the origin of the
        #: discriminant step schedule (:meth:`_schedule`).
        self._first = 0
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
        """The served ``L``: the served track's, or ``scale`` times it, times ``W`` when
        whitened (formed once per change of ``L``, an O(d^3) product with ``W``)."""
        if self._scale == 1.0 and self._W is None:
            return self._tracks.L
        if self._served is None:
            L = self._tracks.L if self._scale == 1.0 else self._scale * self._tracks.L
            self._served = L if self._W is None else L @ self._W
        return self._served

    def _changed(self) -> None:
        """``L`` changed: drop what was derived from it."""
        self._served = self._view = None

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
        return None if self._gradient or self._lda else self._tracks.health()

    @property
    def race(self) -> dict[str, Any] | None:
        """``gamma="auto"``: the race's ``state`` (``"racing"``: it never ends), ``grid``,
        ``warmup``, progress, the ``serving`` step size, the last blocks' scores
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
        for the gradient learners (their config is in input units already) and ``lda``."""
        if self._gradient or self._lda:
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
        """Learn validated rows, cut where a refresh of the within-class statistics falls
        (at fixed learned-sample counts, :func:`~service.core.within.next_refresh`, so
        batching does not move it)."""
        stats = self._within
        if stats is None:
            return self._learn_part(X, keys)
        refresh = cast(int, self.config.refresh)
        parts: list[StepResults] = []
        start, n = 0, len(keys)
        while start < n:
            point = next_refresh(self._trained(), refresh)
            end = min(n, start + point - self._trained())
            parts.append(self._learn_part(X[start:end], keys[start:end]))
            if self._trained() == point:
                # O(d^3) on matrices of at most a few hundred rows: one BLAS thread is as
                # fast idle and much faster on a busy machine (as for the steps).
                with blas().limit(limits=1, user_api="blas"):
                    self._refresh()
            start = end
        if len(parts) == 1:
            return parts[0]
        codes = np.concatenate([part.codes for part in parts])
        return StepResults(codes, np.concatenate([part.values for part in parts]))

    def _refresh(self) -> None:
        """``lda``: ``L`` from the statistics; whitened: the new ``W`` with ``L`` and the
        buffer carried over, discriminant: the new ``W`` under the same ``L`` (module docstring
        of :mod:`service.core.within`). Kept as is while the statistics are singular."""
        cfg, stats, tracks = self.config, cast(WithinClass, self._within), self._tracks
        shrinkage = cast(float, cfg.shrinkage)
        if self._lda:
            L = fisher(stats, shrinkage)
            if L is not None and np.isfinite(L).all():
                tracks.set_metric(L)
            self._changed()
            return
        if self._W is not None:  # the schedule does not wait for a usable W
            self._schedule()
        follow = cfg.precondition == "discriminant"
        W = (discriminant if follow else whitening)(stats, shrinkage)
        if W is None or not np.isfinite(W).all():
            return
        c = len(self._classes)
        if self._W is None:  # the first W: L (I unless set) now acts on W x
            self._buffer[:c] = apply(self._buffer[:c], W)  # rows x -> W x, as new rows
            self._W = W
            self._first = self._trained()
            self._schedule()
            tracks.restart_calibration()  # distances so far were of L alone, not L W
            self._changed()
            return
        buffer = self._buffer[:c] @ np.linalg.solve(self._W, W)  # rows W_old h -> W_new h
        if not np.isfinite(buffer).all():
            return
        if not follow:
            moved = tracks.Ls @ np.linalg.solve(W, self._W).T  # L W_old W_new^{-1}
            if not np.isfinite(moved).all():
                return
            tracks.Ls[:] = moved
        for j in range(len(tracks)):
            tracks.state[j] = health.restart(tracks.state[j], tracks.Ls[j])
        self._buffer[:c] = buffer
        self._W = W
        self._changed()

    def _schedule(self) -> None:
        """``precondition="discriminant"`` with a fixed ``gamma`` (``opml`` / ``copml``): from
        the refresh point at ``n`` learned samples to the next, the steps take ``gamma *
        sqrt(n_1 / n)``, ``n_1`` the samples learned when the first ``W`` formed: the ``1 /
        sqrt(t)`` decay of online gradient descent's regret bound (Zinkevich, ICML 2003), so
        the refinement settles on a long stream rather than wander with every triplet, yet keeps
        learning (the choice: ``docs/design/discriminant-metric.md``). Set at refresh points
        only, so batching and resume points do not move it."""
        cfg = self.config
        if cfg.precondition != "discriminant" or self._race is not None or self._gradient:
            return
        ratio = self._first / max(self._trained(), 1)
        self._tracks.gammas[:] = cast(float, cfg.gamma) * math.sqrt(ratio)

    def _learn_part(self, X: Array, keys: list[str]) -> StepResults:
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
        if self._within is not None:
            self._within.observe(rows, slots)
            if self._W is not None:  # learn on W x (W symmetric: the rows are x^T W)
                rows = apply(rows, self._W)
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
        negatives = negative_slots(uniforms, known, slots)
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
        with blas().limit(limits=1, user_api="blas") if pinned else contextlib.nullcontext():
            if self._lda or (self._within is not None and self._W is None):
                codes, values = measured_batch(
                    self._tracks.L, self._buffer, rows, slots, known, negatives, self.calibrator
                )
                self._tracks.counts[0] += np.bincount(codes, minlength=len(OUTCOMES))
            elif self._gradient:
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
        L = check_metric(L, self.dim, "L")
        if self._W is not None:  # the served metric is L W: keep L W^{-1} (W symmetric)
            L = np.linalg.solve(self._W, L.T).T
        self._tracks.set_metric(L)
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

    # -- queries on the current metric (service.core.view) ---------------------------------

    def _metric_view(self) -> MetricView:
        """The queries of the current ``L``, made once per change of ``L`` (it reads the
        learner's ``L`` in place, so it is dropped when ``L`` changes: a snapshot makes its
        own from a copy)."""
        view = self._view
        if view is None:
            view = self._view = MetricView(self._metric(), self.config, check=False)
        return view

    # -- diagnostics -----------------------------------------------------------------------

    def stability(self) -> Stability:
        """Step-mass stability diagnostics (:mod:`service.core.stability`); not a bound."""
        return self._stability.report(self.n_classes)

    # -- state (service.core.state) --------------------------------------------------------

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """Arrays and JSON-safe metadata holding everything needed to resume exactly (the
        format: :mod:`service.core.state`). A store must keep every array it is given."""
        return state.dump(self)

    @classmethod
    def from_state(cls, arrays: dict[str, Array], meta: dict[str, Any]) -> Learner:
        """Rebuild a learner from :meth:`to_state` output; ValueError if it is in another
        format, incomplete or inconsistent."""
        return state.load(cls, arrays, meta)


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) the learning kernel for the types it gets.

    The first compilation takes seconds; a service calls this before it reports ready, so no
    request waits for it. Later processes load the cached machine code in well under a second.
    """
    normalize_rows(np.eye(2), "l2")
    calibrator = ThresholdCalibrator(window=4)
    calibrator.observe_many(np.ones(2), np.zeros(2))
    calibrator.calibration()
    negative_slots(np.zeros(1), np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    algorithm: Algorithm
    for algorithm in ("opml", "copml", *GRADIENT_ALGORITHMS, "lda"):  # type: ignore[assignment]
        learner = Learner(LearnerConfig(dim=2, algorithm=algorithm))
        learner.learn_many(np.eye(2)[[0, 0, 1, 1]], ["a", "a", "b", "b"])
        learner.learn_one([0.0, 1.0], "b")
