"""Operating points: the verification threshold for a target error rate, certified.

A user asks "which threshold gives me at most 1 false accept in 1,000, and how sure are you?".
This module answers with a threshold whose false-accept rate (or false-reject rate) is
*certified* to be at most the target, from samples the learner never saw (the held-out
reservoir of :mod:`service.core.holdout`), in the form of the certificates
(:mod:`service.core.certificates`). For a target ``far``:

    With probability at least ``1 - delta`` over the held-out samples, for the served metric
    ``L`` at version ``v``, the chosen threshold ``theta`` satisfies ``FAR(L, theta) <= far``
    and ``FRR(L, theta) <= frr_bound``. Assumes an exchangeable (i.i.d., no drift) labelled
    stream and a metric and grid not chosen using these held-out samples; the rates are
    averages over the class mix of the pairs (every class in proportion to its held-out
    samples, paired with a random other class).

For a target ``frr`` the roles of the two rates swap. ``delta`` is split in two halves, one
per rate:

* **The grid is fixed before any held-out error is looked at.** Its thresholds ``t_1 < t_2 <
  ...`` come from the calibration window (distances the learner measured on its own training
  stream, which holds no held-out sample): quantiles of its negative distances (fine steps
  where false accepts are rare), quantiles of its positive distances (fine steps where false
  rejects are rare), a geometric grid spanning them (and a factor 4 beyond), and ``0``.
* **The target's rate: fixed-sequence testing, at ``delta / 2``.** For ``far``, the
  hypotheses ``H_j: FAR(t_j) > far`` are tested in ascending order, each by one exact bound at
  ``delta / 2`` (no division by the grid's size): ``H_j`` is rejected when the upper bound of
  ``FAR(t_j)`` is at most ``far``; the walk stops at the first ``H_j`` kept, and the last
  rejected ``t_j`` is chosen. The bound grows with the threshold (more false accepts), so this
  is the largest grid threshold whose single bound is at most ``far``. *Why it is valid:*
  ``FAR`` is nondecreasing in the threshold, so let ``t_{j*}`` be the first grid threshold
  with ``FAR(t_{j*}) > far`` (fixed by the metric and the grid, not by the held-out errors).
  Choosing ``t_{j*}`` or beyond requires rejecting ``H_{j*}``, i.e. the one bound at
  ``t_{j*}`` falling below its true rate: probability at most ``delta / 2``. Otherwise the
  choice is below ``t_{j*}``, where ``FAR <= far``.
* **What is reported for the target's rate.** The certified statement is ``FAR(theta) <=
  far``, so ``far_bound`` *is* ``far``. The single bound at the chosen threshold is smaller,
  but it is not a valid bound there: the threshold was chosen because that bound was small
  (reporting it would need the union over the grid this design avoids). ``far_estimate`` is
  the held-out ``k/m``, as ever.
* **The other rate: a union bound over the grid, at ``delta / 2``.** ``FRR`` at every grid
  threshold is bounded at ``delta / (2 |G|)``, so all these bounds hold together and the
  data-dependent choice may read its own: ``frr_bound`` is valid at ``theta`` whichever it is.
  Together (a union of the two halves' failures) both statements hold with probability at
  least ``1 - delta``.
* **Pairs.** Disjoint positive pairs and disjoint negative pairs, each kind from all the
  held-out samples (:func:`~service.core.certificates.tuples.build_pairs`, labels and a seeded
  generator only), so within a kind the errors are independent given the labels, and ``k``
  errors in ``m`` pairs give Langford's ``Bin^{-1}(m, k, delta')`` (exact; valid for pairs
  with different means at ``delta' <= 0.1``, hence ``delta <= 0.2`` here) or its Chernoff
  relaxation ``kl^{-1}`` (:func:`~service.core.certificates.held_out.upper_bound`).

The price of certifying is the bound's gap above the estimate: ``ln(2 / delta)`` nats for the
target's rate (3.7 at ``delta = 0.05``; a union bound over the ``|G|`` thresholds would cost
``ln(2 |G| / delta)``, about 9.5), and ``ln(2 |G| / delta)`` for the other rate. For ``far``
the chosen threshold is the largest passing the test, i.e. the one with the lowest
false-reject estimate among those the test certifies; for ``frr``, symmetrically (descending
thresholds, the lowest false-accept rate). Nothing passes when there are too few negative
(positive) pairs: with zero errors ``m`` pairs bound a rate by ``1 - (delta/2)^(1/m)``, so
about ``ln(2 / delta) / far`` pairs, twice as many held-out samples, are needed;
:class:`~service.core.certificates.NotEnoughHeldOut` says how many more. ``0`` is on the
grid, so enough negatives always certify some threshold.

A ``brm`` model decides on its restricted distance ``D_R^2`` (:mod:`service.core.brm`; its
calibration window is in those units too): its operating points are certified in ``D_R^2``.

The ROC (:func:`roc`) reports all its points at once, so it keeps the union bound: ``N``
thresholds fixed by the calibration window (quantiles of its pooled distances), evaluated on
the same pairs, with bounds holding together over the ``N`` points (``delta / (2N)`` each),
and the window's own (uncertified, training-stream) estimates beside them.

Use::

    pairs = held_out_pairs(L, X, labels, window, algorithm="opml", seed=0, stream=n, version=v)
    point = operating_point(pairs, far=0.001)        # or frr=...
    point.threshold, point.far_bound                  # same <=> d <= threshold
    curve = roc(pairs, points=20)

Cost: one ``n x d x d`` product for the pair distances (done once per snapshot and cached by the
service), then ``O(|G| log n)`` per target.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from service.core._validation import Array
from service.core.brm import restricted_squared_norms
from service.core.certificates import (
    BINOMIAL_MAX_DELTA,
    CLASS_MIX,
    Method,
    NotEnoughHeldOut,
    check_metric_and_samples,
)
from service.core.certificates.bounds import bin_inv_upper, kl_inv_upper
from service.core.certificates.tuples import MIN_TUPLES, build_pairs

Kind = Literal["far", "frr"]

#: Grid resolution: geometric thresholds spanning the window's distances, and quantile levels of
#: its negative (positive) distances in ``[1/n, 1/2]`` (in ``[1/2, 1 - 1/n]``).
GEOMETRIC_POINTS = 192
QUANTILE_POINTS = 64
#: Largest number of ROC points.
MAX_ROC_POINTS = 1000
#: Confidence parameter of the answers unless asked otherwise.
DEFAULT_DELTA = 0.05

#: The generator that forms the pairs is this child of the model's seed (the certificates'
#: tuples use stream 2, routing stream 1).
_PAIRS_STREAM = 3


def check_target(value: Any, name: str) -> float:
    """A target rate in (0, 0.5); ValueError naming ``name`` otherwise.

    >>> check_target(0.01, "far")
    0.01
    >>> check_target(0.5, "frr")
    Traceback (most recent call last):
    ...
    ValueError: frr: must be a number in (0, 0.5), got 0.5
    """
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a number in (0, 0.5), got {value!r}") from None
    if isinstance(value, bool) or not 0.0 < x < 0.5:  # NaN fails too
        raise ValueError(f"{name}: must be a number in (0, 0.5), got {value!r}")
    return x


def check_delta(value: Any, method: Any = "binomial") -> tuple[float, Method]:
    """``delta`` in (0, 1) and a held-out ``method`` (``binomial`` or ``kl``).

    >>> check_delta(0.05)
    (0.05, 'binomial')
    """
    if method not in ("binomial", "kl"):
        raise ValueError(f"method: an operating point is 'binomial' or 'kl', got {method!r}")
    try:
        d = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"delta: must be a number in (0, 1), got {value!r}") from None
    if isinstance(value, bool) or not 0.0 < d < 1.0:
        raise ValueError(f"delta: must be a number in (0, 1), got {value!r}")
    return d, method


def check_operating_point(value: Any) -> str | dict[str, float]:
    """A model's ``operating_point``: ``"eer"``, ``{"far": x}`` or ``{"frr": x}`` (x in
    (0, 0.5)); the canonical form, or ValueError naming ``operating_point``.

    >>> check_operating_point("eer"), check_operating_point({"far": 0.001})
    ('eer', {'far': 0.001})
    >>> check_operating_point({"far": 0.1, "frr": 0.1})
    Traceback (most recent call last):
    ...
    ValueError: operating_point: must be "eer", {"far": x} or {"frr": x}, got {'far': 0.1, \
'frr': 0.1}
    """
    if value == "eer":
        return "eer"
    if isinstance(value, dict) and len(value) == 1:
        ((kind, target),) = value.items()
        if kind in ("far", "frr"):
            try:
                return {kind: check_target(target, kind)}
            except ValueError as exc:
                raise ValueError(f"operating_point: {exc}") from None
    raise ValueError(f'operating_point: must be "eer", {{"far": x}} or {{"frr": x}}, got {value!r}')


# -- the held-out pairs -----------------------------------------------------------------------


@dataclass(frozen=True)
class HeldOutPairs:
    """What every operating point and ROC of one snapshot is computed from: the sorted
    distances of the held-out negative and positive pairs under the frozen metric, the sorted
    distances of the calibration window, and the grid of candidate thresholds (from the window
    only).

    ``distance`` is ``"squared"`` (``||L(a - b)||^2``, Eq. 2) or ``"restricted"`` (``D_R^2``,
    a ``brm`` model). A distance that overflowed is counted as an error of its kind
    (conservative): ``-inf`` among the negatives, ``+inf`` among the positives.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 4, 2000)
    >>> X = 3.0 * np.eye(4)[y] + rng.normal(size=(2000, 4))
    >>> window = np.column_stack([rng.chisquare(4, 500) * 2, rng.chisquare(4, 500) * 2 + 18])
    >>> p = held_out_pairs(np.eye(4), X, y, window)
    >>> len(p.negatives), len(p.positives), float(p.grid[0]), p.distance
    (998, 999, 0.0, 'squared')
    """

    negatives: Array
    positives: Array
    window_negatives: Array
    window_positives: Array
    grid: Array
    samples: int
    classes: int
    version: int | None
    distance: Literal["squared", "restricted"]

    def counts(self, thresholds: Array) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Per threshold: false accepts (negatives ``<= theta``) and false rejects (positives
        ``> theta``) among the held-out pairs."""
        fa = np.searchsorted(self.negatives, thresholds, side="right")
        fr = len(self.positives) - np.searchsorted(self.positives, thresholds, side="right")
        return fa.astype(np.int64), fr.astype(np.int64)

    def window_rates(self, thresholds: Array) -> tuple[Array, Array]:
        """The calibration window's own estimates at ``thresholds`` (NaN: empty window)."""
        nn, npos = len(self.window_negatives), len(self.window_positives)
        fa = np.searchsorted(self.window_negatives, thresholds, side="right")
        fr = npos - np.searchsorted(self.window_positives, thresholds, side="right")
        far: Array = fa / nn if nn else np.full(len(thresholds), np.nan)
        frr: Array = fr / npos if npos else np.full(len(thresholds), np.nan)
        return far, frr


