"""gamma="auto": successive halving of a step-size grid on the stream, replay-exact."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from service.core import Learner, LearnerConfig
from service.core.race import DEFAULT_GAMMA, GRID, Race, auc
from service.core.tracks import Tracks
from service.core.update import TRIPS


def stream(n: int, d: int = 8, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    X = 0.6 * rng.normal(size=(classes, d))[y] + rng.normal(size=(n, d))
    return X, y


def triplet_count(learner: Learner) -> int:
    return sum(learner.counts[k] for k in ("triplet_update", "shrunk_update", "passive"))


def test_auc_is_the_mann_whitney_statistic() -> None:
    rng = np.random.default_rng(1)
    pos = rng.gamma(2.0, size=300).round(1)  # ties on purpose
    neg = rng.gamma(3.0, size=200).round(1)
    labels = np.r_[np.ones(300), np.zeros(200)]
    expected = roc_auc_score(labels, -np.r_[pos, neg])
    assert auc(pos, neg) == pytest.approx(expected, abs=1e-12)
    assert auc(pos[:0], neg) is None


def test_race_halves_at_each_rung_and_commits_to_the_best() -> None:
    X, y = stream(400)
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=200, seed=3))
    assert learner.race is not None and learner.race["state"] == "racing"
    assert "candidates" not in learner.race  # nothing copied before the first sample

    learner.learn_many(X[:5], y[:5])
    race = learner.race
    assert [c["gamma"] for c in race["candidates"]] == list(GRID)
    assert race["serving"] == DEFAULT_GAMMA  # the default step until the first rung ends

    learner.learn_many(X[5:], y[5:])
    race = learner.race
    assert race["state"] == "done" and race["triplets"] == 200
    first, second = race["rounds"]
    assert first["triplets"] == 100 and len(first["candidates"]) == 4
    assert second["triplets"] == 200 and len(second["candidates"]) == 2
    # each rung keeps the better half by its prequential AUC, and the best is served
    ranked = sorted(first["candidates"], key=lambda c: -c["score"])
    assert first["kept"] == [c["gamma"] for c in ranked[:2]]
    assert [c["gamma"] for c in second["candidates"]] == first["kept"]
    best = max(second["candidates"], key=lambda c: c["score"])
    assert second["kept"] == [best["gamma"]] == [race["winner"]] == [race["serving"]]
    assert len(race["candidates"]) == 1  # one copy of L left: the cost of a fixed step
    # from here on the winner's step, in the scaled units (step_scale 1: never tripped)
    scale = learner.effective["scale"]
    assert learner.effective["gamma"] == pytest.approx(race["winner"] / scale)


def test_the_rung_boundaries_count_triplets_not_samples() -> None:
    """COPML pair steps and new classes do not advance the race."""
    X, y = stream(300)
    X[:50], y[:50] = X[0] + 0.1, y[0]  # a cold start of pair steps first
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=100, seed=1))
    for x, label in zip(X, y, strict=True):
        learner.learn_one(x, label)
        if len(learner.race["candidates"]) == 2:
            break
    assert learner.counts["pair_update"] >= 49
    assert triplet_count(learner) == 50  # the first rung ended on its 50th triplet
    assert learner.race["rounds"][0]["triplets"] == 50


@pytest.mark.parametrize("seed", range(4))
def test_any_batching_gives_the_same_race(seed: int) -> None:
    X, y = stream(260, seed=seed)
    config = LearnerConfig(dim=8, gamma="auto", auto_warmup=120, seed=seed)
    one = Learner(config)
    loop = [one.learn_one(x, label) for x, label in zip(X, y, strict=True)]
    chunked = Learner(config)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, 260), size=12, replace=False))
    results = []
    for part in np.split(np.arange(260), cuts):
        results += list(chunked.learn_many(X[part], y[part]))
    assert loop == results
    assert np.array_equal(one.L, chunked.L)
    assert one.race == chunked.race
    assert one.to_state()[1] == chunked.to_state()[1]


@pytest.mark.parametrize("cut", [0, 3, 60, 64, 65, 119, 130, 200])
def test_resuming_anywhere_in_the_race_is_bit_identical(cut: int) -> None:
    X, y = stream(240, seed=9)
    config = LearnerConfig(dim=8, gamma="auto", auto_warmup=120, seed=2, calibration_window=40)
    whole = Learner(config)
    whole.learn_many(X, y)
    first = Learner(config)
    if cut:
        first.learn_many(X[:cut], y[:cut])
    arrays, meta = first.to_state()
    stored = {
        k: np.frombuffer(v.tobytes(), dtype=v.dtype).reshape(v.shape) for k, v in arrays.items()
    }
    resumed = Learner.from_state(stored, json.loads(json.dumps(meta)))
    resumed.learn_many(X[cut:], y[cut:])
    assert np.array_equal(resumed.L, whole.L)
    assert resumed.to_state()[1] == whole.to_state()[1]
    assert resumed.calibrator.calibration() == whole.calibrator.calibration()


def test_a_tripped_candidate_ranks_last() -> None:
    tracks = Tracks(np.eye(2), list(GRID), window=10)
    race = Race(warmup=8)
    race.started = True
    # four triplets per candidate: candidate 3 separates best, candidate 0 worst
    values = np.full((4, 4, 4), np.nan)
    for j, gap in enumerate([0.0, 1.0, 2.0, 3.0]):
        values[:, j, 1] = [1.0, 2.0, 3.0, 4.0]
        values[:, j, 2] = np.array([1.5, 2.5, 3.5, 4.5]) + gap
    tracks.state[3, TRIPS] = 1.0  # ... but its monitor tripped
    race.record(tracks, np.ones(4, dtype=bool), values)
    first = race.history[0]
    assert [c["tripped"] for c in first["candidates"]] == [False, False, False, True]
    assert first["kept"] == [GRID[2], GRID[1]]
    assert tracks.gammas.tolist() == [GRID[2], GRID[1]]


def test_a_put_metric_before_or_during_the_race_is_raced_from() -> None:
    X, y = stream(200)
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=200))
    warm = 2.0 * np.eye(8)
    learner.set_metric(warm)
    learner.learn_many(X[:1], y[:1])  # a new class: L unchanged, the race has begun
    assert all(
        c["frobenius_norm"] == pytest.approx(np.sqrt(32)) for c in learner.race["candidates"]
    )
    learner.learn_many(X[1:60], y[1:60])
    learner.set_metric(np.eye(8))
    assert all(c["growth"] == 0.0 for c in learner.race["candidates"])
    assert np.array_equal(learner.L, np.eye(8))


def test_auto_is_refused_with_the_papers_units() -> None:
    with pytest.raises(ValueError, match="gamma: 'auto' needs step='scaled'"):
        LearnerConfig(dim=3, gamma="auto", step="paper")
