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


@pytest.mark.parametrize("algorithm", ["opml", "copml", "sgd", "sgd_psd", "brm"])
@pytest.mark.parametrize("seed", range(5))
def test_resume_at_a_random_cut_is_bit_identical(algorithm: str, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    d = int(rng.choice([2, 21, 64]))
    X, y = make_stream(600, d, int(rng.integers(2, 12)), seed)
    config = LearnerConfig(
        dim=d,
        algorithm=algorithm,  # type: ignore[arg-type]
        seed=seed,
        calibration_window=50,
        **HYPERPARAMETERS[algorithm],
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
    with pytest.raises(ValueError, match="unsupported format"):
        Learner.from_state(arrays, {**meta, "format": 99})
    with pytest.raises(ValueError, match="L: contains NaN"):
        Learner.from_state({**arrays, "L": np.full((3, 3), np.nan)}, meta)
