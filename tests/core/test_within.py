"""Within-class statistics online: the ``lda`` learner and ``precondition="whiten"``."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import scipy.linalg

from service.core import Learner, LearnerConfig
from service.core.within import (
    DISCRIMINANT_FLOOR,
    DISCRIMINANT_KNEE,
    WithinClass,
    apply,
    discriminant,
    fisher,
    whitening,
)

sklearn_lda = pytest.importorskip("sklearn.discriminant_analysis")
roc_auc_score = pytest.importorskip("sklearn.metrics").roc_auc_score


def make_stream(n: int, d: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes sharing a correlated, anisotropic within-class covariance."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    mix = rng.normal(size=(d, d)) * np.linspace(0.3, 2.0, d)
    X = 2.0 * rng.normal(size=(classes, d))[y] + rng.normal(size=(n, d)) @ mix
    return X, y


def round_trip(learner: Learner) -> Learner:
    """Through bytes and JSON text, the way the service stores a checkpoint."""
    arrays, meta = learner.to_state()
    loaded = {
        k: np.frombuffer(v.tobytes(), dtype=v.dtype).reshape(v.shape) for k, v in arrays.items()
    }
    return Learner.from_state(loaded, json.loads(json.dumps(meta)))


def pairwise(Z: np.ndarray) -> np.ndarray:
    diff = Z[:, None, :] - Z[None, :, :]
    return np.einsum("ijk,ijk->ij", diff, diff)


def test_statistics_match_the_batch_ones() -> None:
    X, y = make_stream(500, 6, 4, seed=1)
    stats = WithinClass(6)
    stats.observe(X[:123], y[:123])
    stats.observe(X[123:], y[123:])
    scatter = sum(
        (X[y == k] - X[y == k].mean(0)).T @ (X[y == k] - X[y == k].mean(0)) for k in range(4)
    )
    np.testing.assert_allclose(stats.scatter, scatter, rtol=1e-12, atol=1e-9)
    for k in range(4):
        np.testing.assert_allclose(stats.means[k], X[y == k].mean(0), rtol=1e-12, atol=1e-12)
        assert stats.counts[k] == (y == k).sum()


@pytest.mark.parametrize(("d", "classes", "n"), [(10, 4, 600), (5, 8, 400), (12, 2, 300)])
def test_lda_induces_sklearns_eigen_distances(d: int, classes: int, n: int) -> None:
    """Refreshed at the end of the stream, no shrinkage: the same pairwise squared distances
    as scikit-learn's eigen-solver transform (its K - 1 directions), up to one scale factor."""
    X, y = make_stream(n, d, classes, seed=d + classes)
    learner = Learner(LearnerConfig(dim=d, algorithm="lda", refresh=n))
    learner.learn_many(X, y)
    ref = sklearn_lda.LinearDiscriminantAnalysis(solver="eigen").fit(X, y)
    ours, theirs = pairwise(X @ learner.L.T), pairwise(ref.transform(X))
    assert np.linalg.matrix_rank(learner.L) == min(classes - 1, d)
    scale = ours.sum() / theirs.sum()
    assert scale > 0
    off = ~np.eye(n, dtype=bool)
    # The scale is the two covariances' normalisations, S_W / (n - K) against S_W / n.
    assert scale == pytest.approx((n - classes) / n, rel=1e-8)
    # Relative 1e-8 per pair; a pair of near-identical projections (squared distance ~1e-13 of
    # the largest) carries the rounding of the difference of two projections instead.
    np.testing.assert_allclose(ours[off], scale * theirs[off], rtol=1e-8, atol=1e-12 * ours.max())


def test_lda_before_a_definite_covariance_keeps_the_identity() -> None:
    X, y = make_stream(8, 10, 2, seed=3)  # 8 samples in 10 dimensions: singular
    learner = Learner(LearnerConfig(dim=10, algorithm="lda", refresh=4))
    learner.learn_many(X, y)
    np.testing.assert_array_equal(learner.L, np.eye(10))
    shrunk = Learner(LearnerConfig(dim=10, algorithm="lda", refresh=4, shrinkage=0.5))
    shrunk.learn_many(X, y)
    assert np.linalg.matrix_rank(shrunk.L) == 1 and np.isfinite(shrunk.L).all()


