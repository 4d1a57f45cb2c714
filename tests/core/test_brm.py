"""The boundary-restricted distance and online BRM-R (the BRM paper; docs/algorithms/brm.md)."""

from __future__ import annotations

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.brm import RESTRICTIONS, brm_step, canonical_factor, restricted_squared_norms


def brm_learner(L: np.ndarray, algorithm: str = "brm") -> Learner:
    learner = Learner(LearnerConfig(dim=L.shape[0], algorithm=algorithm))  # type: ignore[arg-type]
    learner.set_metric(L)
    return learner


def mixed_scale_points(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-3, 3, size=(n, 1))


def test_range_identity_and_symmetry() -> None:
    """0 <= D_R < 1 for random and 1e100-magnitude inputs; D_R(x, x) = 0; symmetric."""
    d = 6
    rng = np.random.default_rng(0)
    learner = brm_learner(np.eye(d) + 0.5 * rng.normal(size=(d, d)))
    for scale in (1e-3, 1.0, 30.0, 1e100, 1e300):
        X = rng.normal(size=(50, d)) * scale
        Y = rng.normal(size=(50, d)) * scale
        for x, y in zip(X, Y, strict=True):
            dist = learner.restricted_distance(x, y)
            assert 0.0 <= dist < 1.0
            assert dist == learner.restricted_distance(y, x)
            assert learner.restricted_distance(x, x) == 0.0
        squared = learner.restricted_squared_pairs(X, Y)
        assert ((squared >= 0) & (squared < 1)).all()
    assert learner.restricted_distance(np.full(d, 1e308), np.full(d, -1e308)) < 1.0


