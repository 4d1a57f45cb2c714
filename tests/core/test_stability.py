"""Step-mass stability diagnostics (docs/algorithms/gradient.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.stability import theorem1_bound


def replay(labels: list[int], seed: int, prestage: bool) -> list[tuple[int, int, int | None]]:
    """The service's triplets by brute force: per step that formed a triplet or pair,
    (anchor, positive, negative or None) as sample indices. One uniform per sample from the
    seeded PCG64 picks the negative class among the other seen classes (Sec. III-A)."""
    uniforms = np.random.default_rng(seed).random(len(labels))
    order: list[int] = []  # classes in order of first appearance
    latest: dict[int, int] = {}  # class -> index of its buffered sample
    steps = []
    for t, k in enumerate(labels):
        if k in latest:
            if len(order) >= 2:
                others = [c for c in order if c != k]
                negative = others[int(uniforms[t] * len(others))]
                steps.append((t, latest[k], latest[negative]))
            elif prestage:
                steps.append((t, latest[k], None))
        else:
            order.append(k)
        latest[k] = t
    return steps


SCRIPTED = [0, 0, 0, 1, 0, 1, 2, 2, 0, 1, 1, 3, 0, 2, 3, 3, 1, 0, 2, 2, 2, 1, 0, 3, 1] * 4


@pytest.mark.parametrize(
    ("algorithm", "prestage"),
    [("opml", False), ("copml", True), ("sgd", True), ("sgd_psd", False), ("brm", False)],
)
def test_step_masses_equal_a_brute_force_recount(algorithm: str, prestage: bool) -> None:
    """S_i from the learner equals the recount from the replayed triplet indices."""
    d, seed = 3, 11
    rng = np.random.default_rng(0)
    X = rng.normal(size=(len(SCRIPTED), d))
    eta, eta_pair = 2.0**-7, 2.0**-5  # exact binary sums: any order gives the same floats
    kwargs: dict = {"gamma": eta} if algorithm in ("opml", "copml") else {"eta": eta}
    if algorithm in ("sgd_psd", "sgd"):
        kwargs["step"] = "constant"
    learner = Learner(
        LearnerConfig(dim=d, algorithm=algorithm, gamma_pair=eta_pair, seed=seed, **kwargs)
    )
    # In pieces: the accounting must not depend on batching.
    for part in np.array_split(np.arange(len(SCRIPTED)), [1, 7, 8, 40]):
        learner.learn_many(X[part], [SCRIPTED[i] for i in part])
    masses = np.zeros(len(SCRIPTED))
    pair_eta = eta_pair if algorithm == "copml" else eta_pair / 2  # sgd reports s / 2
    steps = replay(SCRIPTED, seed, prestage)
    for anchor, positive, negative in steps:
        step = pair_eta if negative is None else eta
        masses[[anchor, positive]] += step
        if negative is not None:
            masses[negative] += step
    s = learner.stability()
    assert s.n_samples == len(SCRIPTED)
    assert s.n_steps == len(steps)
    assert s.step_mass_max == masses.max()
    assert s.step_mass_mean == masses.mean()
    assert s.sum_eta == sum(pair_eta if n is None else eta for _, _, n in steps)
    updates = sum(learner.counts[k] for k in ("triplet_update", "shrunk_update", "pair_update"))
    assert s.n_updates == updates + learner.counts["sgd_update"]
    largest = np.linalg.norm(X, axis=1).max()
    assert s.B is not None and abs(s.B - largest) <= 1e-15 * largest


@pytest.mark.parametrize("step", ["constant", "descent", "invsqrt"])
@pytest.mark.parametrize("lam", [0.0, 0.2])
def test_feature_perturbation_stays_within_the_lemma_2_recursion(step: str, lam: float) -> None:
    """M-SGD, mu > 0, every step non-expansive; two runs differing only in
    sample i's features end with ||M_T - M'_T||_F <= sum_{t uses i} eta_t (||A_t||_F +
    ||A'_t||_F) (exact property: 1-expansive steps elsewhere, a gradient of norm at most
    ||A_t||_F where i is used)."""
    d, n, mu, eta, seed = 6, 400, 0.5, 0.12, 5
    rng = np.random.default_rng(1)
    centres = 0.5 * rng.normal(size=(4, d))
    labels = [int(k) for k in rng.integers(0, 4, size=n)]
    X = centres[labels] + 0.4 * rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # B = 1
    i = 370  # late: with the decay, an early difference fades (contraction)
    X2 = X.copy()
    X2[i] = -X[i]  # far from the original (same norm)
    kappa = {"kappa": 0.5} if step == "descent" else {}
    config = LearnerConfig(
        dim=d, algorithm="sgd_psd", mu=mu, eta=eta, lam=lam, step=step, seed=seed, **kappa
    )
    runs = []
    for data in (X, X2):
        learner = Learner(config)
        learner.learn_many(data, labels)
        s = learner.stability()
        assert s.capped_fraction == 1.0 and s.gamma_hat is not None
        runs.append(learner.L.T @ learner.L)
    gap = np.linalg.norm(runs[0] - runs[1])
    bound = 0.0
    for anchor, positive, negative in replay(labels, seed, prestage=False):
        if i in (anchor, positive, negative):
            assert negative is not None
            t = anchor + 1
            eta_t = eta / math.sqrt(t) if step == "invsqrt" else eta
            for data in (X, X2):
                a, b = data[anchor] - data[positive], data[anchor] - data[negative]
                bound += eta_t * np.linalg.norm(np.outer(a, a) - np.outer(b, b))
    assert 0.0 < gap <= bound
    assert gap > 0.01 * bound  # the property has teeth: the bound is not vacuous here


def test_gamma_hat_only_for_convex_smooth_non_expansive_sgd_psd() -> None:
    """Gamma_hat is null for OPML, COPML and L-SGD (and BRM, hinge M-SGD, and M-SGD
    with a step that was not non-expansive)."""
    d = 4
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = rng.integers(0, 3, size=200)
    nulls = [
        {"algorithm": "opml"},
        {"algorithm": "copml"},
        {"algorithm": "sgd"},
        {"algorithm": "sgd", "mu": 0.5},
        {"algorithm": "brm"},
        {"algorithm": "sgd_psd", "mu": 0.0},
        {"algorithm": "sgd_psd", "mu": 0.5, "eta": 0.5, "step": "constant"},  # eta alpha > 2
    ]
    for kwargs in nulls:
        learner = Learner(LearnerConfig(dim=d, **kwargs))
        learner.learn_many(X, y)
        s = learner.stability()
        assert s.gamma_hat is None, kwargs
        assert s.n_samples == 200 and s.lipschitz == pytest.approx(8.0)
    psd = Learner(LearnerConfig(dim=d, algorithm="sgd_psd", mu=0.5, eta=0.01))
    psd.learn_many(X, y)
    s = psd.stability()
    assert s.capped_fraction == 1.0
    assert s.smoothness == pytest.approx(16.0 / 0.5)
    assert s.gamma_hat == pytest.approx(2 * 8.0**2 * s.step_mass_max)
    smooth_sgd = Learner(LearnerConfig(dim=d, algorithm="sgd", mu=0.5, eta=0.01))
    smooth_sgd.learn_many(X, y)
    assert smooth_sgd.stability().capped_fraction == 1.0  # measured, still no gamma_hat


def test_theorem_1_calculator_reproduces_the_vacuity_table() -> None:
    """The stability paper's Theorem 1 with everything granted (B = 1, M = 1, delta = 0.05,
    n+ = n- = n, eta = (2/alpha)/sqrt(T), T = n, Cor. 1's L = 8, alpha = 64); gamma by Lemma 2 with
    each sample used 3T / (n+ + n-) = 1.5 times on average: gamma = 2 L^2 eta 1.5."""
    expected = {10**3: 2.2e3, 10**4: 930.7, 10**6: 1.4e2, 10**7: 50.0, 10**9: 6.4}
    for n, value in expected.items():
        gamma = 2 * 8.0**2 * (2 / 64) / math.sqrt(n) * 1.5
        bound = theorem1_bound(gamma, M=1.0, n_pos=n, n_neg=n, delta=0.05)
        assert bound == pytest.approx(value, rel=1e-3 if n == 10**4 else 0.05), n
        assert bound > 1.0  # vacuous for a loss of range 1
    assert theorem1_bound(0.0, 1.0, 10**4, 10**4, 0.05) == pytest.approx(1.30, abs=0.005)
    assert theorem1_bound(0.0, 1.0, 10**6, 10**6, 0.05) == pytest.approx(0.13, abs=0.005)
    for kwargs, message in [
        ({"delta": 0.5}, "delta: must be in"),
        ({"n_pos": 1}, "n_pos: need n_pos >= 2"),
        ({"gamma": -1.0}, "gamma: must be >= 0"),
        ({"M": 0.0}, "M: must be > 0"),
    ]:
        args = {"gamma": 0.1, "M": 1.0, "n_pos": 100, "n_neg": 100, "delta": 0.05, **kwargs}
        with pytest.raises(ValueError, match=message):
            theorem1_bound(**args)


@pytest.mark.parametrize("algorithm", ["copml", "sgd", "sgd_psd", "brm"])
def test_diagnostics_resume_bit_identically(algorithm: str) -> None:
    d = 3
    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, d))
    y = rng.integers(0, 4, size=120)
    config = LearnerConfig(dim=d, algorithm=algorithm)  # type: ignore[arg-type]
    whole = Learner(config)
    whole.learn_many(X, y)
    part = Learner(config)
    part.learn_many(X[:55], y[:55])
    resumed = Learner.from_state(*part.to_state())
    resumed.learn_many(X[55:], y[55:])
    assert resumed.stability() == whole.stability()
