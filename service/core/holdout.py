"""Held-out routing, the certification reservoir, and what PAC-Bayes needs of the stream.

A certificate of the served metric (:mod:`service.core.certificates`) must be computed on
samples the learner never saw. :class:`Holdout` sits in front of the learning loop and routes
each arriving sample either to the learner or to the **reservoir**:

* **Routing.** With ``holdout = rho > 0`` every sample draws exactly one uniform from the
  *routing* generator and is held out when it is below ``rho``; a caller may also flag samples
  held out (``learn_one(x, y, holdout=True)``, ``learn_many(X, y, holdout=mask)``: e.g. a
  separate labelled validation set). The decision never looks at ``x`` or ``y``. The routing
  generator is separate from the triplet generator and part of the state (its position is the
  number of routing draws, replayed with ``PCG64.advance`` on resume), so the learner's ``L``
  is bit for bit that of a learner fed only the non-held-out subsequence, and routing does not
  depend on batching. ``holdout = 0`` draws nothing.
* **Held-out samples** are not learned, not put in the buffer ``H`` (they would enter training
  triplets) and not fed to the threshold calibrator. They still count in ``version`` (the
  service numbers every logged sample) with their own outcome ``held_out``, so the outcome
  counts still sum to the version.
* **Reservoir**: a sliding window of the last ``holdout_window`` held-out samples (features
  after the model's ``normalize``, as the metric sees them, and their class keys): it follows
  the current distribution. Memory: ``holdout_window * dim * 8`` bytes at most (2.6 MB at the
  default 5000 and d = 64, 41 MB at d = 1024), allocated as it fills.
* **PAC-Bayes** (optional, ``pac_bayes_window > 0``; off by default because it keeps training
  samples): the prior centre is a frozen copy of ``L`` when the training stream (non-held-out
  samples) reaches ``pac_bayes_prefix`` samples (default 1000), and the bound set is a sliding
  window of the last ``pac_bayes_window`` training samples *after* that prefix (the service
  keeps no training samples otherwise). Memory: ``dim^2 * 8`` bytes for the prior plus
  ``pac_bayes_window * dim * 8`` for the window. Batches are split at the prefix so that the
  prior is ``L`` after exactly ``pac_bayes_prefix`` training samples, whatever the batching.

Everything is in ``to_state`` / ``from_state`` (arrays ``holdout``, ``pac_bayes_prior``,
``pac_bayes_window`` appear only when they hold something, so the state of a model that holds
nothing out is unchanged), and resuming gives the same reservoir, window, prior and ``L``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from service.core._validation import Array, check_matrix, check_metric
from service.core.calibration import Calibration, served_threshold
from service.core.certificates import Certificate, Method, NoHoldout, check_certificate_args
from service.core.certificates.held_out import certify_held_out
from service.core.certificates.pac_bayes import certify_pac_bayes
from service.core.update import OUTCOMES, StepResults

#: Outcome code of a sample routed to the reservoir (not learned).
HELD_OUT = OUTCOMES.index("held_out")

#: Largest reservoir / PAC-Bayes window (samples).
MAX_WINDOW = 100_000

#: The routing generator is this child of the model's seed (the triplet generator is the seed
#: itself), so the two streams of draws are independent.
_ROUTING_STREAM = 1

Flags = NDArray[np.bool_]


def _check_int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}: must be in [{lo}, {hi}], got {value}")
    return int(value)


class HoldoutSettings(Protocol):
    """What routing needs of a model's configuration (:class:`~service.core.config.
    LearnerConfig` has it; a protocol, since the configuration's module imports this one).

    >>> from service.core import LearnerConfig
    >>> settings: HoldoutSettings = LearnerConfig(dim=2, holdout=0.1)
    >>> settings.holdout, settings.holdout_window
    (0.1, 5000)
    """

    @property
    def dim(self) -> int: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def margin(self) -> float: ...
    @property
    def holdout(self) -> float: ...
    @property
    def holdout_window(self) -> int: ...
    @property
    def pac_bayes_prefix(self) -> int: ...
    @property
    def pac_bayes_window(self) -> int: ...


def check_holdout_config(
    holdout: Any, holdout_window: Any, pac_bayes_prefix: Any, pac_bayes_window: Any
) -> tuple[float, int, int, int]:
    """The four held-out settings of :class:`~service.core.config.LearnerConfig`, validated.

    ``holdout`` in [0, 0.5] (the fraction of samples routed to the reservoir: at most half,
    the learner must keep learning), ``holdout_window`` in [1, 100000], ``pac_bayes_prefix``
    >= 1, ``pac_bayes_window`` in [0, 100000] (0: no PAC-Bayes bookkeeping).

    >>> check_holdout_config(0.1, 5000, 1000, 0)
    (0.1, 5000, 1000, 0)
    >>> check_holdout_config(0.7, 5000, 1000, 0)
    Traceback (most recent call last):
    ...
    ValueError: holdout: must be a number in [0, 0.5], got 0.7
    """
    try:
        rho = float(holdout)
    except (TypeError, ValueError):
        raise ValueError(f"holdout: must be a number in [0, 0.5], got {holdout!r}") from None
    if isinstance(holdout, bool) or not 0.0 <= rho <= 0.5:  # NaN fails too
        raise ValueError(f"holdout: must be a number in [0, 0.5], got {holdout!r}")
    return (
        rho,
        _check_int(holdout_window, "holdout_window", 1, MAX_WINDOW),
        _check_int(pac_bayes_prefix, "pac_bayes_prefix", 1, 2**62),
        _check_int(pac_bayes_window, "pac_bayes_window", 0, MAX_WINDOW),
    )


def check_flags(value: Any, n: int, name: str = "holdout") -> Flags | None:
    """``None`` (nothing flagged), or ``n`` booleans: one boolean applies to every sample.

    >>> check_flags(None, 3) is None, check_flags(False, 3) is None, check_flags(True, 2).tolist()
    (True, True, [True, True])
    >>> check_flags([1, 0], 2)
    Traceback (most recent call last):
    ...
    ValueError: holdout: expected booleans, got dtype int64
    """
    if value is None:
        return None
    if isinstance(value, bool | np.bool_):
        return np.ones(n, dtype=np.bool_) if value else None
    flags = np.asarray(value)
    if flags.dtype != np.bool_:
        raise ValueError(f"{name}: expected booleans, got dtype {flags.dtype}")
    if flags.shape != (n,):
        raise ValueError(f"{name}: expected {n} booleans, got shape {flags.shape}")
    return flags


class SampleWindow:
    """The last ``capacity`` samples and their class keys: a ring buffer allocated as it fills.

    >>> w = SampleWindow(capacity=3, dim=1)
    >>> w.extend(np.array([[1.0], [2.0]]), ["a", "b"])
    >>> w.extend(np.array([[3.0], [4.0]]), ["b", "c"])
    >>> X, labels, classes = w.samples()
    >>> X.ravel().tolist(), labels.tolist(), classes, len(w), w.total
    ([2.0, 3.0, 4.0], [0, 0, 1], ['b', 'c'], 3, 4)
    """

    def __init__(self, capacity: int, dim: int) -> None:
        self.capacity = capacity
        self.dim = dim
        self.total = 0  # samples ever added; the ring position is total % capacity
        self._rows: Array = np.empty((0, dim))
        self._codes = np.empty(0, dtype=np.int64)
        self._keys: list[str] = []  # code -> class key (compacted when it outgrows the window)
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return min(self.total, self.capacity)

    def _code(self, key: str) -> int:
        code = self._index.get(key)
        if code is None:
            code = self._index[key] = len(self._keys)
            self._keys.append(key)
        return code

    def extend(self, X: Array, keys: Sequence[str]) -> None:
        """Append rows (oldest first); only the newest ``capacity`` survive."""
        n = len(keys)
        codes = np.fromiter((self._code(k) for k in keys), dtype=np.int64, count=n)
        if n > self.capacity:
            self.total += n - self.capacity
            X, codes, n = X[n - self.capacity :], codes[n - self.capacity :], self.capacity
        self._reserve(min(len(self) + n, self.capacity))
        slots = (self.total + np.arange(n)) % self.capacity
        self._rows[slots] = X
        self._codes[slots] = codes
        self.total += n
        if len(self._keys) > 2 * self.capacity:  # classes that left the window: forget them
            live = np.unique(self._codes[: len(self)])
            remap = np.zeros(len(self._keys), dtype=np.int64)
            remap[live] = np.arange(len(live))
            self._codes[: len(self)] = remap[self._codes[: len(self)]]
            self._keys = [self._keys[int(c)] for c in live]
            self._index = {k: i for i, k in enumerate(self._keys)}

    def _reserve(self, rows: int) -> None:
        """Grow the arrays (doubling, up to ``capacity``); before the first wrap-around the
        rows are in order, so a prefix copy keeps them."""
        if rows > len(self._rows):
            size = min(self.capacity, max(rows, 2 * len(self._rows)))
            grown = np.empty((size, self.dim))
            grown[: len(self._rows)] = self._rows
            codes = np.empty(size, dtype=np.int64)
            codes[: len(self._codes)] = self._codes
            self._rows, self._codes = grown, codes

    def _ordered(self) -> tuple[Array, NDArray[np.int64]]:
        n = len(self)
        if self.total <= self.capacity:
            return self._rows[:n], self._codes[:n]
        start = self.total % self.capacity
        return np.roll(self._rows, -start, axis=0), np.roll(self._codes, -start)

    def samples(self) -> tuple[Array, NDArray[np.int64], list[str]]:
        """Copies of the rows (oldest first), their class codes and the class keys; codes
        number the classes in order of first appearance in the window (a canonical form: the
        same window always gives the same codes)."""
        rows, codes = self._ordered()
        uniq, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        order = np.argsort(first)
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[order] = np.arange(len(uniq))
        classes = [self._keys[int(c)] for c in uniq[order]]
        labels: NDArray[np.int64] = rank[inverse].astype(np.int64)
        return np.array(rows, dtype=np.float64), labels, classes

    def to_state(self) -> tuple[Array, dict[str, Any]]:
        rows, labels, classes = self.samples()
        return rows, {"total": self.total, "classes": classes, "labels": labels.tolist()}

    @classmethod
    def from_state(
        cls, capacity: int, dim: int, rows: Any, meta: dict[str, Any], name: str
    ) -> SampleWindow:
        """Inverse of :meth:`to_state`; ValueError naming ``name`` if it is inconsistent."""
        window = cls(capacity, dim)
        total = int(meta["total"])
        classes = [str(k) for k in meta["classes"]]
        labels = np.asarray(meta["labels"], dtype=np.int64)
        n = min(total, capacity)
        if n and rows is None:
            raise ValueError(f"{name}: the state has no rows for its {n} samples")
        X = check_matrix(np.asarray(rows).reshape(-1, dim), dim, name) if n else np.empty((0, dim))
        in_range = n == 0 or 0 <= labels.min() <= labels.max() < len(classes)
        if not (len(X) == n == len(labels) and in_range):
            raise ValueError(f"{name}: rows, labels and count do not match")
        window._keys = classes
        window._index = {k: i for i, k in enumerate(classes)}
        window._reserve(n)
        slots = (total - n + np.arange(n)) % capacity
        window._rows[slots] = X
        window._codes[slots] = labels
        window.total = total
        return window


class Holdout:
    """Routes samples to the learner or the reservoir and keeps what certificates need.

    The :class:`~service.core.learner.Learner` owns one (``learner.holdout``) and calls
    :meth:`route` with its own learning step; :meth:`certificate` certifies a metric.

    >>> from service.core import Learner, LearnerConfig
    >>> learner = Learner(LearnerConfig(dim=2, holdout=0.5, seed=0))
    >>> X = np.random.default_rng(0).normal(size=(400, 2))
    >>> outcomes = learner.learn_many(X, [i % 4 for i in range(400)]).counts()
    >>> outcomes["held_out"] == len(learner.holdout.reservoir) == 400 - learner.holdout.trained
    True
    """

    def __init__(self, config: HoldoutSettings, normalize: Callable[[Array], Array]) -> None:
        self.config = config
        self._normalize = normalize
        self._bits = np.random.PCG64(
            np.random.SeedSequence(config.seed, spawn_key=(_ROUTING_STREAM,))
        )
        self._rng = np.random.Generator(self._bits)
        self._routed = 0  # routing draws so far
        self._active = config.holdout > 0.0 or config.pac_bayes_window > 0
        #: Non-held-out samples so far (the training stream).
        self.trained = 0
        #: The certification reservoir: the latest held-out samples.
        self.reservoir = SampleWindow(config.holdout_window, config.dim)
        #: PAC-Bayes: ``L`` after ``pac_bayes_prefix`` training samples (None before, or off).
        self.prior: Array | None = None
        #: PAC-Bayes: the latest training samples after the prefix (the bound set).
        self.bound_window = SampleWindow(max(config.pac_bayes_window, 1), config.dim)

    @property
    def tracking(self) -> bool:
        """Whether the PAC-Bayes prior and bound window are kept."""
        return self.config.pac_bayes_window > 0

    def route(
        self,
        X: Array,
        keys: list[str],
        flags: Flags | None,
        learn: Callable[[Array, list[str]], StepResults],
        metric: Callable[[], Array],
    ) -> tuple[StepResults, int]:
        """Learn the rows that are not held out (in order, through ``learn``) and keep the
        others in the reservoir; the results (held-out rows get the outcome ``held_out``) and
        how many were held out. ``metric`` returns the current ``L`` (read when the prefix
        ends)."""
        n = len(keys)
        if flags is None and not self._active:  # the common case: nothing to route or keep
            self.trained += n
            return learn(X, keys), 0
        held = flags
        if self.config.holdout > 0.0:
            routed = self._rng.random(n) < self.config.holdout  # one draw per sample
            self._routed += n
            held = routed if flags is None else routed | flags
        if held is None or not held.any():
            if not self.tracking:
                self.trained += n
                return learn(X, keys), 0
            held = np.zeros(n, dtype=np.bool_)
        codes = np.full(n, HELD_OUT, dtype=np.int64)
        values = np.full((n, 4), np.nan)
        if held.any():
            where = np.flatnonzero(held)
            self.reservoir.extend(self._normalize(X[where]), [keys[i] for i in where])
        train = np.flatnonzero(~held)
        Xt = X[train] if held.any() else X
        kt = [keys[i] for i in train]
        # Learn in two parts when the prefix ends inside this batch, to read L right there.
        cfg = self.config
        cut = cfg.pac_bayes_prefix - self.trained
        bounds = [0, cut, len(kt)] if self.tracking and 0 < cut < len(kt) else [0, len(kt)]
        for lo, hi in itertools.pairwise(bounds):
            if hi > lo:
                r = learn(Xt[lo:hi], kt[lo:hi])
                codes[train[lo:hi]] = r.codes
                values[train[lo:hi]] = r.values
                self.trained += hi - lo
                if self.tracking and self.prior is None and self.trained >= cfg.pac_bayes_prefix:
                    self.prior = np.array(metric(), dtype=np.float64)
        if self.tracking:
            after = max(0, len(kt) - (self.trained - cfg.pac_bayes_prefix))
            if after < len(kt):
                self.bound_window.extend(self._normalize(Xt[after:]), kt[after:])
        return StepResults(codes, values), n - len(kt)

    # -- certificates ------------------------------------------------------------------------

    def certificate(
        self,
        L: Array,
        calibration: Calibration,
        delta: float = 0.05,
        method: Method = "binomial",
        threshold: float | None = None,
        version: int | None = None,
        margin: float | None = None,
    ) -> Certificate:
        """Certify ``L`` at ``threshold`` (default: the served one, see
        :func:`~service.core.calibration.served_threshold`; ``margin``: its last fallback in
        input units, default ``config.margin``, the learner passes its scaled one).

        ``"binomial"`` / ``"kl"`` use the reservoir and certify the served metric;
        ``"pac-bayes"`` uses the prefix prior and the bound window and certifies the Gibbs
        metric around ``L``. ValueError for a bad ``delta`` / ``method`` / ``threshold`` or
        when the tool is not configured; :class:`~service.core.certificates.NotEnoughHeldOut`
        when there are too few samples yet.
        """
        if self.config.algorithm == "brm":
            # The certificates count errors of ||L(a - b)||^2; a brm model decides on D_R^2,
            # which is not a function of it (service.core.brm): a bound on the other
            # distance would be no bound on what the model serves.
            raise ValueError(
                "algorithm: certificates are not available for 'brm' (they bound decisions "
                "on ||L(a - b)||^2, a brm model decides on the restricted distance)"
            )
        delta, method = check_certificate_args(delta, method)
        margin = self.config.margin if margin is None else margin
        theta, source = served_threshold(calibration, margin, threshold)
        seed = self.config.seed
        if method == "pac-bayes":
            if not self.tracking:
                raise ValueError(
                    "method: 'pac-bayes' needs a model configured with pac_bayes_window > 0 "
                    "(it keeps the training samples after the prefix as its bound set)"
                )
            X, labels, _ = self.bound_window.samples()
            return certify_pac_bayes(
                L,
                self.prior,
                X,
                labels,
                theta,
                source,
                delta=delta,
                seed=seed,
                version=version,
                prefix=self.config.pac_bayes_prefix,
                trained=self.trained,
                window=self.config.pac_bayes_window,
                stream=self.bound_window.total,
            )
        if self.config.holdout == 0.0 and not self.reservoir.total:
            raise NoHoldout(
                "holdout: this model holds no samples out (holdout = 0 and none flagged): "
                "configure holdout > 0, or flag held-out samples with learn_many(..., "
                "holdout=mask)"
            )
        X, labels, _ = self.reservoir.samples()
        return certify_held_out(
            L,
            X,
            labels,
            theta,
            source,
            delta=delta,
            method=method,
            seed=seed,
            version=version,
            window=self.config.holdout_window,
            stream=self.reservoir.total,
        )

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> tuple[dict[str, Array], dict[str, Any]]:
        """Arrays (only those that hold something) and JSON-safe metadata."""
        arrays: dict[str, Array] = {}
        rows, reservoir = self.reservoir.to_state()
        if len(rows):
            arrays["holdout"] = rows
        meta: dict[str, Any] = {
            "routed": self._routed,
            "trained": self.trained,
            "reservoir": reservoir,
        }
        if self.tracking:
            rows, window = self.bound_window.to_state()
            if len(rows):
                arrays["pac_bayes_window"] = rows
            if self.prior is not None:
                arrays["pac_bayes_prior"] = self.prior.copy()
            meta["pac_bayes_window"] = window
        return arrays, meta

    def restore(self, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
        """Load :meth:`to_state` output (ValueError if it is inconsistent)."""
        cfg = self.config
        self._routed = int(meta["routed"])
        self._bits.advance(self._routed)  # one 64-bit step per uniform drawn
        self.trained = int(meta["trained"])
        self.reservoir = SampleWindow.from_state(
            cfg.holdout_window, cfg.dim, arrays.get("holdout"), meta["reservoir"], "holdout"
        )
        if self.tracking:
            self.bound_window = SampleWindow.from_state(
                cfg.pac_bayes_window,
                cfg.dim,
                arrays.get("pac_bayes_window"),
                meta["pac_bayes_window"],
                "pac_bayes_window",
            )
            past_prefix = self.trained >= cfg.pac_bayes_prefix
            if past_prefix != ("pac_bayes_prior" in arrays):
                raise ValueError("pac_bayes_prior: present if and only if the prefix has passed")
            if past_prefix:
                prior = check_metric(arrays["pac_bayes_prior"], cfg.dim, "pac_bayes_prior")
                self.prior = np.array(prior, dtype=np.float64)