def _pair_distances(L: Array, X: Array, pairs: NDArray[np.int64], restricted: bool) -> Array:
    """The distance of each pair under ``L`` (as a verify computes it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        Z = (X[pairs[:, 0]] - X[pairs[:, 1]]) @ L.T
        if restricted:
            out: Array = restricted_squared_norms(np.abs(Z))
        else:
            out = np.einsum("ij,ij->i", Z, Z)
    return out


def candidate_grid(window: Array) -> Array:
    """The candidate thresholds: a function of the calibration window alone (rows ``(d_pos,
    d_neg)``), fixed before any held-out pair is looked at (see the module docstring).

    >>> g = candidate_grid(np.array([[1.0, 4.0], [2.0, 8.0], [1.5, 6.0]]))
    >>> bool(g[0] == 0.0), bool(np.all(np.diff(g) > 0)), bool(g[-1] >= 32.0)
    (True, True, True)
    """
    pairs = np.asarray(window, dtype=np.float64).reshape(-1, 2)
    pos = np.sort(pairs[np.isfinite(pairs[:, 0]), 0])
    neg = np.sort(pairs[np.isfinite(pairs[:, 1]), 1])
    everything = np.concatenate([pos, neg])
    positive = everything[everything > 0.0]
    if not len(positive):
        raise ValueError(
            "calibration: the window holds no positive distance yet, and the candidate "
            "thresholds come from it (they must not come from the held-out samples): learn "
            "some samples first"
        )
    parts = [
        np.zeros(1),
        np.geomspace(positive.min() / 4.0, positive.max() * 4.0, GEOMETRIC_POINTS),
    ]
    if len(neg):
        levels = np.geomspace(1.0 / len(neg), 0.5, QUANTILE_POINTS)
        parts.append(np.quantile(neg, levels))
    if len(pos):
        levels = 1.0 - np.geomspace(1.0 / len(pos), 0.5, QUANTILE_POINTS)
        parts.append(np.quantile(pos, levels))
    grid: Array = np.unique(np.concatenate(parts))
    return grid


def held_out_pairs(
    L: Any,
    X: Any,
    labels: Any,
    window: Any,
    *,
    algorithm: str = "opml",
    seed: int = 0,
    stream: int = 0,
    version: int | None = None,
) -> HeldOutPairs:
    """Evaluate the frozen metric ``L`` on disjoint held-out pairs (``X``: the held-out samples
    as the metric sees them, normalised; ``labels``: their class codes; ``window``: the
    calibration window's rows ``(d_pos, d_neg)``). ``stream`` (samples that ever entered the
    reservoir) and ``seed`` fix the pairs, so one snapshot always gives the same ones.

    ValueError when the window is empty; :class:`NotEnoughHeldOut` when there are fewer than
    ten pairs of a kind.
    """
    Lm, Xs, codes = check_metric_and_samples(L, X, labels)
    grid = candidate_grid(window)
    pairs = np.asarray(window, dtype=np.float64).reshape(-1, 2)
    rng = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(_PAIRS_STREAM, stream)))
    )
    pos_pairs, neg_pairs = build_pairs(codes, rng)
    n, classes = len(Xs), len(np.unique(codes))
    fewest = min(len(pos_pairs), len(neg_pairs))
    if fewest < MIN_TUPLES:
        total = max(4 * MIN_TUPLES, math.ceil(n * MIN_TUPLES / fewest) if fewest else 2 * max(n, 1))
        needed = max(total - n, 1)
        detail = " of at least two classes, each with two samples or more" if classes < 2 else ""
        raise NotEnoughHeldOut(
            needed,
            n,
            f"not enough held-out samples: {n} form {len(neg_pairs)} negative and "
            f"{len(pos_pairs)} positive pairs, an operating point needs {MIN_TUPLES} of each; "
            f"about {needed} more{detail} are needed",
        )
    restricted = algorithm == "brm"
    neg = _pair_distances(Lm, Xs, neg_pairs, restricted)
    pos = _pair_distances(Lm, Xs, pos_pairs, restricted)
    neg = np.sort(np.where(np.isnan(neg), -np.inf, neg))  # an unknown distance: an error
    pos = np.sort(np.where(np.isnan(pos), np.inf, pos))
    return HeldOutPairs(
        negatives=neg,
        positives=pos,
        window_negatives=np.sort(pairs[np.isfinite(pairs[:, 1]), 1]),
        window_positives=np.sort(pairs[np.isfinite(pairs[:, 0]), 0]),
        grid=grid,
        samples=n,
        classes=classes,
        version=version,
        distance="restricted" if restricted else "squared",
    )


# -- bounds -----------------------------------------------------------------------------------


def _upper(m: int, k: NDArray[np.int64], delta: float, method: Method) -> Array:
    """Upper bounds of ``k`` errors in ``m`` pairs, each at ``delta`` (vectorised)."""
    if method == "binomial":
        return bin_inv_upper(m, k, delta)
    return kl_inv_upper(k / m, math.log(1.0 / delta) / m)


def pairs_needed(target: float, delta: float) -> int:
    """Fewest pairs whose bound at zero errors is at most ``target``: ``1 - delta^(1/m) <=
    target``, i.e. ``m >= ln(delta) / ln(1 - target)`` (about ``ln(1/delta) / target``). An
    operating point tests its target's rate once, at ``delta / 2`` of the answer's ``delta``:

    >>> pairs_needed(0.01, 0.05 / 2), pairs_needed(0.001, 0.05 / 2)
    (368, 3688)
    """
    return math.ceil(math.log(delta) / math.log1p(-target) - 1e-9)


@dataclass(frozen=True)
class OperatingPoint:
    """A threshold chosen for a target rate, with its certified and estimated rates.

    ``kind`` is the target's rate (``"far"`` or ``"frr"``); ``far_estimate`` / ``frr_estimate``
    the held-out rates at ``threshold`` (``k/m`` among ``negatives`` / ``positives`` pairs).
    ``far_bound`` / ``frr_bound``: the certified upper bounds at ``threshold``, holding together
    with probability >= ``1 - delta``. The target's own bound is the target (the certified
    statement of the fixed-sequence test; module docstring), the other rate's is its union
    bound over the ``grid`` thresholds (``delta / (2 grid)`` each). ``window_far`` /
    ``window_frr``: the calibration window's estimates (training stream, not certified; None:
    empty window). ``distance``: the distance ``threshold`` applies to.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 4, 4000)
    >>> X = 3.0 * np.eye(4)[y] + rng.normal(size=(4000, 4))
    >>> window = np.column_stack([rng.chisquare(4, 500) * 2, rng.chisquare(4, 500) * 2 + 18])
    >>> p = operating_point(held_out_pairs(np.eye(4), X, y, window), far=0.05)
    >>> p.kind, p.far_bound, p.far_estimate < p.far_bound, p.frr_estimate <= p.frr_bound
    ('far', 0.05, True, True)
    >>> sorted(p.to_dict())[:5]
    ['delta', 'distance', 'far_bound', 'far_estimate', 'frr_bound']
    """

    kind: Kind
    target: float
    threshold: float
    far_estimate: float
    far_bound: float
    frr_estimate: float
    frr_bound: float
    negatives: int
    positives: int
    delta: float
    version: int | None
    method: Method
    grid: int
    distance: str
    window_far: float | None
    window_frr: float | None
    statement: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: plain numbers and strings."""
        return asdict(self)