def test_shrinkage_moves_towards_the_scaled_identity() -> None:
    X, y = make_stream(300, 4, 3, seed=5)
    stats = WithinClass(4)
    stats.observe(X, y)
    cov = stats.covariance(0.0)
    assert cov is not None
    full = stats.covariance(1.0)
    assert full is not None
    np.testing.assert_allclose(full, np.trace(cov) / 4 * np.eye(4), rtol=1e-12)
    W = whitening(stats, 0.0)
    assert W is not None
    np.testing.assert_allclose(W @ cov @ W, np.eye(4), atol=1e-10)
    L = fisher(stats, 0.0)
    assert L is not None
    np.testing.assert_allclose(L[:2] @ cov @ L[:2].T, np.eye(2), atol=1e-10)


@pytest.mark.parametrize(
    "config",
    [
        {"algorithm": "lda", "refresh": 64},
        {"algorithm": "lda", "refresh": 50, "shrinkage": 0.3},
        {"algorithm": "opml", "precondition": "whiten", "refresh": 64},
        {"algorithm": "copml", "precondition": "whiten", "refresh": 70, "gamma": "auto"},
        {"algorithm": "sgd", "precondition": "whiten", "refresh": 64, "lam": 0.01},
        {"algorithm": "copml", "precondition": "discriminant", "refresh": 64, "gamma": 0.01},
    ],
)
def test_any_batching_and_resume_point_give_the_same_L(config: dict[str, object]) -> None:
    X, y = make_stream(700, 6, 5, seed=11)
    one = Learner(LearnerConfig(dim=6, seed=2, **config))  # type: ignore[arg-type]
    one.learn_many(X, y)
    many = Learner(LearnerConfig(dim=6, seed=2, **config))  # type: ignore[arg-type]
    cuts = [0, 1, 2, 37, 64, 65, 200, 333, 334, 512, 700]
    for a, b in itertools.pairwise(cuts):
        if a == 333:
            many = round_trip(many)
        if b - a == 1:
            many.learn_one(X[a], int(y[a]))
        else:
            many.learn_many(X[a:b], y[a:b])
    np.testing.assert_array_equal(one.L, many.L)
    assert not np.allclose(one.L, np.eye(6))
    assert one.counts == many.counts
    assert one.calibrator.calibration() == many.calibrator.calibration()


@pytest.mark.parametrize("algorithm", ["opml", "copml", "sgd"])
def test_whitening_refresh_does_not_move_the_served_metric(algorithm: str) -> None:
    """At a refresh L becomes L W_old W_new^{-1} and the buffer W_new h: the served L W is the
    same, and the next steps are taken on W_new x."""
    X, y = make_stream(260, 5, 3, seed=7)
    cfg = LearnerConfig(dim=5, algorithm=algorithm, precondition="whiten", refresh=100)  # type: ignore[arg-type]
    learner = Learner(cfg)
    learner.learn_many(X[:63], y[:63])  # no W yet (10 samples per dimension): measured only
    assert learner._W is None and learner.counts["passive"] > 50
    np.testing.assert_array_equal(learner.L, np.eye(5))
    learner.learn_one(X[63], int(y[63]))  # the refresh at 64: W arrives, L W = W served
    W_first = learner._W
    assert W_first is not None
    np.testing.assert_allclose(learner.L, W_first, rtol=1e-12)
    assert learner.calibrator.calibration().pairs == 0  # the identity's distances are gone
    learner.learn_many(X[64:250], y[64:250])  # steps on W x; refreshes at 100, 200
    measured = sum(learner.counts[k] for k in ("triplet_update", "sgd_update", "passive"))
    assert 0 < learner.calibrator.calibration().pairs <= measured - 50
    assert learner.counts["triplet_update"] + learner.counts["sgd_update"] > 5
    before, W_before = learner.L.copy(), learner._W.copy()  # type: ignore[union-attr]
    learner._refresh()  # a refresh now, on 250 samples' statistics
    W_after = learner._W
    assert W_after is not None and not np.allclose(W_after, W_before)
    np.testing.assert_allclose(learner.L, before, rtol=1e-9, atol=1e-12)
    stats = WithinClass(5)
    stats.observe(X[:250], y[:250])
    np.testing.assert_allclose(W_after, whitening(stats, 0.0), rtol=1e-10)  # type: ignore[arg-type]
    for k in range(3):  # the buffer holds the latest sample of each class, in W_new coordinates
        last = X[:250][y[:250] == k][-1]
        np.testing.assert_allclose(learner.buffer(k), last @ W_after, rtol=1e-9, atol=1e-12)


