"""Operating points: thresholds certified for a target false-accept / false-reject rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.core import Learner, LearnerConfig, NotEnoughHeldOut
from service.core.calibration import in_order
from service.core.certificates.bounds import bin_inv_upper
from service.core.normalize import normalize_rows
from service.core.operating_points import (
    HeldOutPairs,
    candidate_grid,
    check_operating_point,
    held_out_pairs,
    operating_point,
    pairs_needed,
    roc,
)


def _pairs_of(learner: Learner):  # type: ignore[no-untyped-def]
    ring, count = learner.calibrator.ring()
    X, labels, _ = learner.holdout.reservoir.samples()
    return held_out_pairs(
        learner.L,
        X,
        labels,
        in_order(ring, count, learner.calibrator.window),
        algorithm=learner.config.algorithm,
        seed=learner.config.seed,
        stream=learner.holdout.reservoir.total,
        version=learner.version,
    )


class Gaussian:
    """Gaussian classes: ``classes`` means drawn once, unit noise around them."""

    def __init__(self, dim: int, classes: int, separation: float, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.means = self.rng.normal(size=(classes, dim)) * separation
        self.dim = dim

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        y = self.rng.integers(0, len(self.means), n)
        return self.means[y] + self.rng.normal(size=(n, self.dim)), y

    def fresh_pairs(self, learner: Learner, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Squared distances of ``n`` fresh negative and ``n`` fresh positive pairs."""
        classes = len(self.means)
        ya = self.rng.integers(0, classes, n)
        yb = (ya + self.rng.integers(1, classes, n)) % classes  # another class, uniformly
        noise = lambda: self.rng.normal(size=(n, self.dim))  # noqa: E731
        L, how = learner.L, learner.config.normalize

        def sq(A: np.ndarray, B: np.ndarray) -> np.ndarray:
            Z = (normalize_rows(A, how) - normalize_rows(B, how)) @ L.T
            return np.einsum("ij,ij->i", Z, Z)

        neg = sq(self.means[ya] + noise(), self.means[yb] + noise())
        pos = sq(self.means[ya] + noise(), self.means[ya] + noise())
        return neg, pos


def test_gaussian_target_far_001() -> None:
    """d = 32, 20 classes, holdout 0.2, 40,000 samples: far = 0.01 gives a threshold whose
    false-accept rate on 100,000 fresh negative pairs is at most far_bound <= 0.01, the
    estimate within 0.005, and a true-accept rate at least 0.9 of the best at FAR 0.01.

    The separation is one at which the best true-accept rate at FAR 0.01 is high (~0.98):
    with ~2,500 negative pairs no method can certify 0.01 unless the true rate is well below
    it (~0.004), so the ratio measures the price of certification only where the ROC is not
    steep between the two rates."""
    world = Gaussian(dim=32, classes=20, separation=1.5, seed=1)
    learner = Learner(LearnerConfig(dim=32, holdout=0.2, seed=0))
    learner.learn_many(*world.draw(40_000))
    point = operating_point(_pairs_of(learner), far=0.01)
    neg, pos = world.fresh_pairs(learner, 100_000)
    measured_far = float(np.mean(neg <= point.threshold))
    assert point.far_bound == 0.01  # the certified statement: FAR <= the target
    assert measured_far <= point.far_bound
    assert abs(point.far_estimate - measured_far) <= 0.005
    best_tar = float(np.mean(pos <= np.quantile(neg, 0.01)))
    tar = float(np.mean(pos <= point.threshold))
    assert tar >= 0.9 * best_tar, (tar, best_tar)
    assert point.kind == "far" and point.negatives > 2000 and point.version == learner.version