def _nan_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _last_rejected(passed: NDArray[np.bool_]) -> int:
    """Fixed-sequence testing: walk ``passed`` (a hypothesis rejected per position, in the
    order fixed beforehand) while it holds; the last position rejected, or -1 for none."""
    kept = np.flatnonzero(~passed)
    return (int(kept[0]) if len(kept) else len(passed)) - 1


def operating_point(
    pairs: HeldOutPairs,
    *,
    far: float | None = None,
    frr: float | None = None,
    delta: float = DEFAULT_DELTA,
    method: Method = "binomial",
) -> OperatingPoint:
    """The grid threshold certified by fixed-sequence testing for ``far`` (or ``frr``), with
    the lowest other error (module docstring). Exactly one of ``far`` / ``frr``.

    ValueError for bad arguments; :class:`NotEnoughHeldOut` (``needed`` more held-out samples
    on top of ``have``) when too few pairs can certify the target, or ValueError naming the
    target when no grid threshold reaches it with the pairs there are (a target the metric
    cannot meet).
    """
    if (far is None) == (frr is None):
        raise ValueError("far: give exactly one of far and frr")
    kind: Kind = "far" if far is not None else "frr"
    target = check_target(far if far is not None else frr, kind)
    delta, method = check_delta(delta, method)
    if method == "binomial" and delta / 2 > BINOMIAL_MAX_DELTA:
        raise ValueError(
            f"delta: the exact binomial inversion is valid for non-identical pairs up to "
            f"{BINOMIAL_MAX_DELTA:g} per rate, and an operating point spends delta/2 on each: "
            f"at most {2 * BINOMIAL_MAX_DELTA:g}, got {delta!r}; use method='kl'"
        )
    grid = pairs.grid
    test_share, union_share = delta / 2, delta / (2 * len(grid))
    fa, fr = pairs.counts(grid)
    m_neg, m_pos = len(pairs.negatives), len(pairs.positives)
    if kind == "far":  # ascending thresholds: FAR grows
        j = _last_rejected(_upper(m_neg, fa, test_share, method) <= target)
        m, errors = m_neg, fa
    else:  # descending thresholds: FRR grows
        j = len(grid) - 1 - _last_rejected((_upper(m_pos, fr, test_share, method) <= target)[::-1])
        j = -1 if j == len(grid) else j
        m, errors = m_pos, fr
    if j < 0:
        _refuse(pairs, kind, target, test_share, m, int(errors.min()))
    theta = float(grid[j])
    k_fa, k_fr = fa[j : j + 1], fr[j : j + 1]
    if kind == "far":
        far_bound, frr_bound = target, float(_upper(m_pos, k_fr, union_share, method)[0])
    else:
        far_bound, frr_bound = float(_upper(m_neg, k_fa, union_share, method)[0]), target
    wfar, wfrr = pairs.window_rates(np.array([theta]))
    point = OperatingPoint(
        kind=kind,
        target=target,
        threshold=theta,
        far_estimate=int(k_fa[0]) / m_neg,
        far_bound=far_bound,
        frr_estimate=int(k_fr[0]) / m_pos,
        frr_bound=frr_bound,
        negatives=m_neg,
        positives=m_pos,
        delta=delta,
        version=pairs.version,
        method=method,
        grid=len(grid),
        distance=pairs.distance,
        window_far=_nan_none(float(wfar[0])),
        window_frr=_nan_none(float(wfrr[0])),
        statement="",
    )
    return _with_statement(point, pairs)


