"""gamma="auto": a continuing race of step sizes around the leader, replay-exact."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from service.core import Learner, LearnerConfig
from service.core.race import DEFAULT_GAMMA, GRID, HIGHEST, LOWEST, Race, auc
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


def test_the_race_goes_on_scores_with_forgetting_and_follows_the_leader() -> None:
    X, y = stream(1200)
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=200, seed=3))
    assert learner.race is not None and learner.race["state"] == "racing"
    assert "candidates" not in learner.race  # nothing copied before the first sample

    learner.learn_many(X[:5], y[:5])
    race = learner.race
    assert [c["gamma"] for c in race["candidates"]] == list(GRID)
    assert race["serving"] == DEFAULT_GAMMA  # the default step until the first block ends

    learner.learn_many(X[5:], y[5:])
    race = learner.race
    assert race["state"] == "racing" and race["winner"] is None  # never committed
    assert len(race["candidates"]) == 3  # three copies of L for as long as it learns
    blocks = race["rounds"]
    assert race["rung"] == triplet_count(learner) // 100 > 8  # one per 100 triplets ...
    first = race["rung"] - 8 + 1  # ... the last 8 of them reported
    assert [b["triplets"] for b in blocks] == [100 * k for k in range(first, race["rung"] + 1)]
    # the running score: each block's AUC weighted 1/2, the older ones forgotten
    internal = learner._race  # type: ignore[union-attr]
    assert internal is not None
    for j, gamma in enumerate(internal.gammas):
        assert gamma in race["grid"]
        assert internal.scores[j] is not None and 0.0 < internal.scores[j] <= 1.0
    # the served track is the leader, and the candidates sit a factor 2 around it (or the
    # leader is at the edge of the allowed range)
    assert race["serving"] == internal.gammas[internal.leader] == blocks[-1]["kept"][0]
    grid = sorted(race["grid"])
    assert grid[1] == race["serving"] or race["serving"] in (LOWEST, HIGHEST)
    assert grid[2] / grid[1] == grid[1] / grid[0] == 2.0
    scale = learner.effective["scale"]
    assert learner.effective["gamma"] == pytest.approx(race["serving"] / scale)


def test_the_leader_changes_only_beyond_the_hysteresis() -> None:
    tracks = Tracks(np.eye(2), list(GRID), window=10)
    race = Race(warmup=8)  # blocks of 5 triplets
    race.started = True

    def block(gaps: list[float]) -> None:
        values = np.full((5, 3, 4), np.nan)
        for j, gap in enumerate(gaps):
            values[:, j, 1] = [1.0, 2.0, 3.0, 4.0, 5.0]
            values[:, j, 2] = np.array([1.0, 2.0, 3.0, 4.0, 5.0]) + gap
        race.record(tracks, np.ones(5, dtype=bool), values)

    block([0.5, 0.5, 0.5])  # a tie: the default keeps the lead
    assert race.leader == 1 and tracks.served == 1 and race.switches == 0
    block([0.5, 0.5, 2.0])  # the larger step separates better: it leads ...
    assert race.gammas[race.leader] == GRID[2] and race.switches == 1
    # ... and, at the top of the candidates, the smallest is replaced by a copy of it with 2x
    assert sorted(race.gammas) == [GRID[1], GRID[2], 2 * GRID[2]]
    assert tracks.gammas.tolist() == race.gammas
    lead = race.leader
    copied = race.gammas.index(2 * GRID[2])
    assert race.scores[copied] == race.scores[lead]
    np.testing.assert_array_equal(tracks.Ls[copied], tracks.Ls[lead])


def test_the_block_boundaries_count_triplets_not_samples() -> None:
    """COPML pair steps and new classes do not advance the race."""
    X, y = stream(300)
    X[:50], y[:50] = X[0] + 0.1, y[0]  # a cold start of pair steps first
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=100, seed=1))
    for x, label in zip(X, y, strict=True):
        learner.learn_one(x, label)
        if learner.race["rounds"]:
            break
    assert learner.counts["pair_update"] >= 49
    assert triplet_count(learner) == 50  # the first block ended on its 50th triplet
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


def test_a_tripped_leader_gives_way() -> None:
    tracks = Tracks(np.eye(2), list(GRID), window=10)
    race = Race(warmup=8)
    race.started = True
    # five triplets per candidate: the leader (the default, 1) separates best ...
    values = np.full((5, 3, 4), np.nan)
    for j, gap in enumerate([0.0, 3.0, 1.0]):
        values[:, j, 1] = [1.0, 2.0, 3.0, 4.0, 5.0]
        values[:, j, 2] = np.array([1.5, 2.5, 3.5, 4.5, 5.5]) + gap
    tracks.state[1, TRIPS] = 1.0  # ... but its monitor tripped
    race.record(tracks, np.ones(5, dtype=bool), values)
    first = race.history[0]
    assert [c["tripped"] for c in first["candidates"]] == [False, True, False]
    assert first["kept"] == [GRID[2]] and race.gammas[race.leader] == GRID[2]


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


def test_a_checkpoint_of_the_warm_up_race_restarts_the_race_from_the_served_metric() -> None:
    """The state of the earlier warm-up race (successive halving; done: one track left)."""
    X, y = stream(300, seed=4)
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=100, seed=1))
    learner.learn_many(X[:200], y[:200])
    arrays, meta = learner.to_state()
    served = learner.L.copy()
    arrays = {"L": served, "buffer": arrays["buffer"], "calibration": arrays["calibration"]}
    tracks = meta["tracks"]
    j = tracks["served"]
    old_tracks = {
        **{k: v for k, v in tracks.items() if k != "calibrations"},
        "gammas": [tracks["gammas"][j]],
        "state": [tracks["state"][j]],
        "counts": [tracks["counts"][j]],
        "served": 0,
    }
    old_race = {"grid": [0.025, 0.05, 0.1, 0.2], "warmup": 100, "started": True, "rung": 2,
                "triplets": 100, "alive": [1], "history": []}  # fmt: skip
    resumed = Learner.from_state(arrays, {**meta, "tracks": old_tracks, "race": old_race})
    np.testing.assert_array_equal(resumed.L, served)
    assert resumed.race is not None and resumed.race["triplets"] == 0
    resumed.learn_many(X[200:], y[200:])  # the race starts again from the served L
    assert len(resumed.race["candidates"]) == 3 and resumed.race["rung"] >= 1