def test_frr_target_is_symmetric() -> None:
    world = Gaussian(dim=8, classes=6, separation=1.0, seed=2)
    learner = Learner(LearnerConfig(dim=8, holdout=0.3, seed=0))
    learner.learn_many(*world.draw(12_000))
    point = operating_point(_pairs_of(learner), frr=0.05)
    _, pos = world.fresh_pairs(learner, 50_000)
    assert point.frr_bound == 0.05
    assert float(np.mean(pos > point.threshold)) <= point.frr_bound
    assert point.frr_estimate <= point.frr_bound and point.far_estimate <= point.far_bound
    # the lowest false-accept rate among the certified: the next smaller grid threshold fails
    pairs = _pairs_of(learner)
    j = int(np.searchsorted(pairs.grid, point.threshold))
    smaller = pairs.grid[j - 1]
    fr = len(pairs.positives) - np.searchsorted(pairs.positives, smaller, side="right")
    assert float(bin_inv_upper(point.positives, fr, point.delta / 2)) > 0.05
    assert point.frr_bound == 0.05  # the certified statement: FRR <= the target


def test_target_by_fixed_sequence_other_rate_by_union_bound() -> None:
    """For a far target: the chosen threshold is the last of the ascending grid whose single
    bound at delta/2 is at most the target (the next one's is above), far_bound is the target
    (the certified statement) and frr_bound is exactly the binomial bound at delta / (2 |grid|):
    never looser or tighter than the argument gives."""
    world = Gaussian(dim=4, classes=5, separation=1.5, seed=3)
    learner = Learner(LearnerConfig(dim=4, holdout=0.3, seed=0))
    learner.learn_many(*world.draw(6000))
    pairs = _pairs_of(learner)
    point = operating_point(pairs, far=0.05, delta=0.1)
    j = int(np.searchsorted(pairs.grid, point.threshold))
    assert pairs.grid[j] == point.threshold
    fa, fr = pairs.counts(pairs.grid)
    single = bin_inv_upper(point.negatives, fa, 0.1 / 2)
    assert np.all(single[: j + 1] <= 0.05) and single[j + 1] > 0.05
    assert point.far_bound == 0.05
    assert point.frr_bound == float(bin_inv_upper(point.positives, fr[j], 0.1 / (2 * point.grid)))
    assert point.far_estimate == fa[j] / point.negatives
    assert point.frr_estimate == fr[j] / point.positives
    assert "fixed-sequence" in point.statement and f"delta/{2 * point.grid}" in point.statement
    kl_point = operating_point(pairs, far=0.05, delta=0.1, method="kl")
    assert kl_point.threshold <= point.threshold  # the Chernoff relaxation is looser
    with pytest.raises(ValueError, match=r"^delta: .*method='kl'"):
        operating_point(pairs, far=0.05, delta=0.3)  # 0.15 per rate: beyond the exact bound's
    assert operating_point(pairs, far=0.05, delta=0.3, method="kl").far_bound == 0.05


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in np.ravel(x)])


def test_chosen_threshold_meets_the_target_at_rate_delta() -> None:
    """Known distances: negative pairs N(0, 1), positive pairs N(-2, 1) (as distances, only
    their order matters), so FAR(t) = Phi(t) and FRR(t) = 1 - Phi(t + 2). A grid of 400
    thresholds packed around the target's quantile makes selection bite: choosing the largest
    threshold whose *estimate* is at most far exceeds the target in about half of the runs.
    Over 1,500 seeded runs, the chosen threshold's true FAR exceeds far in at most delta/2 of
    them, its true FRR exceeds frr_bound in at most delta/2 (plus a binomial slack of three
    standard deviations each), and the two together in at most delta."""
    far, delta, runs, m = 0.05, 0.2, 1500, 1000
    rng = np.random.default_rng(2024)
    q = -1.6448536269514722  # Phi^-1(0.05)
    grid = np.sort(np.concatenate([[-10.0], q + np.linspace(-0.6, 0.6, 399)]))
    true_far, true_frr = _normal_cdf(grid), 1.0 - _normal_cdf(grid + 2.0)
    over_target = over_bound = either = naive_over = 0
    for _ in range(runs):
        neg, pos = np.sort(rng.normal(size=m)), np.sort(rng.normal(-2.0, 1.0, size=m))
        pairs = HeldOutPairs(neg, pos, np.empty(0), np.empty(0), grid, 2 * m, 2, None, "squared")
        point = operating_point(pairs, far=far, delta=delta)
        j = int(np.searchsorted(grid, point.threshold))
        assert point.far_bound == far and point.far_estimate <= far
        a, b = true_far[j] > far, true_frr[j] > point.frr_bound
        over_target, over_bound, either = over_target + a, over_bound + b, either + (a or b)
        fa, _ = pairs.counts(grid)
        naive = int(np.flatnonzero(fa / m <= far)[-1])
        naive_over += bool(true_far[naive] > far)

    def slack(p: float) -> float:
        return 3.0 * math.sqrt(p * (1.0 - p) / runs)

    assert naive_over / runs > 0.3  # the setting would catch a choice that ignores selection
    assert over_target / runs <= delta / 2 + slack(delta / 2), over_target
    assert over_bound / runs <= delta / 2 + slack(delta / 2), over_bound
    assert either / runs <= delta + slack(delta), either
    assert over_target > 0  # the test is near its edge, not vacuous