def _with_statement(p: OperatingPoint, pairs: HeldOutPairs) -> OperatingPoint:
    at = "" if p.version is None else f" at version {p.version}"
    if p.kind == "far":
        rate, other, order = "false accept", "false reject", "ascending"
    else:
        rate, other, order = "false reject", "false accept", "descending"
    text = (
        f"Threshold {p.threshold:.6g} on the {p.distance} distance: of a grid of {p.grid} "
        f"thresholds fixed from the calibration window, the last one in {order} order whose "
        f"{rate} rate passes a single test at delta/2 against {p.target:g}. With probability at "
        f"least {1 - p.delta:.4g} over the {pairs.samples} held-out samples, for the served "
        f"metric{at}, false accept rate <= {p.far_bound:.4g} ({p.far_estimate * p.negatives:.0f}"
        f" errors in {p.negatives} negative pairs) and false reject rate <= {p.frr_bound:.4g} "
        f"({p.frr_estimate * p.positives:.0f} errors in {p.positives} positive pairs): the "
        f"{rate} rate by fixed-sequence testing (delta/2), the {other} rate by a union bound "
        f"over the grid (each at delta/{2 * p.grid}). Assumes an exchangeable (i.i.d., no "
        f"drift) labelled stream and a metric not chosen using these held-out samples; "
        f"{CLASS_MIX}."
    )
    return OperatingPoint(**{**asdict(p), "statement": text})