def test_whitening_helps_on_an_anisotropic_stream() -> None:
    """Whitened OPML separates classes whose signal hides under large nuisance variance."""
    rng = np.random.default_rng(0)
    n, d = 3000, 8
    y = rng.integers(0, 4, size=n)
    X = rng.normal(size=(n, d)) * np.r_[30.0 * np.ones(6), 0.5, 0.5]
    X[:, 6:] += 1.5 * rng.normal(size=(4, 2))[y]
    Xt, yt = X[2000:], y[2000:]

    def auc(learner: Learner) -> float:
        D = pairwise(Xt[:400] @ learner.L.T)[np.triu_indices(400, 1)]
        same = (yt[:400, None] == yt[None, :400])[np.triu_indices(400, 1)]
        return float(roc_auc_score(same, -D))

    plain = Learner(LearnerConfig(dim=d, algorithm="opml", seed=1))
    plain.learn_many(X[:2000], y[:2000])
    white = Learner(
        LearnerConfig(dim=d, algorithm="opml", precondition="whiten", refresh=200, seed=1)
    )
    white.learn_many(X[:2000], y[:2000])
    assert auc(white) > auc(plain) + 0.05


def test_served_metric_is_used_by_queries_and_set_metric() -> None:
    X, y = make_stream(300, 4, 3, seed=9)
    learner = Learner(LearnerConfig(dim=4, algorithm="opml", precondition="whiten", refresh=100))
    learner.learn_many(X, y)
    L = learner.L
    a, b = X[0], X[1]
    assert learner.squared_distance(a, b) == pytest.approx(float(np.sum((L @ (a - b)) ** 2)))
    np.testing.assert_allclose(learner.transform(X[:3]), X[:3] @ L.T)
    target = np.diag([1.0, 2.0, 3.0, 4.0])
    learner.set_metric(target)
    np.testing.assert_allclose(learner.L, target, atol=1e-12)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"algorithm": "lda", "gamma": 0.1}, "gamma: not used by algorithm 'lda'"),
        ({"algorithm": "brm", "precondition": "whiten"}, "precondition: 'whiten' is for"),
        ({"algorithm": "opml", "refresh": 10}, "refresh: not used by precondition 'none'"),
        ({"algorithm": "lda", "shrinkage": 1.5}, "shrinkage: must be in [0, 1]"),
        ({"algorithm": "lda", "refresh": 0}, "refresh"),
        ({"algorithm": "opml", "precondition": "whiten", "rehearsal": 1}, "rehearsal"),
        ({"algorithm": "opml", "precondition": "pca"}, "precondition: must be"),
        ({"algorithm": "lda", "precondition": "discriminant"}, "precondition: 'discriminant' is"),
        ({"algorithm": "copml", "precondition": "discriminant", "rehearsal": 2}, "rehearsal"),
    ],
)
def test_bad_config_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        LearnerConfig(dim=3, **fields)  # type: ignore[arg-type]


def test_constant_and_collinear_features_are_left_out() -> None:
    """A constant feature and one that is the sum of two others: no sample varies in those
    directions, so the metric is computed on the others (as if they were not there)."""
    X, y = make_stream(400, 4, 3, seed=13)
    wide = np.column_stack([X, np.full(len(X), 7.0), X[:, 0] + X[:, 1]])
    learner = Learner(LearnerConfig(dim=6, algorithm="lda", refresh=400))
    learner.learn_many(wide, y)
    narrow = Learner(LearnerConfig(dim=4, algorithm="lda", refresh=400))
    narrow.learn_many(X, y)
    ours, theirs = pairwise(wide @ learner.L.T), pairwise(X @ narrow.L.T)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-9 * theirs.max())
    white = Learner(LearnerConfig(dim=6, algorithm="opml", precondition="whiten", refresh=100))
    white.learn_many(wide, y)
    assert white._W is not None and np.isfinite(white.L).all()