@pytest.mark.parametrize("restriction", sorted(RESTRICTIONS))
def test_triangle_inequality_theorem_2(restriction: str) -> None:
    """No violation (tolerance 1e-12) over 1e5 random triples of mixed scales."""
    d, n = 5, 100_000
    rng = np.random.default_rng(1)
    L = rng.normal(size=(d, d))
    X, Y, Z = (mixed_scale_points(n, d, rng) for _ in range(3))

    def dist(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
        return np.sqrt(restricted_squared_norms((P - Q) @ L.T, restriction))

    violations = dist(X, Z) - (dist(X, Y) + dist(Y, Z))
    assert (violations <= 1e-12).all(), violations.max()
    assert np.median(dist(X, Z)) > 0.1  # not all saturated nor all zero


def test_learner_triangle_inequality_and_table_1_sup() -> None:
    d, n = 5, 20_000
    rng = np.random.default_rng(2)
    learner = brm_learner(rng.normal(size=(d, d)))
    X, Y, Z = (mixed_scale_points(n, d, rng) for _ in range(3))

    def dist(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
        return np.sqrt(learner.restricted_squared_pairs(P, Q))

    assert (dist(X, Z) <= dist(X, Y) + dist(Y, Z) + 1e-12).all()
    for name, (R, B, slope) in RESTRICTIONS.items():
        t = np.array([0.0, 1e-8, 1.0, 1e300, np.inf])
        r = R(t)
        assert r[0] == 0.0 and (np.diff(r) >= 0).all() and r[-1] == pytest.approx(B), name
        assert r[1] / 1e-8 == pytest.approx(slope, rel=1e-6), name


def test_small_scale_limit_theorem_3() -> None:
    """|D_{cL}/c - R'(0) d_L| / (R'(0) d_L) <= 1e-4 at c = 1e-3 (d_L with the 1/h
    normalisation, p = 2)."""
    d = 8
    rng = np.random.default_rng(3)
    L = rng.normal(size=(d, d))
    c = 1e-3
    learner = brm_learner(c * L)
    for _ in range(200):
        x, y = rng.normal(size=d), rng.normal(size=d)
        d_L = np.sqrt(np.sum((L @ (x - y)) ** 2) / d)
        limit = 0.5 * d_L  # Sigmoid: R'(0) = 1/2
        assert abs(learner.restricted_distance(x, y) / c - limit) <= 1e-4 * limit


@pytest.mark.parametrize("seed", range(5))
def test_brm_step_is_minus_eta_times_the_loss_gradient(seed: int) -> None:
    """The online BRM-R step's direction against central finite differences of
    ell(L) = D_R^2(L a) - D_R^2(L b) + tau (relative 1e-6)."""
    d, eta, tau = 6, 1e-3, 0.1
    rng = np.random.default_rng(seed)
    L0 = np.eye(d) + 0.5 * rng.normal(size=(d, d))
    a, b = 1.5 * rng.normal(size=d), 0.5 * rng.normal(size=d)

    def ell(L: np.ndarray) -> float:
        return float(restricted_squared_norms(np.stack([L @ a, L @ b])) @ [1.0, -1.0] + tau)

    assert ell(L0) > 0
    L = L0.copy()
    r = brm_step(L, np.stack([a, b]), eta=eta, margin=tau)
    assert r.outcome == "sgd_update" and r.hinge == pytest.approx(ell(L0), rel=1e-12)
    grad = (L0 - L) / eta
    E = rng.normal(size=(d, d))
    h = 1e-6
    fd = (ell(L0 + h * E) - ell(L0 - h * E)) / (2 * h)
    assert float(np.sum(grad * E)) == pytest.approx(fd, rel=1e-6)


def test_canonical_factor_depends_on_M_only() -> None:
    """After canonicalisation, Q L gives the BRM distance of L (distinct eigenvalues);
    without it (a brm learner uses its own L) the rotation changes it."""
    d = 6
    rng = np.random.default_rng(4)
    L = rng.normal(size=(d, d))
    assert np.min(np.diff(np.linalg.eigvalsh(L.T @ L))) > 1e-3  # distinct
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    assert np.allclose(np.abs(canonical_factor(Q @ L)), np.abs(canonical_factor(L)))
    X, Y = rng.normal(size=(100, d)), rng.normal(size=(100, d))
    plain, rotated = brm_learner(L, "opml"), brm_learner(Q @ L, "opml")
    assert np.allclose(
        plain.restricted_squared_pairs(X, Y), rotated.restricted_squared_pairs(X, Y), rtol=1e-10
    )
    own, own_rotated = brm_learner(L), brm_learner(Q @ L)
    assert not np.allclose(
        own.restricted_squared_pairs(X, Y), own_rotated.restricted_squared_pairs(X, Y)
    )
    # The Mahalanobis distance is the same for both, as it must be.
    rotated_mahalanobis = own_rotated.squared_distance(X[0], Y[0])
    assert own.squared_distance(X[0], Y[0]) == pytest.approx(rotated_mahalanobis)


@pytest.mark.parametrize("seed", range(10))
def test_descent_rule_never_increases_the_loss(seed: int) -> None:
    """The derived cap: eta beta <= 2 with beta = (||a||^2 + ||b||^2) / (2 d) is a descent
    step for the restricted loss (descent lemma), so eta_t = kappa / beta is one."""
    d, tau = 5, 0.2
    rng = np.random.default_rng(seed)
    L0 = rng.normal(size=(d, d))
    a, b = rng.normal(size=d), 0.3 * rng.normal(size=d)

    def ell(L: np.ndarray) -> float:
        return float(restricted_squared_norms(np.stack([L @ a, L @ b])) @ [1.0, -1.0] + tau)

    beta = (a @ a + b @ b) / (2 * d)
    for k in (0.5, 1.0, 2.0):
        L = L0.copy()
        if brm_step(L, np.stack([a, b]), eta=k / beta, margin=tau).outcome == "sgd_update":
            assert ell(L) <= ell(L0) + 1e-12
    L = L0.copy()
    r = brm_step(L, np.stack([a, b]), eta=1e9, margin=tau, step="descent", kappa=0.5)
    assert r.outcome == "passive" or r.gamma == pytest.approx(0.5 / beta)


def test_kernel_and_queries_agree_and_the_calibrator_is_in_restricted_units() -> None:
    d = 4
    rng = np.random.default_rng(5)
    centres = 2.0 * rng.normal(size=(3, d))
    y = rng.integers(0, 3, size=400)
    X = centres[y] + rng.normal(size=(400, d))
    learner = Learner(LearnerConfig(dim=d, algorithm="brm", seed=3))
    learner.learn_many(X[:200], y[:200])
    x, label = X[200], int(y[200])
    expected = learner.restricted_squared_distance(x, learner.buffer(label))
    r = learner.learn_one(x, label)
    assert r.d_pos == pytest.approx(expected, rel=1e-12)
    learner.learn_many(X[201:], y[201:])
    cal = learner.calibrator.calibration()
    assert cal.calibrated and cal.threshold is not None and 0.0 <= cal.threshold < 1.0
    assert cal.accuracy is not None and cal.accuracy > 0.6