def test_frr_target_meets_its_target_at_rate_delta() -> None:
    """The mirror image for an frr target (descending thresholds): true FRR above the target
    in at most delta/2 of the runs, true FAR above far_bound in at most delta/2."""
    frr, delta, runs, m = 0.05, 0.2, 1000, 1000
    rng = np.random.default_rng(7)
    q = 1.6448536269514722 - 2.0  # FRR(t) = 1 - Phi(t + 2) = 0.05
    grid = np.sort(np.concatenate([[10.0], q + np.linspace(-0.6, 0.6, 399)]))
    true_far, true_frr = _normal_cdf(grid), 1.0 - _normal_cdf(grid + 2.0)
    over_target = over_bound = 0
    for _ in range(runs):
        neg, pos = np.sort(rng.normal(size=m)), np.sort(rng.normal(-2.0, 1.0, size=m))
        pairs = HeldOutPairs(neg, pos, np.empty(0), np.empty(0), grid, 2 * m, 2, None, "squared")
        point = operating_point(pairs, frr=frr, delta=delta)
        j = int(np.searchsorted(grid, point.threshold))
        assert point.frr_bound == frr
        over_target += bool(true_frr[j] > frr)
        over_bound += bool(true_far[j] > point.far_bound)
    slack = 3.0 * math.sqrt(0.1 * 0.9 / runs)
    assert over_target / runs <= delta / 2 + slack and over_bound / runs <= delta / 2 + slack


def test_grid_does_not_depend_on_the_held_out_samples() -> None:
    window = np.random.default_rng(0).chisquare(3, size=(400, 2)) * [1.0, 5.0]
    X = np.random.default_rng(1).normal(size=(600, 3))
    a = held_out_pairs(np.eye(3), X, np.arange(600) % 4, window)
    b = held_out_pairs(np.eye(3), 2 * X, np.arange(600) % 3, window)
    assert np.array_equal(a.grid, b.grid)
    assert np.array_equal(a.grid, candidate_grid(window))


def test_too_few_held_out_pairs_is_not_certifiable_with_needed_and_have() -> None:
    world = Gaussian(dim=4, classes=5, separation=3.0, seed=4)
    learner = Learner(LearnerConfig(dim=4, holdout=0.1, seed=0))
    learner.learn_many(*world.draw(3000))
    pairs = _pairs_of(learner)
    with pytest.raises(NotEnoughHeldOut) as info:
        operating_point(pairs, far=0.001)
    have = info.value.have
    assert have == pairs.samples
    # about ln(2/delta)/far negative pairs (one test at delta/2), two samples each
    expected = 2 * pairs_needed(0.001, 0.05 / 2) - have
    assert 0.8 * expected <= info.value.needed <= 1.25 * expected
    assert "needed" in str(info.value) or "more held-out samples" in str(info.value)
    # with that many more held-out samples (flagged), the target is certified
    more = info.value.needed + 200
    X, y = world.draw(more)
    learner2 = Learner(LearnerConfig(dim=4, holdout=0.1, seed=0, holdout_window=have + more))
    learner2.learn_many(*world.draw(3000))
    learner2.learn_many(X, y, holdout=np.ones(more, dtype=bool))
    point = operating_point(_pairs_of(learner2), far=0.001)
    assert point.far_bound == 0.001


