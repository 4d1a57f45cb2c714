"""step="scaled": the paper's rule in units of the running mean squared difference S_t.

The derivation (service.core.update): the paper's step on x / sqrt(S_t) is the step with
gamma_t = gamma / S_t and margin_t = margin S_t (Eqs. 4, 12, 20), and S_t -> c^2 S_t under
x -> c x, so decisions and L do not depend on the input scale.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.update import SCALE_HORIZON


def classes(n: int, d: int, c: int, seed: int, spread: float = 1.0) -> tuple[np.ndarray, list]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, size=n)
    X = spread * rng.normal(size=(c, d))[y] + rng.normal(size=(n, d))
    X[:12] = X[0] + 0.3 * rng.normal(size=(12, d))  # a single-class prefix: COPML pair steps
    y[:12] = y[0]
    return X, [int(v) for v in y]


def run(config: LearnerConfig, X: np.ndarray, y: list) -> tuple[Learner, np.ndarray, np.ndarray]:
    learner = Learner(config)
    results = learner.learn_many(X, y)
    return learner, results.codes.copy(), results.values.copy()


@pytest.mark.parametrize("algorithm", ["opml", "copml"])
@pytest.mark.parametrize("c", [2.0**-10, 2.0**10, 1e-3, 1e3])
def test_scaling_the_input_changes_no_decision_and_not_L(algorithm: str, c: float) -> None:
    X, y = classes(500, 12, 4, seed=1, spread=0.4)
    config = LearnerConfig(dim=12, algorithm=algorithm, margin=1.0, seed=3)  # type: ignore[arg-type]
    base, codes, values = run(config, X, y)
    scaled, codes_c, values_c = run(config, c * X, y)
    assert base.counts["triplet_update"] > 50 and base.counts["passive"] > 50
    assert np.array_equal(codes, codes_c)  # every hinge decision (Eq. 4) is the same
    if np.log2(c).is_integer():  # powers of two scale S_t exactly: bit for bit
        assert np.array_equal(scaled.L, base.L)
    else:
        assert np.allclose(scaled.L, base.L, rtol=1e-9, atol=1e-12)
    # hinge, d_pos, d_neg are squared lengths (c^2); gamma_t = gamma / S_t (1 / c^2).
    for column, power in ((0, 2), (1, 2), (2, 2), (3, -2)):
        col, col_c = values[:, column], values_c[:, column]
        ok = np.isfinite(col)
        assert np.array_equal(ok, np.isfinite(col_c))
        assert np.allclose(col_c[ok], c**power * col[ok], rtol=1e-9, atol=0)
    cal, cal_c = base.calibrator.calibration(), scaled.calibrator.calibration()
    assert cal.threshold is not None and cal_c.threshold is not None
    assert cal_c.threshold == pytest.approx(c**2 * cal.threshold, rel=1e-9)
    assert cal_c.eer == cal.eer
    assert scaled.effective["margin"] == pytest.approx(c**2 * base.effective["margin"], rel=1e-12)


def test_the_paper_rule_is_not_scale_free() -> None:
    """The same check fails for step='paper': the test above could fail."""
    X, y = classes(500, 12, 4, seed=1, spread=0.4)
    config = LearnerConfig(dim=12, step="paper", gamma=1e-3, seed=3)
    _, codes, _ = run(config, X, y)
    _, codes_c, _ = run(config, 1e3 * X, y)
    assert not np.array_equal(codes, codes_c)


def reference(X: np.ndarray, y: list, config: LearnerConfig) -> tuple[np.ndarray, float]:
    """The scaled rule written out from its definition, with inverse matrices (Eqs. 12, 20):
    the paper's step with gamma / S_t and margin S_t, S_t the running mean of every
    difference vector's squared norm so far (the current ones included)."""
    d = X.shape[1]
    L = np.eye(d)
    rng = np.random.default_rng(config.seed)
    buffer: dict[int, np.ndarray] = {}
    seen: list[int] = []
    mean, count = 0.0, 0

    def observe(v: np.ndarray) -> None:
        nonlocal mean, count
        count += 1
        mean += (v @ v - mean) / min(count, SCALE_HORIZON)

    for x, label in zip(X, y, strict=True):
        u = rng.random()  # one draw per sample (Sec. III-A, as the learner does)
        if label not in buffer:
            buffer[label] = x
            seen.append(label)
            continue
        if len(seen) == 1:  # COPML pair step (Eq. 20)
            delta = x - buffer[label]
            observe(delta)
            g = config.gamma_pair / mean
            L = L @ np.linalg.inv(np.eye(d) + g * np.outer(delta, delta))
        else:
            others = [k for k in seen if k != label]
            a, b = x - buffer[label], x - buffer[others[int(u * len(others))]]
            observe(a)
            observe(b)
            hinge = config.margin * mean + np.sum((L @ a) ** 2) - np.sum((L @ b) ** 2)
            if hinge > 0:
                A = np.outer(a, a) - np.outer(b, b)
                L = L @ np.linalg.inv(np.eye(d) + (config.gamma / mean) * A)  # type: ignore[operator]
        buffer[label] = x
    return L, mean


