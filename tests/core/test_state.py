"""to_state / from_state: JSON-safe, no pickle, and resuming is bit-identical."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.core import Learner, LearnerConfig


def make_stream(n: int, d: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    X = rng.normal(size=(classes, d))[y] + rng.normal(size=(n, d))
    return X, y


def round_trip(learner: Learner) -> Learner:
    """Through bytes and JSON text, the way the service stores a checkpoint."""
    arrays, meta = learner.to_state()
    stored = {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in arrays.items()}
    text = json.dumps(meta)
    loaded = {
        k: np.frombuffer(raw, dtype=np.dtype(dt)).reshape(shape)
        for k, (dt, shape, raw) in stored.items()
    }
    return Learner.from_state(loaded, json.loads(text))


#: Hyperparameters that exercise every path (decay, smoothing, caps) on these streams.
HYPERPARAMETERS = {
    "opml": {"gamma": 0.02, "margin": 2.0},
    "copml": {"gamma": 0.02, "margin": 2.0},
    "sgd": {"eta": 0.02, "mu": 0.2, "lam": 0.05, "step": "invsqrt", "margin": 2.0},
    "sgd_psd": {"eta": 0.02, "lam": 0.05, "margin": 2.0},
    "brm": {"eta": 0.2, "lam": 0.05, "margin": 0.2},
}
#: OPML/COPML under each step rule and gamma="auto"; the gradient learners under their own.
RESUME_CASES = [(a, s) for a in ("opml", "copml") for s in ("scaled", "paper", "auto")] + [
    (a, "own") for a in ("sgd", "sgd_psd", "brm")
]


@pytest.mark.parametrize(("algorithm", "step"), RESUME_CASES)
@pytest.mark.parametrize("seed", range(5))
def test_resume_at_a_random_cut_is_bit_identical(algorithm: str, step: str, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    d = int(rng.choice([2, 21, 64]))
    X, y = make_stream(600, d, int(rng.integers(2, 12)), seed)
    own: dict[str, object] = dict(HYPERPARAMETERS[algorithm])
    if step != "own":
        own["gamma"] = "auto" if step == "auto" else 0.02
        own["step"] = "paper" if step == "paper" else "scaled"
        own["auto_warmup"] = 400  # the cut falls before, inside or after the race
    config = LearnerConfig(
        dim=d,
        algorithm=algorithm,  # type: ignore[arg-type]
        seed=seed,
        calibration_window=50,
        **own,  # type: ignore[arg-type]
    )
    cut = int(rng.integers(0, 600))
    whole = Learner(config)
    whole.learn_many(X, y)
    first = Learner(config)
    first.learn_many(X[:cut], y[:cut]) if cut else None
    resumed = round_trip(first)
    resumed.learn_many(X[cut:], y[cut:])
    assert np.array_equal(resumed.L, whole.L)
    assert resumed.to_state()[1] == whole.to_state()[1]
    assert resumed.calibrator.calibration() == whole.calibrator.calibration()
    assert resumed.stability() == whole.stability()


def test_state_metadata_is_plain_json() -> None:
    X, y = make_stream(100, 4, 3, 0)
    learner = Learner(LearnerConfig(dim=4, seed=2**100))
    learner.learn_many(X, y)
    arrays, meta = learner.to_state()
    assert json.loads(json.dumps(meta)) == meta
    assert set(arrays) == {"L", "buffer", "calibration"}
    assert arrays["buffer"].shape == (3, 4)
    assert all(a.dtype == np.float64 for a in arrays.values())


def test_from_state_rejects_inconsistent_state() -> None:
    X, y = make_stream(50, 3, 2, 1)
    learner = Learner(LearnerConfig(dim=3))
    learner.learn_many(X, y)
    arrays, meta = learner.to_state()
    with pytest.raises(ValueError, match="buffer rows and classes"):
        Learner.from_state(arrays, {**meta, "classes": meta["classes"][:1]})
    for fmt in (1, 99, None):  # one format: no other is read
        with pytest.raises(ValueError, match="unsupported format"):
            Learner.from_state(arrays, {**meta, "format": fmt})
    for name in ("scale", "stability", "holdout"):  # incomplete: refused, never defaulted
        with pytest.raises(ValueError, match=f"state: no '{name}'"):
            Learner.from_state(arrays, {k: v for k, v in meta.items() if k != name})
    with pytest.raises(ValueError, match="L: contains NaN"):
        Learner.from_state({**arrays, "L": np.full((3, 3), np.nan)}, meta)
    with pytest.raises(ValueError, match="stream scale"):
        Learner.from_state(arrays, {**meta, "stream": [float("nan"), 1.0]})
    with pytest.raises(ValueError, match="track state is not finite"):
        bad = [[float("inf")] * len(row) for row in meta["tracks"]["state"]]
        Learner.from_state(arrays, {**meta, "tracks": {**meta["tracks"], "state": bad}})
    with pytest.raises(ValueError, match="race state does not match gamma"):
        Learner.from_state(arrays, {**meta, "config": {**meta["config"], "gamma": "auto"}})


def test_mid_race_state_holds_every_candidate() -> None:
    X, y = make_stream(300, 5, 3, 4)
    learner = Learner(LearnerConfig(dim=5, gamma="auto", auto_warmup=400))
    learner.learn_many(X, y)
    arrays, meta = learner.to_state()
    assert set(arrays) == {
        "L",
        "buffer",
        "calibration",
        "tracks_L",
        "tracks_calibration",
        "race_pairs",
    }
    assert arrays["tracks_L"].shape == (3, 5, 5)  # the 3 candidates, for as long as it learns
    assert arrays["race_pairs"].shape[0] == 3
    assert 0 < arrays["race_pairs"].shape[1] < 200  # the current block's, of 200 triplets
    assert json.loads(json.dumps(meta)) == meta
    resumed = round_trip(learner)
    assert resumed.race == learner.race
    with pytest.raises(ValueError, match="tracks_L does not hold the served L"):
        Learner.from_state({**arrays, "L": arrays["L"] + 1.0}, meta)
