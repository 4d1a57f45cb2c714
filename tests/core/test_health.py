"""The divergence monitor: exact ||L||_F tracking, the trips, the step cut, replay exactness."""

from __future__ import annotations

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.health import GROWTH_WINDOW, MAX_GROWTH, STEP_CUT


def stretching_learner(gamma: float, b_norm: float) -> Learner:
    """Class "a" at the origin, class "b" at b_norm e_1: every further "a" sample at the origin
    forms the triplet a = 0, b = -b_norm e_1, whose step stretches L along e_1 by
    1 / (1 - gamma b_norm^2) (Eq. 12), as long as the (huge) margin keeps the hinge active."""
    learner = Learner(LearnerConfig(dim=2, step="paper", gamma=gamma, margin=1e12, seed=0))
    learner.learn_one([0.0, 0.0], "a")
    learner.learn_one([b_norm, 0.0], "b")
    return learner


def test_growth_of_ten_within_a_window_trips_and_halves_the_step() -> None:
    learner = stretching_learner(gamma=0.85, b_norm=1.0)  # 1 + gamma lambda_- = 0.15: no shrink
    norms = []
    for _ in range(3):
        r = learner.learn_one([0.0, 0.0], "a")
        assert r.outcome == "triplet_update"
        norms.append(np.linalg.norm(learner.L))
    # ||L||_F: sqrt(2) -> ~6.7 -> ~44.5: the second step passes 10x the window's start
    assert norms[0] < MAX_GROWTH * np.sqrt(2) < norms[1]
    health = learner.health
    assert health["times_tripped"] == 1
    assert health["step_scale"] == STEP_CUT  # no shrunk step: the plain cut
    assert health["state"] == "diverging"
    assert health["growth"] == pytest.approx(np.log10(norms[-1] / np.sqrt(2)), rel=1e-9)
    # the next steps use half the step: the gamma of Eq. 12 they report says so
    assert learner.learn_one([0.0, 0.0], "a").gamma == pytest.approx(0.85 * STEP_CUT)
    assert learner.effective["gamma"] == pytest.approx(0.85 * STEP_CUT)


def test_shrunk_steps_cut_the_step_by_their_overshoot() -> None:
    """gamma ||b||^2 = 100: each step is shrunk to gamma' = 0.9 / 100 (ratio 0.009) and
    stretches L by 10; the trip cuts the step by that ratio, not merely in half."""
    learner = stretching_learner(gamma=1.0, b_norm=10.0)
    outcomes = [learner.learn_one([0.0, 0.0], "a").outcome for _ in range(2)]
    assert outcomes == ["shrunk_update", "shrunk_update"]
    health = learner.health
    assert health["times_tripped"] == 1
    assert health["step_scale"] == pytest.approx(0.009, rel=1e-9)
    following = learner.learn_one([0.0, 0.0], "a")
    assert following.gamma == pytest.approx(0.009, rel=1e-9)


def test_state_recovers_to_stabilised_after_a_quiet_window() -> None:
    # margin 1e5: two stretches by 10 (shrunk steps) trip the monitor; after them the hinge
    # (Eq. 4) is inactive for this triplet (||L b||^2 = 1e6), so the stream turns passive.
    learner = Learner(LearnerConfig(dim=2, step="paper", gamma=1.0, margin=1e5, seed=0))
    learner.learn_one([0.0, 0.0], "a")
    learner.learn_one([10.0, 0.0], "b")
    for _ in range(2):
        learner.learn_one([0.0, 0.0], "a")
    assert learner.health["state"] == "diverging"
    for _ in range(GROWTH_WINDOW):
        assert learner.learn_one([0.0, 0.0], "a").outcome == "passive"
    health = learner.health
    assert health["state"] == "stabilised"
    assert health["times_tripped"] == 1
    assert health["step_scale"] == pytest.approx(0.009)  # the cut is kept