def test_roc_is_monotone_and_bounded() -> None:
    world = Gaussian(dim=4, classes=5, separation=1.0, seed=5)
    learner = Learner(LearnerConfig(dim=4, holdout=0.3, seed=0))
    learner.learn_many(*world.draw(5000))
    curve = roc(_pairs_of(learner), points=25)
    t = [p["threshold"] for p in curve.points]
    far = [p["far_estimate"] for p in curve.points]
    frr = [p["frr_estimate"] for p in curve.points]
    assert t == sorted(t) and far == sorted(far) and frr == sorted(frr, reverse=True)
    assert all(p["far_estimate"] <= p["far_bound"] <= 1 for p in curve.points)
    assert all(p["frr_estimate"] <= p["frr_bound"] <= 1 for p in curve.points)
    assert curve.points[0]["window_far"] == 0.0 and curve.points[-1]["window_frr"] == 0.0
    csv = curve.to_csv().splitlines()
    assert csv[0].split(",")[:3] == ["threshold", "far_estimate", "far_bound"]
    assert len(csv) == len(curve.points) + 1
    with pytest.raises(ValueError, match=r"^points:"):
        roc(_pairs_of(learner), points=1)


def test_brm_is_certified_in_its_restricted_distance() -> None:
    world = Gaussian(dim=4, classes=4, separation=1.0, seed=6)
    learner = Learner(LearnerConfig(dim=4, algorithm="brm", holdout=0.3, seed=0))
    learner.learn_many(*world.draw(6000))
    pairs = _pairs_of(learner)
    assert pairs.distance == "restricted"
    assert pairs.negatives.max() < 1.0 and pairs.grid[-1] < 4.0
    point = operating_point(pairs, far=0.1)
    assert point.distance == "restricted" and point.far_bound <= 0.1
    # the threshold applies to D_R^2, as the model's verify decides
    X, y = world.draw(4000)
    a, b = X[:2000], X[2000:]
    differ = y[:2000] != y[2000:]
    restricted = learner.restricted_squared_pairs(a[differ], b[differ])
    assert float(np.mean(restricted <= point.threshold)) <= point.far_bound + 0.03


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"far": 0.5}, "^far: must be a number in \\(0, 0.5\\)"),
        ({"frr": 0.0}, "^frr: must be a number in \\(0, 0.5\\)"),
        ({"far": 0.1, "frr": 0.1}, "^far: give exactly one"),
        ({}, "^far: give exactly one"),
        ({"far": 0.1, "delta": 1.0}, "^delta:"),
        ({"far": 0.1, "method": "pac-bayes"}, "^method:"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    window = np.abs(np.random.default_rng(0).normal(size=(50, 2)))
    X = np.random.default_rng(1).normal(size=(200, 2))
    pairs = held_out_pairs(np.eye(2), X, np.arange(200) % 4, window)
    with pytest.raises(ValueError, match=message):
        operating_point(pairs, **kwargs)


def test_operating_point_config_values() -> None:
    assert check_operating_point({"frr": 0.2}) == {"frr": 0.2}
    for bad in ("far", {"far": 0.7}, {"tar": 0.1}, {"far": True}, None):
        with pytest.raises(ValueError, match=r"^operating_point:"):
            check_operating_point(bad)


def test_empty_window_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^calibration:"):
        held_out_pairs(np.eye(2), np.ones((40, 2)), np.arange(40) % 2, np.empty((0, 2)))


def test_needed_pairs_formula() -> None:
    for target, delta in ((0.01, 0.05), (0.001, 1e-4)):
        m = pairs_needed(target, delta)
        assert -math.expm1(math.log(delta) / m) <= target < -math.expm1(math.log(delta) / (m - 1))
