"""Property-based streams: whatever arrives, L stays finite and the invariants hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import OUTCOMES, Learner, LearnerConfig
from service.core.config import GRADIENT_ALGORITHMS

SCALES = [1e-150, 1e-8, 1.0, 1e4, 1e100, 1e150, 1e300]


@st.composite
def streams(draw: st.DrawFn) -> tuple[LearnerConfig, np.ndarray, list[int]]:
    d = draw(st.integers(1, 12))
    n = draw(st.integers(1, 150))
    kind = draw(st.sampled_from(["one_class", "many_classes", "few_classes", "repeated"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from(SCALES))
    X = rng.normal(size=(n, d)) * scale
    if kind == "one_class":
        y = [0] * n
    elif kind == "many_classes":
        y = [int(v) for v in rng.integers(0, max(n // 2, 1), size=n)]
    elif kind == "few_classes":
        y = [int(v) for v in rng.integers(0, 3, size=n)]
    else:  # the same sample, over and over, under a couple of labels
        X[:] = X[0]
        y = [int(v) for v in rng.integers(0, 2, size=n)]
    algorithm = draw(st.sampled_from(["opml", "copml", "sgd", "sgd_psd", "brm"]))
    if algorithm in ("opml", "copml"):
        step = draw(st.sampled_from(["scaled", "paper"]))
        if step == "paper":  # the paper's units: anything in range, extremes included
            gamma: float | str = draw(st.sampled_from([1e-6, 1e-3, 0.2, 1.0, 1e6]))
            gamma_pair = draw(st.sampled_from([1e-3, 0.5, 1e6]))
            margin = draw(st.sampled_from([1e-6, 1.0, 1e6, 1e12]))
        else:
            gamma = draw(st.sampled_from([1e-6, 1e-3, 0.1, 1.0, "auto"]))
            gamma_pair = draw(st.sampled_from([1e-6, 0.1, 1.0]))
            margin = draw(st.sampled_from([1e-6, 1.0, 100.0]))
        own: dict[str, object] = {
            "step": step,
            "gamma": gamma,
            "auto_warmup": draw(st.sampled_from([10, 40, 1000])),
        }
    else:
        steps = [1e-6, 1e-3, 0.2, 1.0, 1e6]
        own = {
            "eta": draw(st.sampled_from(steps)),
            "step": draw(st.sampled_from(["constant", "descent", "invsqrt"])),
            "lam": draw(st.sampled_from([0.0, 1e-9, 0.4e-6])),  # 2 eta lam < 1 for every eta
        }
        if algorithm != "brm":
            own["mu"] = draw(st.sampled_from([0.0, 1e-300, 0.1, 1e6]))
        gamma_pair = draw(st.sampled_from([1e-3, 0.5, 1e6])) if algorithm != "sgd" else 0.5
        margin = draw(st.sampled_from([1e-6, 0.5] if algorithm == "brm" else [1e-6, 1.0, 1e6]))
    config = LearnerConfig(
        dim=d,
        algorithm=algorithm,
        gamma_pair=gamma_pair,
        margin=margin,
        normalize=draw(st.sampled_from(["none", "l2"])),
        seed=seed,
        **own,  # type: ignore[arg-type]
    )
    return config, X, y


@settings(max_examples=150, deadline=None)
@given(streams())
def test_any_stream_keeps_L_finite_and_counts_consistent(case) -> None:
    config, X, y = case
    learner = Learner(config)
    results = learner.learn_many(X, y)
    assert np.isfinite(learner.L).all()
    assert learner.version == len(y) == len(results)
    assert sum(learner.counts.values()) == len(y)
    assert set(learner.counts) == set(OUTCOMES)
    assert learner.n_classes == len(set(y))
    for r in results:
        assert r.outcome in OUTCOMES
        for value in (r.hinge, r.d_pos, r.d_neg, r.gamma):
            assert value is None or np.isfinite(value)
        if r.outcome == "passive":
            assert r.hinge is not None and r.hinge <= 0
        if r.outcome in ("triplet_update", "shrunk_update"):
            assert config.gamma is not None
            assert r.hinge is not None and r.hinge > 0
            assert r.gamma is not None and r.gamma > 0
            if config.step == "paper":  # in input units; the monitor may only lower it
                assert r.gamma <= config.gamma  # type: ignore[operator]
        if r.outcome == "sgd_update":
            assert config.eta is not None and r.gamma is not None and 0 < r.gamma <= config.eta
            assert r.hinge is not None and (r.hinge > 0 or config.mu)
        if r.outcome == "pair_update":
            assert config.algorithm in ("copml", "sgd")
    if config.algorithm in ("opml", "sgd_psd", "brm"):
        assert learner.counts["pair_update"] == 0
    if config.algorithm in GRADIENT_ALGORITHMS:
        assert learner.counts["triplet_update"] == learner.counts["shrunk_update"] == 0
        assert learner.health is None and learner.effective is None
    else:
        assert learner.counts["sgd_update"] == 0
        health = learner.health
        assert health is not None and np.isfinite(health["frobenius_norm"])
        assert health["frobenius_norm"] == pytest.approx(np.linalg.norm(learner.L), rel=1e-6)
        assert 0 < health["step_scale"] <= 1
    stability = learner.stability()
    assert stability.n_samples == len(y)
    assert stability.gamma_hat is None or config.algorithm == "sgd_psd"
    cal = learner.calibrator.calibration()
    measured = ("triplet_update", "shrunk_update", "passive", "sgd_update")
    triplets = sum(learner.counts[k] for k in measured)
    assert cal.pairs == min(triplets, learner.calibrator.window)


@settings(max_examples=60, deadline=None)
@given(streams(), st.integers(0, 10**6))
def test_queries_after_any_stream_are_finite_or_overflow_honestly(case, cut) -> None:
    config, X, y = case
    learner = Learner(config)
    learner.learn_many(X, y)
    a, b = X[cut % len(X)], X[(cut + 1) % len(X)]
    d2 = learner.squared_distance(a, b)
    assert d2 >= 0 and not np.isnan(d2)
    if np.isfinite(d2):
        assert np.isclose(np.sqrt(d2), learner.distance(a, b))
    assert not np.isnan(learner.transform(X[:3])).any()
    assert 0.0 <= learner.restricted_distance(a, b) < 1.0


@settings(max_examples=40, deadline=None)
@given(streams(), st.integers(0, 10**6))
def test_resume_anywhere_is_bit_identical(case, cut) -> None:
    config, X, y = case
    cut %= len(y) + 1
    whole = Learner(config)
    whole.learn_many(X, y)
    part = Learner(config)
    if cut:
        part.learn_many(X[:cut], y[:cut])
    resumed = Learner.from_state(*part.to_state())
    if cut < len(y):
        resumed.learn_many(X[cut:], y[cut:])
    assert np.array_equal(resumed.L, whole.L)
    assert resumed.to_state()[1] == whole.to_state()[1]
