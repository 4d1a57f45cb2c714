"""Rehearsal: each learned sample is followed by steps on reservoir samples
(service.core.rehearsal)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

from service.core import COPML, Learner, LearnerConfig
from service.core.rehearsal import Reservoir


def stream(n: int, d: int = 8, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    X = 0.6 * rng.normal(size=(classes, d))[y] + rng.normal(size=(n, d))
    return X, y


def reference_reservoir(X: np.ndarray, draws: np.ndarray, capacity: int) -> list[int]:
    """Algorithm R in plain Python on the same draws: the indexes of the rows held."""
    held: list[int] = []
    for i in range(len(X)):
        if i < capacity:
            held.append(i)
            continue
        j = int(draws[i, 1] * (i + 1))
        if j < capacity:
            held[j] = i
    return held


@pytest.mark.parametrize("capacity", [1, 7, 50, 1000])
def test_the_reservoir_is_algorithm_r_on_the_learners_own_draws(capacity: int) -> None:
    X, y = stream(300, seed=capacity)
    config = LearnerConfig(dim=8, rehearsal=2, rehearsal_memory=capacity, seed=5)
    learner = Learner(config)
    learner.learn_many(X, y)
    # the learner's generator draws 2 + 2 * rehearsal uniforms per sample, nothing else
    draws = np.random.default_rng(5).random((300, 6))
    held = reference_reservoir(X, draws, capacity)
    arrays, meta = learner.to_state()
    assert meta["rehearsal"] == {"seen": 300, "capacity": capacity}
    assert np.array_equal(arrays["rehearsal_rows"], X[held])
    slots = [learner.classes.index(str(label)) for label in y[held]]
    assert arrays["rehearsal_slots"].tolist() == slots


def test_each_sample_is_followed_by_its_rehearsed_steps() -> None:
    """The expanded stream: arrival, then ``rehearsal`` rows drawn from the reservoir so far."""
    reservoir = Reservoir(dim=2, capacity=2)
    rows = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    draws = np.array(
        [[0.1, 0.0, 0.9, 0.2], [0.3, 0.0, 0.9, 0.4], [0.5, 0.1, 0.0, 0.6]]
    )  # third: j = int(0.1 * 3) = 0 replaces slot 0, then picks slot 0
    X, slots, known, uniforms, arrival = reservoir.expand(
        rows, np.array([0, 1, 0]), np.array([0, 1, 2]), draws, 1
    )
    assert X[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert slots.tolist() == [0, 0, 1, 1, 0, 0]
    assert known.tolist() == [0, 1, 1, 2, 2, 2]  # a rehearsed row's class is known
    assert uniforms.tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert arrival.tolist() == [True, False, True, False, True, False]


@pytest.mark.parametrize("gamma", [None, "auto"])
def test_any_batching_and_any_resume_point_give_the_same_state(gamma: object) -> None:
    X, y = stream(400, seed=2)
    config = LearnerConfig(
        dim=8, gamma=gamma, auto_warmup=150, rehearsal=3, rehearsal_memory=40, seed=4
    )  # type: ignore[arg-type]
    one = Learner(config)
    loop = [one.learn_one(x, label) for x, label in zip(X, y, strict=True)]
    rng = np.random.default_rng(1)
    cuts = np.sort(rng.choice(np.arange(1, 400), size=15, replace=False))
    chunked = Learner(config)
    results = []
    for k, part in enumerate(np.split(np.arange(400), cuts)):
        if k % 4 == 3:  # resume from a stored state now and then
            arrays, meta = chunked.to_state()
            stored = {name: np.array(a, dtype=np.float64) for name, a in arrays.items()}
            chunked = Learner.from_state(stored, json.loads(json.dumps(meta)))
        results += list(chunked.learn_many(X[part], y[part]))
    assert loop == results
    assert np.array_equal(one.L, chunked.L)
    assert one.to_state()[1] == chunked.to_state()[1]
    assert np.isfinite(one.L).all()


def test_rehearsed_steps_change_l_but_not_the_per_sample_books() -> None:
    X, y = stream(600, seed=3)
    plain = Learner(LearnerConfig(dim=8, seed=1))
    rehearsed = Learner(LearnerConfig(dim=8, seed=1, rehearsal=2, calibration_window=100_000))
    plain.learn_many(X, y)
    results = rehearsed.learn_many(X, y)
    assert not np.array_equal(plain.L, rehearsed.L)
    assert len(results) == 600 and rehearsed.version == 600
    assert sum(rehearsed.counts.values()) == 600  # outcomes of samples received only
    triplets = sum(rehearsed.counts[k] for k in ("triplet_update", "shrunk_update", "passive"))
    # the calibrator holds the arrivals' prequential pairs only
    assert len(rehearsed.calibrator.to_state()[0]) == triplets
    # the rehearsed steps happened: the divergence monitor counted about three times the updates
    assert rehearsed.health["updates"] > 2 * rehearsed.counts["triplet_update"]


def test_the_race_counts_and_scores_arrivals_only() -> None:
    X, y = stream(500, seed=6)
    learner = Learner(LearnerConfig(dim=8, gamma="auto", auto_warmup=200, rehearsal=2, seed=2))
    learner.learn_many(X, y)
    race = learner.race
    arrivals = sum(learner.counts[k] for k in ("triplet_update", "shrunk_update", "passive"))
    assert race["triplets"] == arrivals < 500  # the rehearsed steps are not counted
    assert [r["triplets"] for r in race["rounds"]] == [
        100 * (k + 1) for k in range(arrivals // 100)
    ]


def test_rehearsal_on_the_digits_beats_one_pass_in_held_out_verification() -> None:
    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.5, stratify=y, random_state=0)
    mean, std = X_tr.mean(axis=0), X_tr.std(axis=0)
    std[std == 0] = 1.0
    X_tr, X_te = (X_tr - mean) / std, (X_te - mean) / std
    i, j = np.triu_indices(len(X_te), k=1)

    def auc(model: COPML) -> float:
        Z = model.transform(X_te)
        d2 = ((Z[i] - Z[j]) ** 2).sum(axis=1)
        return float(roc_auc_score(y_te[i] == y_te[j], -d2))

    one_pass = auc(COPML(gamma=0.1, random_state=0).fit(X_tr, y_tr))
    rehearsed = auc(COPML(gamma=0.1, rehearsal=2, random_state=0).fit(X_tr, y_tr))
    assert rehearsed > one_pass + 0.005


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rehearsal": -1}, "rehearsal:"),
        ({"rehearsal": 17}, "rehearsal:"),
        ({"rehearsal": 1.5}, "rehearsal:"),
        ({"rehearsal_memory": 0}, "rehearsal_memory:"),
        ({"rehearsal_memory": 100_001}, "rehearsal_memory:"),
        ({"algorithm": "sgd", "rehearsal": 1}, "rehearsal: not used by algorithm 'sgd'"),
        ({"algorithm": "brm", "rehearsal_memory": 10}, "rehearsal_memory: not used"),
    ],
)
def test_out_of_range_rehearsal_settings_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LearnerConfig(dim=4, **kwargs)


def test_defaults_and_a_state_that_does_not_match_the_config() -> None:
    config = LearnerConfig(dim=4)
    assert (config.rehearsal, config.rehearsal_memory) == (0, 1000)
    assert (
        "rehearsal" not in Learner(config).to_state()[1]
    )  # one pass keeps its checkpoint as it was
    learner = Learner(LearnerConfig(dim=4, rehearsal=1))
    learner.learn_many(np.eye(4), ["a", "b", "a", "b"])
    arrays, meta = learner.to_state()
    del meta["rehearsal"]
    with pytest.raises(ValueError, match="rehearsal"):
        Learner.from_state(arrays, meta)
    arrays, meta = learner.to_state()
    arrays["rehearsal_rows"] = arrays["rehearsal_rows"][:2]
    with pytest.raises(ValueError, match="rehearsal"):
        Learner.from_state(arrays, meta)