def _refuse(pairs: HeldOutPairs, kind: Kind, target: float, share: float, m: int, k: int) -> None:
    """Raise why no grid threshold certifies ``target`` (its single test at ``share``): too
    few pairs (NotEnoughHeldOut, with how many more held-out samples), or a target the metric
    does not reach (ValueError)."""
    n = pairs.samples
    what = "negative" if kind == "far" else "positive"
    if k == 0 or k / m < target:
        rate = k / m
        need = pairs_needed(target, share)
        while (
            k
            and need < 10**9
            and float(bin_inv_upper(need, math.ceil(rate * need), share)) > target
        ):
            need *= 2  # more pairs at the observed best rate, until the bound fits
        more = max(math.ceil(n * need / m) - n, 1)
        raise NotEnoughHeldOut(
            more,
            n,
            f"not certifiable: {kind} <= {target:g} at delta {2 * share:g} needs about {need} "
            f"{what} pairs (at zero errors: ln(2/delta)/{kind}, the target tested once at "
            f"delta/2), the {n} held-out samples form {m}; about {more} more held-out samples "
            f"are needed",
        )
    raise ValueError(
        f"{kind}: no threshold of the grid reaches {kind} <= {target:g} on the held-out pairs "
        f"(the best has {k} errors in {m} {what} pairs): the metric does not separate the "
        f"classes that well; choose a larger target"
    )


