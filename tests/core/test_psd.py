"""M-SGD with PSD projection (docs/algorithms/gradient.md, ``algorithm="sgd_psd"``): the iterate
stays PSD.

The feature-perturbation property is in test_stability.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.psd import psd_step


def project(W: np.ndarray) -> np.ndarray:
    w, V = np.linalg.eigh(W)
    return (V * np.maximum(w, 0.0)) @ V.T


@pytest.mark.parametrize("d", [2, 9, 40])
@pytest.mark.parametrize("mu", [0.0, 0.2])
def test_step_is_the_projected_gradient_step(d: int, mu: float) -> None:
    rng = np.random.default_rng(d)
    L0 = rng.normal(size=(d, d)) / np.sqrt(d)
    a = 2.0 * rng.normal(size=d)  # eta q ||a||^2 > a^T M a / ||a||^2: the projection clips
    b = 0.3 * rng.normal(size=d)
    margin, eta = 1.0, 0.3
    M0 = L0.T @ L0
    z = a @ M0 @ a - b @ M0 @ b + margin
    assert z > 0
    q = 1.0 if mu == 0 else 1 / (1 + np.exp(-z / mu))
    W = M0 - eta * q * (np.outer(a, a) - np.outer(b, b))
    assert np.linalg.eigvalsh(W)[0] < -1e-3  # the unprojected step leaves the cone
    L = L0.copy()
    r = psd_step(L, np.stack([a, b]), eta=eta, margin=margin, mu=mu)
    assert r.outcome == "sgd_update"
    assert r.hinge == pytest.approx(z, rel=1e-12)
    M = L.T @ L
    assert np.linalg.norm(M - project(W)) <= 1e-10 * np.linalg.norm(W)


def test_every_step_keeps_M_positive_semidefinite() -> None:
    """After every step min eig(M) >= -1e-12 max |M|."""
    d = 12
    rng = np.random.default_rng(1)
    centres = 0.5 * rng.normal(size=(4, d))  # overlapping classes: large active steps
    y = rng.integers(0, 4, size=300)
    X = centres[y] + rng.normal(size=(300, d))
    learner = Learner(LearnerConfig(dim=d, algorithm="sgd_psd", eta=0.05, step="constant"))
    clipped = 0
    for x, label in zip(X, y, strict=True):
        learner.learn_one(x, int(label))
        M = learner.L.T @ learner.L
        w = np.linalg.eigvalsh(M)
        assert w[0] >= -1e-12 * np.abs(M).max()
        clipped += int(w[0] <= 1e-9 * w[-1])
    assert clipped > 0  # the projection was active (M became singular at least once)
    assert learner.counts["sgd_update"] > 100


def test_passive_step_only_decays() -> None:
    d = 3
    learner = Learner(LearnerConfig(dim=d, algorithm="sgd_psd", mu=0.0, lam=0.5, eta=0.1))
    learner.learn_one([0.0, 0.0, 0.0], "a")
    learner.learn_one([10.0, 0.0, 0.0], "b")
    r = learner.learn_one([0.0, 0.0, 0.0], "a")  # d_pos 0, d_neg 100: passive
    assert r.outcome == "passive" and r.gamma == 0.1
    assert np.allclose(learner.L.T @ learner.L, (1 - 2 * 0.1 * 0.5) * np.eye(d), rtol=1e-15)


def test_single_class_samples_are_buffered() -> None:
    learner = Learner(LearnerConfig(dim=2, algorithm="sgd_psd"))
    outcomes = [learner.learn_one([float(i), 0.0], "a").outcome for i in range(3)]
    assert outcomes == ["new_class", "single_class", "single_class"]
    assert np.array_equal(learner.L, np.eye(2))