@pytest.mark.parametrize("step", ["scaled", "paper"])
def test_frobenius_norm_is_tracked_exactly(step: str) -> None:
    rng = np.random.default_rng(3)
    d = 24
    y = rng.integers(0, 5, size=900)
    X = rng.normal(size=(5, d))[y] + rng.normal(size=(900, d))
    X[:20], y[:20] = X[0] + 0.1 * rng.normal(size=(20, d)), y[0]
    learner = Learner(LearnerConfig(dim=d, step=step, gamma=0.05, margin=3.0, seed=1))  # type: ignore[arg-type]
    for start in range(0, 900, 97):  # checked between resyncs too
        learner.learn_many(X[start : start + 97], y[start : start + 97])
        health = learner.health
        assert health["frobenius_norm"] == pytest.approx(np.linalg.norm(learner.L), rel=1e-10)
    assert health["updates"] == sum(
        learner.counts[k] for k in ("pair_update", "triplet_update", "shrunk_update")
    )


@pytest.mark.parametrize("dim", [1, 2])
def test_frobenius_norm_is_tracked_when_a_huge_step_cancels_it_down(dim: int) -> None:
    """gamma = 1e6 (paper rule): a step much larger than L, whose O(d) terms cancel down to far
    less than their size; the tracked norm once stayed ~1e-7 while ||L||_F was ~1e-18 (found
    by the property test in CI). Now such a step is measured in full."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        config = LearnerConfig(
            dim=dim, algorithm="opml", step="paper", gamma=1e6, margin=1e-6, normalize="l2"
        )
        learner = Learner(config)
        learner.learn_many(rng.normal(size=(60, dim)) * 1e-150, rng.integers(0, 8, 60).tolist())
        health = learner.health
        assert health is not None
        assert health["frobenius_norm"] == pytest.approx(np.linalg.norm(learner.L), rel=1e-6)


def test_healthy_default_streams_never_trip() -> None:
    from sklearn.datasets import load_digits, load_iris, load_wine

    for load in (load_iris, load_wine, load_digits):
        X, y = load(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(y))
        for Z in (X, (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)):
            learner = Learner(LearnerConfig(dim=X.shape[1], seed=0))
            learner.learn_many(Z[order], y[order])
            health = learner.health
            assert health["times_tripped"] == 0, load.__name__
            assert learner.counts["shrunk_update"] == 0
            assert health["state"] == "ok"


def test_paper_rule_on_issue_14_digits_is_flagged_and_contained() -> None:
    """Digits z-scored, the paper's rule at gamma = 1e-2 grew the largest singular
    value to ~1e31. The monitor flags it and keeps ||L|| within a few decades."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    learner = Learner(LearnerConfig(dim=64, step="paper", gamma=1e-2, seed=0))
    learner.learn_many(X, y)
    health = learner.health
    assert health["times_tripped"] >= 1 and health["state"] != "ok"
    assert health["step_scale"] < 1
    assert health["growth"] < 4.0
    assert np.linalg.svd(learner.L, compute_uv=False)[0] < 1e5


def test_set_metric_restarts_the_measurements_and_keeps_the_cut() -> None:
    learner = stretching_learner(gamma=0.85, b_norm=1.0)
    for _ in range(3):
        learner.learn_one([0.0, 0.0], "a")
    learner.set_metric(3.0 * np.eye(2))
    health = learner.health
    assert health["growth"] == 0.0
    assert health["frobenius_norm"] == pytest.approx(3.0 * np.sqrt(2))
    assert (health["times_tripped"], health["step_scale"]) == (1, STEP_CUT)


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
def test_a_resumed_monitor_trips_at_the_same_samples(cut: int) -> None:
    learner = stretching_learner(gamma=0.85, b_norm=1.0)
    resumed = Learner.from_state(*learner.to_state())
    for i in range(8):
        r1 = learner.learn_one([0.0, 1e-3 * i], "a")
        if i == cut:
            resumed = Learner.from_state(*resumed.to_state())
        r2 = resumed.learn_one([0.0, 1e-3 * i], "a")
        assert r1 == r2
    assert learner.health == resumed.health
    assert np.array_equal(learner.L, resumed.L)