# -- the ROC -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roc:
    """The held-out ROC of one snapshot: per threshold (ascending), the held-out estimates and
    their bounds (all holding together with probability >= ``1 - delta``: ``delta / (2N)``
    each), and the calibration window's estimates (None: empty window).

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 4, 2000)
    >>> X = 3.0 * np.eye(4)[y] + rng.normal(size=(2000, 4))
    >>> window = np.column_stack([rng.chisquare(4, 500) * 2, rng.chisquare(4, 500) * 2 + 18])
    >>> r = roc(held_out_pairs(np.eye(4), X, y, window), points=5)
    >>> len(r.points), [round(p["far_estimate"], 3) for p in r.points][:2]
    (5, [0.0, 0.044])
    """

    points: list[dict[str, float | None]]
    negatives: int
    positives: int
    delta: float
    version: int | None
    method: Method
    distance: str
    statement: str

    COLUMNS = (
        "threshold",
        "far_estimate",
        "far_bound",
        "frr_estimate",
        "frr_bound",
        "window_far",
        "window_frr",
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            "negatives": self.negatives,
            "positives": self.positives,
            "delta": self.delta,
            "version": self.version,
            "method": self.method,
            "distance": self.distance,
            "statement": self.statement,
        }

    def to_csv(self) -> str:
        """One header line, one line per point (empty cells for None)."""
        lines = [",".join(self.COLUMNS)]
        for p in self.points:
            lines.append(",".join("" if p[c] is None else repr(p[c]) for c in self.COLUMNS))
        return "\n".join(lines) + "\n"