def test_discriminant_is_the_root_of_weighted_lda_plus_a_within_scaled_floor() -> None:
    """``D^2 = sum_i lambda_i / (lambda_i + c) v_i v_i^T + epsilon diag(Sigma_W)^{-1}``, ``v_i``
    Fisher's directions (``v^T Sigma_W v = 1``) from batch statistics, by scipy's generalized
    eigensolver rather than the whitening the module uses."""
    X, y = make_stream(500, 5, 4, seed=3)
    X = X * np.array([1.0, 30.0, 0.2, 5.0, 1.0])  # features on different scales
    stats = WithinClass(5)
    stats.observe(X, y)
    D = discriminant(stats, 0.0)
    assert D is not None
    np.testing.assert_allclose(D, D.T, rtol=0, atol=0)
    means = np.array([X[y == k].mean(axis=0) for k in range(4)])
    within = (X - means[y]).T @ (X - means[y]) / (500 - 4)
    total = (X - X.mean(axis=0)).T @ (X - X.mean(axis=0)) / (500 - 4)
    ratios, V = scipy.linalg.eigh(total - within, within)
    ratios = np.maximum(ratios, 0.0)
    expected = (V * (ratios / (ratios + DISCRIMINANT_KNEE))) @ V.T
    expected += DISCRIMINANT_FLOOR * np.diag(1.0 / np.diag(within))
    np.testing.assert_allclose(D @ D, expected, rtol=1e-8, atol=1e-12 * np.abs(expected).max())


def test_discriminant_is_invariant_to_rescaling_a_feature() -> None:
    X, y = make_stream(400, 4, 3, seed=5)
    scale = np.array([0.05, 1.0, 40.0, 7.0])
    plain, scaled = WithinClass(4), WithinClass(4)
    plain.observe(X, y)
    scaled.observe(X * scale, y)
    D, E = discriminant(plain, 0.0), discriminant(scaled, 0.0)
    assert D is not None and E is not None
    # The same distances: ||E (s * z)|| = ||D z||, i.e. S E^2 S = D^2.
    np.testing.assert_allclose(scale[:, None] * (E @ E) * scale[None, :], D @ D, rtol=1e-7)


