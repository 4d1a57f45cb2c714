"""OPML / COPML as scikit-learn / metric-learn estimators."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import cross_val_score
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

from service.core import BRM, COPML, OPML, SGD, SGDPSD
from service.core.estimators import NotFittedError, _ParamsBase


def blobs(n: int = 300, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three classes separated along feature 0 only; the other features are loud noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    X = rng.normal(size=(n, d)) * 3.0
    X[:, 0] = y * 2.0 + 0.3 * rng.normal(size=n)
    return X, y


#: Checks that do not apply: the estimators take numpy input, not the array API.
NOT_APPLICABLE = {"check_array_api_input"}


ALL = [OPML, COPML, SGD, SGDPSD, BRM]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.SkipTestWarning")
@pytest.mark.parametrize("estimator", [cls(random_state=0) for cls in ALL], ids=repr)
def test_scikit_learn_estimator_checks(estimator) -> None:
    results = check_estimator(estimator, on_fail=None)
    assert len(results) > 40
    failed = [
        (r["check_name"], r["exception"])
        for r in results
        if r["status"] != "passed" and r["check_name"] not in NOT_APPLICABLE
    ]
    assert failed == []


#: Step sizes that make every learner move on blobs().
LARGE_STEP = {OPML: {"gamma": 0.01}, COPML: {"gamma": 0.01}, SGD: {"eta": 0.005},
              SGDPSD: {"eta": 0.005}, BRM: {"eta": 0.1}}  # fmt: skip


@pytest.mark.parametrize("cls", ALL)
def test_partial_fit_over_any_split_equals_fit(cls) -> None:
    X, y = blobs()
    whole = cls(random_state=4, **LARGE_STEP[cls]).fit(X, y)
    parts = cls(random_state=4, **LARGE_STEP[cls])
    for chunk in np.array_split(np.arange(len(y)), [1, 50, 51, 200]):
        parts.partial_fit(X[chunk], y[chunk])
    assert np.array_equal(whole.components_, parts.components_)


@pytest.mark.parametrize("cls", ALL)
def test_learned_metric_helps_knn_in_a_pipeline(cls) -> None:
    X, y = blobs(n=600)
    knn = KNeighborsClassifier(n_neighbors=5)
    euclid = cross_val_score(make_pipeline(StandardScaler(), knn), X, y, cv=3).mean()
    learned = cross_val_score(
        make_pipeline(StandardScaler(), cls(random_state=0), knn), X, y, cv=3
    ).mean()
    assert euclid < 0.96  # the noise features cost the Euclidean k-NN
    assert learned > euclid + 0.03


def test_metric_learn_accessors_agree() -> None:
    X, y = blobs()
    m = COPML(gamma=0.01, random_state=1).fit(X, y)
    L = m.components_
    assert np.allclose(m.get_mahalanobis_matrix(), L.T @ L)
    assert np.allclose(m.transform(X[:5]), X[:5] @ L.T)
    pairs = np.stack([X[:10], X[10:20]], axis=1)
    expected = np.sqrt([(a - b) @ L.T @ L @ (a - b) for a, b in zip(X[:10], X[10:20], strict=True)])
    assert np.allclose(m.pair_distance(pairs), expected)
    assert np.allclose(m.pair_score(pairs), -expected)
    assert m.get_metric()(X[0], X[10]) == pytest.approx(expected[0])
    with pytest.raises(ValueError, match=r"pairs: expected shape \(n, 2, 6\)"):
        m.pair_distance(X[:4])


def test_hyperparameters_reach_the_learner() -> None:
    X, y = blobs(n=50)
    m = COPML(gamma=0.02, gamma_pair=0.3, margin=2.5, normalize="l2", random_state=7).fit(X, y)
    config = m.learner_.config
    assert (config.gamma, config.gamma_pair, config.margin, config.normalize, config.seed) == (
        0.02,
        0.3,
        2.5,
        "l2",
        7,
    )
    assert m.learner_.config.algorithm == "copml"
    assert OPML().fit(X, y).learner_.config.algorithm == "opml"
    assert OPML().fit(X, y).learner_.config.step == "scaled"
    assert OPML(step="paper").fit(X, y).learner_.config.gamma == 1e-3
    with pytest.raises(ValueError, match=r"gamma: must be in \(0, 1\]"):
        OPML(gamma=-1.0).fit(X, y)
    with pytest.raises(ValueError, match=r"gamma: must be in \(0, 1e\+06\]"):
        COPML(gamma=1e300, step="paper").fit(X, y)
    with pytest.raises(ValueError, match="step: must be one of"):
        COPML(step="literal").fit(X, y)
    with pytest.raises(ValueError, match="dim: must be in"):
        OPML().fit(np.zeros((3, 40000)), [0, 1, 0])
    sgd = SGD(eta=0.01, mu=0.2, step="invsqrt", lam=0.1, gamma_pair=0.3, margin=2.0).fit(X, y)
    c = sgd.learner_.config
    assert (c.algorithm, c.eta, c.mu, c.step, c.kappa, c.lam, c.gamma_pair, c.margin) == (
        "sgd", 0.01, 0.2, "invsqrt", None, 0.1, 0.3, 2.0
    )  # fmt: skip
    assert SGD().fit(X, y).learner_.config.kappa == 0.5  # None: the descent default
    assert SGDPSD().fit(X, y).learner_.config.mu == 0.1
    brm = BRM(kappa=0.25).fit(X, y).learner_.config
    assert (brm.algorithm, brm.margin, brm.kappa, brm.eta) == ("brm", 0.1, 0.25, 0.3)
    with pytest.raises(ValueError, match="kappa: not used by step 'constant'"):
        SGD(step="constant", kappa=0.5).fit(X, y)
    with pytest.raises(ValueError, match="margin: must be < 1 for brm"):
        BRM(margin=1.0).fit(X, y)
    # One step field, its values by algorithm.
    with pytest.raises(ValueError, match="step: must be one of 'constant', 'descent', 'invsqrt'"):
        SGD(step="paper").fit(X, y)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step: must be one of 'scaled', 'paper'"):
        OPML(step="descent").fit(X, y)  # type: ignore[arg-type]


def test_brm_restricted_distance_of_pairs() -> None:
    X, y = blobs(n=100)
    m = BRM(random_state=0).fit(X, y)
    pairs = np.stack([X[:10], X[10:20]], axis=1)
    expected = [m.learner_.restricted_distance(a, b) for a, b in pairs]
    assert np.allclose(m.restricted_distance(pairs), expected, rtol=1e-12)
    assert (m.restricted_distance(pairs) < 1.0).all()
    with pytest.raises(ValueError, match=r"pairs: expected shape \(n, 2, 6\)"):
        m.restricted_distance(X[:4])


def test_unfitted_and_mismatched_inputs_raise() -> None:
    X, y = blobs(n=30)
    with pytest.raises(NotFittedError):
        OPML().transform(X)
    m = OPML(random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="X has 5 features, but OPML is expecting 6"):
        m.transform(X[:, :5])
    with pytest.raises(ValueError, match="X has 5 features, but OPML is expecting 6"):
        m.partial_fit(X[:, :5], y)


def test_clone_keeps_hyperparameters_and_drops_state() -> None:
    m = COPML(gamma=0.5, gamma_pair=0.25, random_state=3).fit(*blobs(n=20))
    c = clone(m)
    assert c.get_params() == m.get_params()
    assert not hasattr(c, "learner_")


def test_fallback_params_base_without_scikit_learn() -> None:
    class Plain(_ParamsBase):
        def __init__(self, gamma: float = 1.0, margin: float = 2.0) -> None:
            self.gamma = gamma
            self.margin = margin

    p = Plain(gamma=3.0)
    assert p.get_params() == {"gamma": 3.0, "margin": 2.0}
    assert p.set_params(margin=5.0).margin == 5.0
    assert repr(p) == "Plain(gamma=3.0, margin=5.0)"
    with pytest.raises(ValueError, match="nope: not a parameter of Plain"):
        p.set_params(nope=1)
