"""Held-out routing, the reservoir, the PAC-Bayes prefix prior and window, and certificates
through the learner."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.certificates import NotEnoughHeldOut
from service.core.certificates.held_out import certify_held_out
from service.core.holdout import HELD_OUT, SampleWindow


def stream(n: int, d: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = 2.0 * rng.normal(size=(classes, d))
    y = rng.integers(0, classes, size=n)
    return centres[y] + rng.normal(size=(n, d)), y


def round_trip(learner: Learner) -> Learner:
    """Through bytes and JSON text, the way the service stores a checkpoint."""
    arrays, meta = learner.to_state()
    stored = {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in arrays.items()}
    loaded = {
        k: np.frombuffer(raw, dtype=np.dtype(dt)).reshape(shape)
        for k, (dt, shape, raw) in stored.items()
    }
    return Learner.from_state(loaded, json.loads(json.dumps(meta)))


def assert_same_state(a: Learner, b: Learner) -> None:
    arrays_a, meta_a = a.to_state()
    arrays_b, meta_b = b.to_state()
    assert meta_a == meta_b
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        assert np.array_equal(arrays_a[key], arrays_b[key]), key


def held_mask(results) -> np.ndarray:
    return np.asarray(results.codes) == HELD_OUT


# -- routing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["opml", "copml"])
@pytest.mark.parametrize("normalize", ["none", "l2"])
def test_L_equals_a_core_run_on_the_non_held_out_subsequence(algorithm, normalize) -> None:
    X, y = stream(3000, 8, 6, seed=1)
    flags = np.random.default_rng(2).random(3000) < 0.05  # a caller's validation samples too
    base = {"dim": 8, "algorithm": algorithm, "normalize": normalize, "gamma": 0.01, "seed": 4}
    learner = Learner(LearnerConfig(**base, holdout=0.2, calibration_window=300))
    held = held_mask(learner.learn_many(X, y, holdout=flags))
    assert held[flags].all()  # a flagged sample is always held out
    assert 0.2 * 3000 < held.sum() < 0.3 * 3000  # ~ 0.05 + 0.95 * 0.2 = 0.24
    plain = Learner(LearnerConfig(**base, calibration_window=300))
    plain.learn_many(X[~held], y[~held])
    assert np.array_equal(learner.L, plain.L)  # bit for bit
    # held-out samples never entered the buffer H or the calibrator
    assert learner.classes == plain.classes
    for key in plain.classes:
        assert np.array_equal(learner.buffer(key), plain.buffer(key))
    assert np.array_equal(learner.calibrator.to_state()[0], plain.calibrator.to_state()[0])
    assert learner.calibrator.calibration() == plain.calibrator.calibration()
    # they count in the version, as their own outcome
    assert learner.version == 3000
    assert learner.counts["held_out"] == held.sum()
    assert sum(learner.counts.values()) == learner.version
    for name, n in plain.counts.items():
        if name != "held_out":
            assert learner.counts[name] == n


def test_held_out_sample_of_a_new_class_is_not_a_class_of_the_learner() -> None:
    learner = Learner(LearnerConfig(dim=2))
    learner.learn_one([0.0, 1.0], "a")
    learner.learn_one([1.0, 0.0], "a")
    before = learner.buffer("a")
    r = learner.learn_one([5.0, 5.0], "a", holdout=True)
    assert r.outcome == "held_out" and r.d_pos is None and r.gamma is None
    assert np.array_equal(learner.buffer("a"), before)
    assert learner.learn_one([3.0, 3.0], "b", holdout=True).outcome == "held_out"
    assert learner.classes == ["a"]
    assert learner.version == 4


def test_routing_looks_at_neither_features_nor_labels_and_draws_one_uniform_each() -> None:
    config = LearnerConfig(dim=3, holdout=0.3, seed=9)
    X1, y1 = stream(2000, 3, 4, seed=1)
    X2, y2 = stream(2000, 3, 50, seed=2)
    first = held_mask(Learner(config).learn_many(X1, y1))
    second = held_mask(Learner(config).learn_many(X2, y2))
    assert np.array_equal(first, second)
    # caller flags do not shift the routing of the other samples
    flags = np.zeros(2000, dtype=bool)
    flags[::7] = True
    flagged = held_mask(Learner(config).learn_many(X1, y1, holdout=flags))
    assert np.array_equal(flagged, first | flags)
    # the routed fraction is rho (binomial: within 5 standard errors)
    assert abs(first.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / 2000)


def test_learn_one_equals_learn_many_whatever_the_batching() -> None:
    X, y = stream(1500, 5, 5, seed=3)
    flags = np.random.default_rng(1).random(1500) < 0.1
    config = LearnerConfig(
        dim=5, holdout=0.15, holdout_window=300, pac_bayes_prefix=500, pac_bayes_window=200
    )
    whole = Learner(config)
    whole.learn_many(X, y, holdout=flags)
    one = Learner(config)
    for x, label, flag in zip(X, y, flags, strict=True):
        one.learn_one(x, label, holdout=bool(flag))
    assert_same_state(one, whole)
    batches = Learner(config)
    cuts = np.sort(np.random.default_rng(2).choice(np.arange(1, 1500), 40, replace=False))
    for part in np.split(np.arange(1500), cuts):
        batches.learn_many(X[part], y[part], holdout=flags[part])
    assert_same_state(batches, whole)


def test_holdout_zero_draws_nothing_and_keeps_the_state_unchanged() -> None:
    X, y = stream(300, 4, 3)
    learner = Learner(LearnerConfig(dim=4))
    learner.learn_many(X, y)
    arrays, meta = learner.to_state()
    assert set(arrays) == {"L", "buffer", "calibration"}
    assert meta["holdout"]["routed"] == 0 and meta["holdout"]["trained"] == 300


# -- the reservoir ---------------------------------------------------------------------------


def test_reservoir_is_the_last_window_of_held_out_samples_after_normalize() -> None:
    X, y = stream(4000, 6, 7, seed=5)
    learner = Learner(LearnerConfig(dim=6, normalize="l2", holdout=0.3, holdout_window=500))
    held = held_mask(learner.learn_many(X, y))
    rows, labels, classes = learner.holdout.reservoir.samples()
    want = X[held][-500:]
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    assert np.allclose(rows, want, rtol=1e-15, atol=0)
    assert [classes[c] for c in labels] == [str(v) for v in y[held][-500:]]
    assert learner.holdout.reservoir.total == held.sum()


def test_sample_window_forgets_classes_that_left_it() -> None:
    window = SampleWindow(capacity=4, dim=1)
    for i in range(100):  # a new class every sample: the key table is compacted
        window.extend(np.array([[float(i)]]), [f"c{i}"])
        assert len(window._keys) <= 2 * 4 + 1
    rows, labels, classes = window.samples()
    assert rows.ravel().tolist() == [96.0, 97.0, 98.0, 99.0]
    assert classes == ["c96", "c97", "c98", "c99"] and labels.tolist() == [0, 1, 2, 3]
    window.extend(np.arange(10.0)[:, None], ["x"] * 10)  # more than the capacity at once
    assert window.samples()[0].ravel().tolist() == [6.0, 7.0, 8.0, 9.0]
    assert window.total == 110


# -- state -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_resume_gives_the_same_reservoir_window_prior_and_L(seed: int) -> None:
    rng = np.random.default_rng(seed)
    X, y = stream(2500, 5, 6, seed=seed)
    flags = rng.random(2500) < 0.05
    config = LearnerConfig(
        dim=5,
        gamma=0.01,
        holdout=0.2,
        holdout_window=400,
        pac_bayes_prefix=int(rng.integers(1, 1500)),
        pac_bayes_window=300,
        seed=seed,
    )
    whole = Learner(config)
    whole.learn_many(X, y, holdout=flags)
    cut = int(rng.integers(0, 2500))
    first = Learner(config)
    first.learn_many(X[:cut], y[:cut], holdout=flags[:cut]) if cut else None
    resumed = round_trip(first)
    resumed.learn_many(X[cut:], y[cut:], holdout=flags[cut:])
    assert_same_state(resumed, whole)
    for window in ("reservoir", "bound_window"):
        a = getattr(resumed.holdout, window).samples()
        b = getattr(whole.holdout, window).samples()
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert np.array_equal(resumed.holdout.prior, whole.holdout.prior)
    assert resumed.certificate() == whole.certificate()


def test_inconsistent_holdout_state_is_refused() -> None:
    X, y = stream(400, 3, 3)
    learner = Learner(LearnerConfig(dim=3, holdout=0.3, pac_bayes_prefix=100, pac_bayes_window=50))
    learner.learn_many(X, y)
    arrays, meta = learner.to_state()
    with pytest.raises(ValueError, match="holdout: the state has no rows"):
        Learner.from_state({k: v for k, v in arrays.items() if k != "holdout"}, meta)
    with pytest.raises(ValueError, match="pac_bayes_prior: present if and only if"):
        Learner.from_state({k: v for k, v in arrays.items() if k != "pac_bayes_prior"}, meta)
    bad = json.loads(json.dumps(meta))
    bad["holdout"]["reservoir"]["labels"][0] = 99
    with pytest.raises(ValueError, match="holdout: rows, labels and count do not match"):
        Learner.from_state(arrays, bad)
    nan = dict(arrays, holdout=np.full_like(arrays["holdout"], np.nan))
    with pytest.raises(ValueError, match="holdout: row 0 contains NaN"):
        Learner.from_state(nan, meta)


# -- PAC-Bayes bookkeeping -------------------------------------------------------------------


def test_prior_is_L_after_exactly_the_prefix_and_the_window_follows_it() -> None:
    X, y = stream(1200, 4, 4, seed=7)
    config = LearnerConfig(
        dim=4, gamma=0.02, holdout=0.25, pac_bayes_prefix=333, pac_bayes_window=100
    )
    learner = Learner(config)
    held = np.zeros(1200, dtype=bool)
    for part in np.array_split(np.arange(1200), 7):  # the prefix ends inside a batch
        held[part] = held_mask(learner.learn_many(X[part], y[part]))
    train = np.flatnonzero(~held)
    plain = Learner(LearnerConfig(dim=4, gamma=0.02))
    plain.learn_many(X[train[:333]], y[train[:333]])
    assert np.array_equal(learner.holdout.prior, plain.L)
    rows, labels, classes = learner.holdout.bound_window.samples()
    assert np.array_equal(rows, X[train[-100:]])
    assert [classes[c] for c in labels] == [str(v) for v in y[train[-100:]]]
    assert learner.holdout.bound_window.total == len(train) - 333


def test_pac_bayes_certificate_through_the_learner() -> None:
    X, y = stream(6000, 4, 4, seed=8)
    learner = Learner(
        LearnerConfig(dim=4, gamma=0.01, pac_bayes_prefix=1000, pac_bayes_window=2100)
    )
    with pytest.raises(NotEnoughHeldOut, match="prior is frozen after 1000"):
        learner.certificate(method="pac-bayes")
    learner.learn_many(X, y)
    c = learner.certificate(method="pac-bayes")
    assert c.certifies == "gibbs" and c.samples == 2100 and c.version == 6000
    assert c.details["prior_prefix"] == 1000
    for name in ("triplet_error", "false_accept", "false_reject"):
        b = getattr(c, name)
        assert 0 <= b.empirical <= b.bound <= 1 and b.sigma is not None


# -- certificates through the learner --------------------------------------------------------


def test_held_out_certificate_of_the_served_metric() -> None:
    X, y = stream(20000, 6, 5, seed=9)
    learner = Learner(LearnerConfig(dim=6, gamma=0.01, holdout=0.2, holdout_window=3000))
    learner.learn_many(X, y)
    c = learner.certificate(delta=0.05)
    cal = learner.calibrator.calibration()
    assert (c.threshold, c.threshold_source) == (cal.threshold, "calibrated")
    assert c.samples == 3000 and c.classes == 5 and c.window == 3000 and c.version == 20000
    # the same as certifying the reservoir with the pure function
    rows, labels, _ = learner.holdout.reservoir.samples()
    same = certify_held_out(
        learner.L,
        rows,
        labels,
        cal.threshold,
        "calibrated",
        seed=0,
        version=20000,
        window=3000,
        stream=learner.holdout.reservoir.total,
    )
    assert c == same
    for name in ("triplet_error", "false_accept", "false_reject"):
        b = getattr(c, name)
        assert b.m >= 400 and b.empirical <= b.bound <= 1
    own = learner.certificate(threshold=2.0 * cal.threshold)
    assert own.threshold_source == "caller"
    assert own.false_accept.errors >= c.false_accept.errors  # a looser threshold accepts more
    assert own.false_reject.errors <= c.false_reject.errors


def test_certificate_errors_by_name_and_when_there_is_nothing_to_certify() -> None:
    X, y = stream(300, 3, 3)
    plain = Learner(LearnerConfig(dim=3))
    plain.learn_many(X, y)
    with pytest.raises(ValueError, match="holdout: this model holds no samples out"):
        plain.certificate()
    with pytest.raises(ValueError, match="method: 'pac-bayes' needs a model configured"):
        plain.certificate(method="pac-bayes")
    with pytest.raises(ValueError, match="delta: must be a number in"):
        plain.certificate(delta=0)
    with pytest.raises(ValueError, match="method: must be one of"):
        plain.certificate(method="bootstrap")  # type: ignore[arg-type]
    routed = Learner(LearnerConfig(dim=3, holdout=0.1))
    routed.learn_many(X, y)
    with pytest.raises(NotEnoughHeldOut) as info:
        routed.certificate()
    assert info.value.have == routed.counts["held_out"] and info.value.needed > 0
    with pytest.raises(ValueError, match="threshold: must be a finite number >= 0"):
        routed.certificate(threshold=-1.0)
    # a caller's validation set, without a holdout fraction
    plain.learn_many(*stream(700, 3, 3, seed=1), holdout=True)
    assert plain.certificate().samples == 700


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("holdout", "message"),
    [
        ([True, False], "holdout: expected 3 booleans"),
        ([1, 0, 1], "holdout: expected booleans, got dtype int64"),
        ("yes", "holdout: expected booleans"),
    ],
)
def test_bad_holdout_flags_change_nothing(holdout, message: str) -> None:
    learner = Learner(LearnerConfig(dim=2, holdout=0.5))
    learner.learn_many(np.eye(2), ["a", "b"])
    before = learner.to_state()
    with pytest.raises(ValueError, match=message):
        learner.learn_many(np.ones((3, 2)), ["a", "b", "a"], holdout=holdout)
    after = learner.to_state()
    assert after[1] == before[1]
    with pytest.raises(ValueError, match="holdout: expected booleans"):
        learner.learn_one([1.0, 0.0], "a", holdout=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("holdout", 0.6, "holdout: must be a number in"),
        ("holdout", -0.1, "holdout: must be a number in"),
        ("holdout", float("nan"), "holdout: must be a number in"),
        ("holdout", True, "holdout: must be a number in"),
        ("holdout_window", 0, "holdout_window: must be in"),
        ("holdout_window", 100_001, "holdout_window: must be in"),
        ("holdout_window", 10.0, "holdout_window: must be an integer"),
        ("pac_bayes_prefix", 0, "pac_bayes_prefix: must be in"),
        ("pac_bayes_window", -1, "pac_bayes_window: must be in"),
    ],
)
def test_config_validation(field: str, value, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LearnerConfig(dim=2, **{field: value})