def test_scaled_rule_equals_its_definition() -> None:
    X, y = classes(150, 6, 3, seed=7, spread=1.0)
    config = LearnerConfig(dim=6, gamma=0.2, gamma_pair=0.3, margin=2.0, seed=5)
    learner = Learner(config)
    learner.learn_many(X, y)
    L, mean = reference(X, y, config)
    assert learner.counts["pair_update"] >= 11 and learner.counts["triplet_update"] > 20
    assert np.allclose(learner.L, L, rtol=1e-9, atol=1e-12)
    eff = learner.effective
    assert eff["scale"] == pytest.approx(mean, rel=1e-12)
    assert eff["gamma"] == pytest.approx(0.2 / mean, rel=1e-12)
    assert eff["gamma_pair"] == pytest.approx(0.3 / mean, rel=1e-12)
    assert eff["margin"] == pytest.approx(2.0 * mean, rel=1e-12)


def test_step_result_gamma_is_the_step_of_eq_12_in_input_units() -> None:
    X, y = classes(80, 5, 3, seed=2)
    learner = Learner(LearnerConfig(dim=5, gamma=0.1, margin=5.0, seed=1))
    for x, label in zip(X, y, strict=True):
        scale_before = learner.effective["scale"]
        r = learner.learn_one(x, label)
        if r.outcome == "triplet_update":
            # S_t includes this triplet's two differences: gamma_t = 0.1 / S_t
            assert scale_before is not None
            assert r.gamma == pytest.approx(0.1 / learner.effective["scale"], rel=1e-12)


def test_scaled_default_keeps_issue_14_stream_usable() -> None:
    """Z-scored high-d Gaussian classes. The paper's gamma = 1e-3 leaves Lemma 2's
    region on most triplets; the scaled default stays in it and keeps the classes apart."""
    d = 512
    rng = np.random.default_rng(14)
    centres = 0.5 * rng.normal(size=(10, d))
    y = rng.integers(0, 10, size=1200)
    X = centres[y] + rng.normal(size=(1200, d))
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    default = Learner(LearnerConfig(dim=d, seed=0))
    default.learn_many(X[:800], y[:800])
    paper = Learner(LearnerConfig(dim=d, step="paper", seed=0))
    paper.learn_many(X[:800], y[:800])
    assert default.counts["shrunk_update"] == 0 and default.health["times_tripped"] == 0
    assert paper.counts["shrunk_update"] >= 3 and paper.health["times_tripped"] >= 1
    assert paper.health["state"] != "ok"  # flagged, not silent
    # held-out nearest-neighbour accuracy of the default stays that of Euclidean (100 %)
    Z_train, Z_test = default.transform(X[:800]), default.transform(X[800:])
    squared = (Z_test**2).sum(1)[:, None] + (Z_train**2).sum(1)[None] - 2 * Z_test @ Z_train.T
    nearest = np.argmin(squared, axis=1)
    assert np.mean(y[:800][nearest] == y[800:]) == 1.0