def test_discriminant_refresh_keeps_L_and_serves_the_new_D() -> None:
    """Unlike whitening's, a discriminant refresh does not carry ``L`` over: the served metric
    moves to ``L D'``, ``D'`` formed from all the samples so far, and the buffer to ``D' h``."""
    X, y = make_stream(260, 5, 3, seed=7)
    cfg = LearnerConfig(dim=5, algorithm="copml", precondition="discriminant", refresh=100)
    learner = Learner(cfg)
    learner.learn_many(X[:64], y[:64])  # the refresh at 64: D arrives, served L = D
    first = learner._W
    assert first is not None
    np.testing.assert_allclose(learner.L, first, rtol=1e-12)
    learner.learn_many(X[64:250], y[64:250])
    inner, before, D = learner._tracks.L.copy(), learner.L.copy(), learner._W
    c = len(learner._classes)
    raw = np.linalg.solve(D, learner._buffer[:c].T).T  # the buffered h, from D h
    learner._refresh()
    stats = WithinClass(5)
    stats.observe(X[:250], y[:250])
    new = discriminant(stats, 0.0)
    assert new is not None
    np.testing.assert_allclose(learner._W, new, rtol=1e-9)
    np.testing.assert_array_equal(learner._tracks.L, inner)
    np.testing.assert_allclose(learner.L, inner @ new, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(learner._buffer[:c], raw @ new, rtol=1e-9, atol=1e-12)
    assert np.abs(learner.L - before).max() > 1e-3  # the metric followed D


@pytest.mark.parametrize("precondition", ["whiten", "discriminant"])
def test_the_first_W_moves_the_buffer_into_its_coordinates(precondition: str) -> None:
    """The triplets after the first ``W`` compare ``W x`` with the buffer, so the buffered
    rows (raw before it) become ``W h`` then, as at every later refresh."""
    X, y = make_stream(64, 5, 3, seed=7)
    learner = Learner(LearnerConfig(dim=5, precondition=precondition, refresh=100))  # type: ignore[arg-type]
    learner.learn_many(X, y)  # the refresh at 64: W arrives
    assert learner._W is not None
    latest = np.array([X[np.flatnonzero(y == k)[-1]] for k in range(3)])
    c = len(learner._classes)
    order = [int(key) for key in learner._classes]
    np.testing.assert_array_equal(learner._buffer[:c], apply(latest[order], learner._W))


@pytest.mark.parametrize(("dim", "refresh"), [(3, 250), (125, 250), (126, 252), (512, 1024)])
def test_discriminant_refresh_defaults_to_max_250_2d(dim: int, refresh: int) -> None:
    assert LearnerConfig(dim=dim, precondition="discriminant").refresh == refresh
    assert LearnerConfig(dim=dim, precondition="whiten").refresh == 1000
    assert LearnerConfig(dim=dim, precondition="discriminant", refresh=7).refresh == 7


def test_discriminant_steps_follow_their_schedule() -> None:
    """``gamma * sqrt(n_1 / n)`` from the refresh point at ``n`` samples to the next, ``n_1``
    the samples at the first ``D`` (64 here); whitening keeps its ``gamma``. A checkpoint
    taken mid-stream resumes on the same schedule."""
    X, y = make_stream(640, 6, 5, seed=11)
    seen: dict[str, list[float]] = {}
    for precondition in ("discriminant", "whiten"):
        cfg = LearnerConfig(
            dim=6, precondition=precondition, refresh=64, step="paper", gamma=1e-3, seed=2
        )
        learner = Learner(cfg)
        start, seen[precondition] = 0, []
        for end in (64, 128, 192, 256, 300, 640):
            learner.learn_many(X[start:end], y[start:end])
            start = end
            if end == 300:
                learner = Learner.from_state(*learner.to_state())
            effective = learner.effective
            assert effective is not None and learner.health is not None
            assert learner.health["step_scale"] == 1.0  # no trip scaled the step
            seen[precondition].append(effective["gamma"])
    n = [64, 128, 192, 256, 256, 640]  # the last refresh point reached
    assert seen["discriminant"] == pytest.approx([1e-3 * (64 / k) ** 0.5 for k in n], rel=1e-12)
    assert seen["whiten"] == [1e-3] * 6


def test_discriminant_beats_whitening_with_many_noise_directions() -> None:
    """Three classes apart in 2 of 24 dimensions: whitening weights the 22 pure-noise
    directions as much as the 2 informative ones, the discriminant metric hardly at all (a
    short stream: the metric is mostly the preconditioner's, formed at 256 samples)."""
    rng = np.random.default_rng(4)
    n, d = 3000, 24
    y = rng.integers(0, 3, size=n)
    X = rng.normal(size=(n, d))
    X[:, :2] += 3.0 * rng.normal(size=(3, 2))[y]
    Xt, yt = X[2500:], y[2500:]

    def auc(learner: Learner) -> float:
        D = pairwise(Xt @ learner.L.T)[np.triu_indices(len(yt), 1)]
        same = (yt[:, None] == yt[None, :])[np.triu_indices(len(yt), 1)]
        return float(roc_auc_score(same, -D))

    scores = {}
    for precondition in ("whiten", "discriminant"):
        cfg = LearnerConfig(dim=d, precondition=precondition, gamma=0.01, seed=1)  # type: ignore[arg-type]
        learner = Learner(cfg)
        learner.learn_many(X[:300], y[:300])
        scores[precondition] = auc(learner)
    assert scores["discriminant"] > scores["whiten"] + 0.1, scores
