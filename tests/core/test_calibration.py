"""Equal-error-rate calibration of the verification threshold."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.calibration import MIN_PAIRS, ThresholdCalibrator


def test_separable_window_gives_zero_eer_and_a_separating_threshold() -> None:
    cal = ThresholdCalibrator(window=500)
    rng = np.random.default_rng(0)
    for _ in range(200):
        cal.observe(d_pos=rng.uniform(0, 1), d_neg=rng.uniform(2, 3))
    c = cal.calibration()
    assert c.calibrated and c.eer == 0.0 and c.accuracy == 1.0
    assert c.threshold is not None and 0 < c.threshold < 2


def test_overlapping_gaussians_eer_matches_theory() -> None:
    # pos ~ N(0, 1), neg ~ N(2, 1): the EER threshold is 1, the EER Phi(-1) = 0.1587.
    cal = ThresholdCalibrator(window=20000)
    rng = np.random.default_rng(1)
    for p, n in zip(rng.normal(0, 1, 20000), rng.normal(2, 1, 20000), strict=True):
        cal.observe(p, n)
    c = cal.calibration()
    assert c.threshold == pytest.approx(1.0, abs=0.05)
    assert c.eer == pytest.approx(0.1587, abs=0.01)


def test_not_calibrated_below_min_pairs() -> None:
    cal = ThresholdCalibrator()
    assert cal.calibration().threshold is None
    for i in range(MIN_PAIRS - 1):
        cal.observe(float(i), float(i + 100))
    assert not cal.calibration().calibrated
    cal.observe(0.0, 100.0)
    assert cal.calibration().calibrated


def test_window_forgets_old_pairs() -> None:
    cal = ThresholdCalibrator(window=50)
    for _ in range(50):
        cal.observe(10.0, 0.0)  # a metric that was bad: all triplets wrong
    assert cal.calibration().accuracy == 0.0
    for _ in range(50):
        cal.observe(0.0, 10.0)
    assert cal.calibration().accuracy == 1.0


@pytest.mark.parametrize("count", [0, 7, 50, 51, 173])
def test_state_round_trip_keeps_order_across_wraparound(count: int) -> None:
    cal = ThresholdCalibrator(window=50)
    rng = np.random.default_rng(count)
    for _ in range(count):
        cal.observe(*rng.uniform(size=2))
    pairs, meta = cal.to_state()
    back = ThresholdCalibrator.from_state(pairs, meta)
    for _ in range(30):
        p, n = rng.uniform(size=2)
        cal.observe(p, n)
        back.observe(p, n)
    assert back.calibration() == cal.calibration()
    assert np.array_equal(back.to_state()[0], cal.to_state()[0])


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        ThresholdCalibrator(window=0)


def _eer_by_definition(pairs: np.ndarray) -> tuple[float, float, float]:
    """The EER point by its definition, with NumPy: every observed distance a candidate (the
    positives' ascending, then the negatives'), FRR / FAR counted by ``searchsorted`` at each,
    the first least ``|far - frr| + 1e-12 (far + frr)``."""
    n = len(pairs)
    pos, neg = np.sort(pairs[:, 0]), np.sort(pairs[:, 1])
    candidates = np.concatenate([pos, neg])
    frr = 1.0 - np.searchsorted(pos, candidates, side="right") / n
    far = np.searchsorted(neg, candidates, side="right") / n
    best = int(np.argmin(np.abs(far - frr) + 1e-12 * (far + frr)))
    accuracy = float(np.mean(pairs[:, 0] < pairs[:, 1]))
    return float(candidates[best]), float((far[best] + frr[best]) / 2), accuracy


@pytest.mark.parametrize("kind", ["continuous", "ties", "equal_pairs"])
def test_calibration_equals_the_definition_exactly(kind: str) -> None:
    """The compiled walk gives bit for bit what the definition gives, ties included (small
    integer distances, pairs whose two distances are equal), at every window fill."""
    rng = np.random.default_rng({"continuous": 3, "ties": 4, "equal_pairs": 5}[kind])
    for n in [1, 2, 3, 19, 20, 250, 1000]:
        if kind == "continuous":
            pairs = rng.normal(size=(n, 2)) ** 2
        elif kind == "ties":
            pairs = rng.integers(0, 4, size=(n, 2)).astype(float)
        else:
            pairs = np.column_stack([rng.exponential(1.0, n), rng.exponential(3.0, n)])
            pairs[: n // 2, 1] = pairs[: n // 2, 0]
        cal = ThresholdCalibrator(window=1000)
        cal.observe_many(pairs[:, 0], pairs[:, 1])
        c = cal.calibration()
        assert (c.threshold, c.eer, c.accuracy) == _eer_by_definition(pairs)
        assert c.pairs == n and c.calibrated == (n >= MIN_PAIRS)
