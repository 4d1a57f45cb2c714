"""L-SGD (docs/algorithms/gradient.md) against its definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.sgd import sgd_step, triplet_loss
from service.core.update import triplet_step


def loss_of(L: np.ndarray, a: np.ndarray, b: np.ndarray, margin: float, mu: float) -> float:
    z = np.sum((L @ a) ** 2) - np.sum((L @ b) ** 2) + margin
    return float(triplet_loss(z, mu))


def random_case(d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    L = np.eye(d) + 0.3 * rng.normal(size=(d, d)) / np.sqrt(d)
    return L, rng.normal(size=d) / np.sqrt(d), rng.normal(size=d) / np.sqrt(d)


@pytest.mark.parametrize("seed", range(5))
def test_gradient_matches_central_finite_differences(seed: int) -> None:
    """The step is -eta times grad_L l_mu = 2 q L A (mu = 0.3), to relative 1e-6."""
    d, mu, margin, eta = 7, 0.3, 1.0, 1e-3
    L0, a, b = random_case(d, seed)
    L = L0.copy()
    r = sgd_step(L, np.stack([a, b]), eta=eta, margin=margin, mu=mu, step="constant")
    assert r.outcome == "sgd_update"
    grad = (L0 - L) / eta
    E = np.random.default_rng(100 + seed).normal(size=(d, d))
    h = 1e-5
    fd = (loss_of(L0 + h * E, a, b, margin, mu) - loss_of(L0 - h * E, a, b, margin, mu)) / (2 * h)
    assert float(np.sum(grad * E)) == pytest.approx(fd, rel=1e-6)


def test_softplus_loss_is_the_lse_smoothing_and_close_to_the_hinge() -> None:
    """mu log(e^{(d_pos+m)/mu} + e^{d_neg/mu}) - d_neg == mu softplus(z/mu) (1e-12),
    and 0 < l_mu - max(0, z) <= mu ln 2."""
    rng = np.random.default_rng(0)
    for mu in (0.05, 0.3, 1.0, 4.0):
        d_pos = rng.uniform(0, 10, size=1000)
        d_neg = rng.uniform(0, 10, size=1000)
        margin = 1.0
        z = d_pos - d_neg + margin
        keep = np.abs(z / mu) < 30  # beyond, l_mu - max(0, z) underflows to 0 in float64
        lse = mu * np.logaddexp((d_pos + margin) / mu, d_neg / mu) - d_neg
        ours = triplet_loss(z, mu)
        assert np.allclose(ours, lse, rtol=1e-12, atol=1e-12 * np.abs(d_neg).max())
        gap = ours[keep] - np.maximum(z[keep], 0.0)
        assert (gap > 0).all() and (gap <= mu * np.log(2) * (1 + 1e-12)).all()
    assert np.array_equal(triplet_loss([-3.0, 0.0, 2.5], 0.0), [0.0, 0.0, 2.5])
    assert np.isfinite(triplet_loss([-1e308, 1e308], 1e-300)).all()  # no overflow


@pytest.mark.parametrize("d", [3, 21, 64])
def test_hinge_sgd_is_opml_to_first_order(d: int) -> None:
    """mu = 0, lam = 0, eta = gamma / 2: the gap to OPML's step is O(gamma^2);
    halving gamma divides it by 4 +/- 0.3."""
    L0, a, b = random_case(d, d)
    ab = np.stack([a, b])
    gaps = []
    for gamma in (0.02, 0.01, 0.005):
        L_opml, L_sgd = L0.copy(), L0.copy()
        assert triplet_step(L_opml, ab, gamma, margin=1e6).outcome == "triplet_update"
        assert sgd_step(L_sgd, ab, eta=gamma / 2, margin=1e6).outcome == "sgd_update"
        gaps.append(np.linalg.norm(L_opml - L_sgd))
    for big, small in itertools.pairwise(gaps):
        assert big / small == pytest.approx(4.0, abs=0.3)


@pytest.mark.parametrize("seed", range(20))
def test_descent_condition_and_why_kappa_is_at_most_half(seed: int) -> None:
    """For s lambda_+ in (0, 2] the triplet's z does not increase; at s lambda_+ = 1
    the step matrix I - s A is singular (a direction of L is deleted)."""
    d, margin = 6, 1e3
    L0, a, b = random_case(d, seed)
    A = np.outer(a, a) - np.outer(b, b)
    plus = np.linalg.eigvalsh(A)[-1]
    z0 = np.sum((L0 @ a) ** 2) - np.sum((L0 @ b) ** 2) + margin
    for s_lambda in (0.05, 0.5, 1.0, 1.5, 2.0):
        L = L0.copy()
        sgd_step(L, np.stack([a, b]), eta=s_lambda / (2 * plus), margin=margin)  # q = 1
        z = np.sum((L @ a) ** 2) - np.sum((L @ b) ** 2) + margin
        assert z <= z0 + 1e-12 * abs(z0)
    smallest = np.linalg.svd(np.eye(d) - A / plus, compute_uv=False)[-1]
    assert smallest < 1e-12
    # The default rule caps s lambda_+ at kappa = 0.5, however large eta is.
    L = L0.copy()
    r = sgd_step(L, np.stack([a, b]), eta=1e6, margin=margin, step="descent", kappa=0.5)
    assert r.gamma == pytest.approx(0.5 / (2 * plus), rel=1e-12)
    assert np.linalg.svd(np.eye(d) - 2 * r.gamma * A, compute_uv=False)[-1] >= 0.5 - 1e-12


def reference_step(L, a, b, eta_t, q, c):
    """1.5 with dense matrices: L <- c L - s (L a) a^T + s (L b) b^T, s = 2 eta_t q."""
    s = 2 * eta_t * q
    return c * L - s * np.outer(L @ a, a) + s * np.outer(L @ b, b)


@pytest.mark.parametrize("step", ["constant", "descent", "invsqrt"])
@pytest.mark.parametrize("mu", [0.0, 0.5])
@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_learner_steps_follow_the_definition(step: str, mu: float, lam: float) -> None:
    """The learner's stream (lazy decay included) against a dense transcription of 1.5,
    with the triplets replayed from its own results."""
    d, eta, kappa, margin = 5, 0.05, 0.4, 1.0
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, d)) / np.sqrt(d)
    y = rng.integers(0, 3, size=60)
    y[:3] = [0, 1, 2]
    config = LearnerConfig(
        dim=d, algorithm="sgd", step=step, eta=eta, mu=mu, lam=lam, margin=margin, seed=1,
        kappa=kappa if step == "descent" else None,
    )  # fmt: skip
    learner = Learner(config)
    L = np.eye(d)
    for t, (x, label) in enumerate(zip(X, y, strict=True), start=1):
        before = {k: learner.buffer(k) for k in learner.classes}
        r = learner.learn_one(x, int(label))
        if r.outcome in ("new_class",):
            continue
        # Recover the negative: the buffered class whose distance matches d_neg.
        a = x - before[str(label)]
        negatives = [v for k, v in before.items() if k != str(label)]
        b = min((x - v for v in negatives), key=lambda w: abs(np.sum((L @ w) ** 2) - r.d_neg))
        eta_rule = eta / np.sqrt(t) if step == "invsqrt" else eta
        c = 1 - 2 * eta_rule * lam
        z = np.sum((L @ a) ** 2) - np.sum((L @ b) ** 2) + margin
        assert r.hinge == pytest.approx(z, rel=1e-10, abs=1e-12)
        q = (1.0 if z > 0 else 0.0) if mu == 0 else 1 / (1 + np.exp(-z / mu))
        eta_t = eta_rule
        if step == "descent" and q > 0:
            plus = np.linalg.eigvalsh(np.outer(a, a) - np.outer(b, b))[-1]
            eta_t = min(eta_rule, kappa / (2 * q * plus))
        L = reference_step(L, a, b, eta_t, q, c)
        assert np.allclose(learner.L, L, rtol=1e-10, atol=1e-13), t
    assert learner.counts["sgd_update"] > 20


def test_pair_step_is_the_explicit_twin_of_copml_eq_20() -> None:
    """1.8: while one class is known, L <- L - s (L delta) delta^T with s = gamma_pair
    (descent: s ||delta||^2 <= kappa); first-order equal to Eq. 20."""
    d = 4
    rng = np.random.default_rng(2)
    x0, x1 = rng.normal(size=d), rng.normal(size=d)
    delta = x1 - x0
    for step, expected_s in [("constant", 0.01), ("descent", min(0.01, 0.5 / (delta @ delta)))]:
        learner = Learner(LearnerConfig(dim=d, algorithm="sgd", step=step, gamma_pair=0.01))
        learner.learn_one(x0, "a")
        r = learner.learn_one(x1, "a")
        assert r.outcome == "pair_update"
        assert r.gamma == pytest.approx(expected_s / 2)  # reported as eta = s / 2
        assert r.d_pos == pytest.approx(delta @ delta)
        assert np.allclose(learner.L, np.eye(d) - expected_s * np.outer(delta, delta))
    learner = Learner(LearnerConfig(dim=d, algorithm="sgd", step="descent", gamma_pair=10.0))
    learner.learn_one(x0, "a")
    learner.learn_one(x1, "a")
    assert np.linalg.svd(learner.L, compute_uv=False)[-1] == pytest.approx(0.5)  # capped


def test_invsqrt_uses_the_position_in_the_stream_however_batched() -> None:
    d = 3
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, d))
    y = [0, 1, 2, *rng.integers(0, 3, size=37).tolist()]
    config = LearnerConfig(dim=d, algorithm="sgd", step="invsqrt", eta=0.02, margin=100.0)
    whole = Learner(config).learn_many(X, y)
    parts = Learner(config)
    parts.learn_many(X[:17], y[:17])
    tail = parts.learn_many(X[17:], y[17:])
    assert [r.gamma for r in tail] == [r.gamma for r in whole[17:]]
    active = [(t, r.gamma) for t, r in enumerate(whole, start=1) if r.outcome == "sgd_update"]
    assert active and all(g == pytest.approx(0.02 / np.sqrt(t)) for t, g in active)


@pytest.mark.parametrize("algorithm", ["sgd", "sgd_psd", "brm"])
def test_enormous_inputs_are_skipped_and_leave_L_untouched(algorithm: str) -> None:
    """Inputs of magnitude 1e100 never produce NaN/Inf; outcome skipped."""
    d = 4
    rng = np.random.default_rng(5)
    learner = Learner(LearnerConfig(dim=d, algorithm=algorithm, lam=0.1))
    learner.learn_many(rng.normal(size=(30, d)), rng.integers(0, 3, size=30))
    L = learner.L.copy()
    results = learner.learn_many(rng.normal(size=(20, d)) * 1e100, rng.integers(0, 3, size=20))
    assert {r.outcome for r in results} == {"skipped"}
    assert np.array_equal(learner.L, L)
    assert learner.squared_distance(np.zeros(d), np.full(d, 1e100)) > 0


def test_lazy_decay_renormalises_and_keeps_the_served_L() -> None:
    """scale < 1e-16 is folded into L~; the served L is the same either way."""
    d = 3
    config = LearnerConfig(dim=d, algorithm="sgd", eta=0.49, lam=1.0, step="constant")
    learner = Learner(config)
    learner.learn_one([0.0, 0.0, 0.0], "a")
    learner.learn_one([1e20, 0.0, 0.0], "b")  # the negative far away: every step passive
    for _ in range(10):
        assert learner.learn_one([0.0, 0.0, 0.0], "a").outcome == "passive"
    # c = 1 - 2 eta lam = 0.02 per step: 0.02^10 ~ 1e-17, folded once below 1e-16.
    assert np.allclose(learner.L, 0.02**10 * np.eye(d), rtol=1e-12)
    _, meta = learner.to_state()
    assert 1e-16 <= meta["scale"] <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "sgd", "gamma": 0.1}, "gamma: not used by algorithm 'sgd'"),
        ({"algorithm": "opml", "eta": 0.1}, "eta: not used by algorithm 'opml'"),
        (
            {"algorithm": "copml", "step": "descent"},
            "step: must be one of 'scaled', 'paper' for algorithm 'copml'",
        ),
        ({"algorithm": "sgd", "step": "scaled"}, "step: must be one of 'constant', 'descent'"),
        ({"algorithm": "sgd", "gamma": "auto"}, "gamma: not used by algorithm 'sgd'"),
        ({"algorithm": "brm", "auto_warmup": 100}, "auto_warmup: not used by algorithm 'brm'"),
        ({"algorithm": "brm", "mu": 0.1}, "mu: not used by algorithm 'brm'"),
        ({"algorithm": "sgd", "step": "adam"}, "step: must be one of 'constant', 'descent'"),
        ({"algorithm": "sgd", "step": "constant", "kappa": 0.5}, "kappa: not used by step"),
        ({"algorithm": "sgd", "kappa": 0.6}, r"kappa: must be in \(0, 0.5\]"),
        ({"algorithm": "sgd", "kappa": 0.0}, "kappa: must be a finite number > 0"),
        ({"algorithm": "sgd", "eta": 0.0}, "eta: must be a finite number > 0"),
        ({"algorithm": "sgd", "mu": -1.0}, "mu: must be a finite number >= 0"),
        ({"algorithm": "sgd_psd", "mu": float("inf")}, "mu: must be a finite number >= 0"),
        ({"algorithm": "sgd", "lam": -0.1}, "lam: must be a finite number >= 0"),
        ({"algorithm": "sgd", "eta": 0.5, "lam": 1.0}, "lam: must satisfy 2 eta lam < 1"),
        ({"algorithm": "sgd", "gamma_pair": 2.0, "lam": 0.5}, "lam: must satisfy gamma_pair"),
        ({"algorithm": "brm", "margin": 1.0}, "margin: must be < 1 for brm"),
        ({"algorithm": "sgd", "margin": 0.0}, "margin: must be a finite number > 0"),
        ({"algorithm": "sgd", "eta": "fast"}, "eta: must be a number"),
    ],
)
def test_config_names_the_bad_hyperparameter(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LearnerConfig(dim=3, **kwargs)


def test_config_defaults_by_algorithm() -> None:
    sgd = LearnerConfig(dim=2, algorithm="sgd")
    assert (sgd.step, sgd.eta, sgd.mu, sgd.kappa, sgd.lam, sgd.margin) == (
        "descent",
        5e-4,
        0.0,
        0.5,
        0.0,
        1.0,
    )
    assert sgd.gamma is None
    psd = LearnerConfig(dim=2, algorithm="sgd_psd", step="invsqrt")
    assert (psd.mu, psd.kappa) == (0.1, None)
    opml = LearnerConfig(dim=2, algorithm="opml")
    assert (opml.gamma, opml.margin, opml.step, opml.eta) == (0.05, 1.0, "scaled", None)
    paper = LearnerConfig(dim=2, algorithm="opml", step="paper")
    assert (paper.gamma, paper.gamma_pair, paper.auto_warmup) == (1e-3, 1e-2, 1000)
    # A config round-trips through its stored form (the service stores asdict(config)).
    from dataclasses import asdict

    for config in (sgd, psd, opml, LearnerConfig(dim=2, algorithm="brm", lam=0.01)):
        assert LearnerConfig(**asdict(config)) == config


@pytest.mark.parametrize("algorithm", ["sgd", "sgd_psd", "brm"])
def test_held_out_samples_do_not_advance_the_step_counter(algorithm: str) -> None:
    """``invsqrt``'s ``t`` counts learned samples: a model holding 30 % out learns exactly as a
    model without holdout fed only the rows it learned, one at a time or in one batch."""
    rng = np.random.default_rng(12)
    X = rng.normal(size=(300, 3))
    y = [f"c{k}" for k in rng.integers(3, size=300)]
    hyper = {"dim": 3, "algorithm": algorithm, "step": "invsqrt", "eta": 0.05, "seed": 4}
    one = Learner(LearnerConfig(**hyper, holdout=0.3))
    outcomes = [one.learn_one(x, label).outcome for x, label in zip(X, y, strict=True)]
    many = Learner(LearnerConfig(**hyper, holdout=0.3))
    many.learn_many(X, y)
    learned = [i for i, o in enumerate(outcomes) if o != "held_out"]
    assert 0 < len(learned) < 250
    plain = Learner(LearnerConfig(**hyper))
    plain.learn_many(X[learned], [y[i] for i in learned])
    np.testing.assert_array_equal(one.L, many.L)
    np.testing.assert_array_equal(one.L, plain.L)
    assert one.stability() == plain.stability()


def test_brm_refuses_certificates_of_the_other_distance() -> None:
    learner = Learner(LearnerConfig(dim=2, algorithm="brm", holdout=0.2))
    with pytest.raises(ValueError, match=r"^algorithm: certificates are not available for 'brm'"):
        learner.certificate()