def roc(
    pairs: HeldOutPairs, points: int = 20, delta: float = DEFAULT_DELTA, method: Method = "binomial"
) -> Roc:
    """``points`` thresholds at evenly spaced quantile levels (0 to 1) of the calibration
    window's pooled distances (fixed before the held-out pairs are looked at), evaluated on
    the held-out pairs; ValueError for bad arguments."""
    if isinstance(points, bool) or not isinstance(points, int | np.integer):
        raise ValueError(f"points: must be an integer in [2, {MAX_ROC_POINTS}], got {points!r}")
    if not 2 <= points <= MAX_ROC_POINTS:
        raise ValueError(f"points: must be an integer in [2, {MAX_ROC_POINTS}], got {points}")
    delta, method = check_delta(delta, method)
    pooled = np.concatenate([pairs.window_negatives, pairs.window_positives])
    thresholds = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, int(points))))
    share = delta / (2 * len(thresholds))
    fa, fr = pairs.counts(thresholds)
    m_neg, m_pos = len(pairs.negatives), len(pairs.positives)
    far_b, frr_b = _upper(m_neg, fa, share, method), _upper(m_pos, fr, share, method)
    wfar, wfrr = pairs.window_rates(thresholds)
    rows = [
        {
            "threshold": float(t),
            "far_estimate": int(a) / m_neg,
            "far_bound": float(ab),
            "frr_estimate": int(r) / m_pos,
            "frr_bound": float(rb),
            "window_far": _nan_none(float(wa)),
            "window_frr": _nan_none(float(wr)),
        }
        for t, a, ab, r, rb, wa, wr in zip(
            thresholds, fa, far_b, fr, frr_b, wfar, wfrr, strict=True
        )
    ]
    at = "" if pairs.version is None else f" at version {pairs.version}"
    statement = (
        f"With probability at least {1 - delta:.4g} over the {pairs.samples} held-out samples, "
        f"for the served metric{at}, every point's false accept and false reject rates are at "
        f"most their bounds together (each at delta/{2 * len(thresholds)}); thresholds are "
        f"quantiles of the calibration window, fixed before the held-out pairs are looked at. "
        f"Assumes an exchangeable (i.i.d., no drift) labelled stream; {CLASS_MIX}."
    )
    return Roc(
        points=rows,
        negatives=m_neg,
        positives=m_pos,
        delta=delta,
        version=pairs.version,
        method=method,
        distance=pairs.distance,
        statement=statement,
    )
