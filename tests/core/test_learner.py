"""The learner: one-pass triplets (Sec. III-A), COPML pre-stage, validation, queries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.core import OUTCOMES, Learner, LearnerConfig


def state_of(learner: Learner) -> tuple[dict[str, np.ndarray], dict]:
    return learner.to_state()


def assert_same_state(a: Learner, b: Learner) -> None:
    arrays_a, meta_a = a.to_state()
    arrays_b, meta_b = b.to_state()
    assert meta_a == meta_b
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        assert np.array_equal(arrays_a[key], arrays_b[key]), key


def stream(n: int, d: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    y = rng.integers(0, classes, size=n)
    X = centres[y] + 0.5 * rng.normal(size=(n, d))
    return X, y


def test_negative_class_is_uniform_among_the_other_seen_classes() -> None:
    d, c = 3, 5
    learner = Learner(LearnerConfig(dim=d, gamma=1e-9, margin=1.0, seed=3, step="paper"))
    for k in range(c):
        learner.learn_one(np.eye(d)[k % d] * (k + 1) * 10.0, k)  # distinct class buffers
    x = np.zeros(d)
    counts: dict[float, int] = {}
    draws = 4000
    for _ in range(draws):
        r = learner.learn_one(x, 0)  # x_t = x_p after the first draw: d_pos = 0
        assert r.d_neg is not None
        key = round(r.d_neg, 3)
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == c - 1  # never its own class, every other class drawn
    for n in counts.values():  # each ~ draws / (c - 1) = 1000; 5 sigma = 137
        assert abs(n - draws / (c - 1)) < 150


def test_positive_is_the_latest_sample_of_the_class() -> None:
    learner = Learner(LearnerConfig(dim=2, algorithm="opml", seed=0))
    learner.learn_one([0.0, 0.0], "a")
    learner.learn_one([5.0, 0.0], "b")
    learner.learn_one([1.0, 0.0], "a")
    assert np.array_equal(learner.buffer("a"), [1.0, 0.0])
    L_before = learner.L.copy()
    r = learner.learn_one([1.0, 2.0], "a")
    assert r.d_pos == pytest.approx(np.sum((L_before @ [0.0, 2.0]) ** 2))
    assert r.d_neg == pytest.approx(np.sum((L_before @ [-4.0, 2.0]) ** 2))
    assert np.array_equal(learner.buffer("a"), [1.0, 2.0])


def test_copml_pair_steps_only_while_one_class_has_been_seen() -> None:
    learner = Learner(LearnerConfig(dim=2, algorithm="copml", gamma_pair=0.5))
    outcomes = [learner.learn_one([float(i), 0.0], "a").outcome for i in range(4)]
    assert outcomes == ["new_class", "pair_update", "pair_update", "pair_update"]
    # Eq. 20 shrinks L along delta = e_1 and leaves e_2 alone.
    assert learner.L[0, 0] < 1.0 and learner.L[1, 1] == 1.0
    learner.learn_one([0.0, 3.0], "b")
    assert learner.learn_one([4.0, 0.1], "a").outcome in {"triplet_update", "passive"}


def test_opml_without_prestage_buffers_single_class_samples() -> None:
    learner = Learner(LearnerConfig(dim=2, algorithm="opml"))
    outcomes = [learner.learn_one([float(i), 0.0], "a").outcome for i in range(3)]
    assert outcomes == ["new_class", "single_class", "single_class"]
    assert np.array_equal(learner.L, np.eye(2))
    assert np.array_equal(learner.buffer("a"), [2.0, 0.0])


def test_integer_label_means_its_decimal_string() -> None:
    learner = Learner(LearnerConfig(dim=2))
    learner.learn_one([0.0, 0.0], 3)
    assert learner.learn_one([1.0, 0.0], "3").outcome == "pair_update"
    assert learner.classes == ["3"]


def test_counts_cover_every_outcome_and_sum_to_version() -> None:
    X, y = stream(300, 4, 3)
    learner = Learner(LearnerConfig(dim=4, gamma=0.01, seed=1))
    results = learner.learn_many(X, y)
    assert set(learner.counts) == set(OUTCOMES)
    assert sum(learner.counts.values()) == learner.version == 300
    assert [r.outcome for r in results].count("new_class") == 3


BAD_SAMPLES = [
    ([np.nan, 0.0, 0.0], "a", "x: contains NaN"),
    ([np.inf, 0.0, 0.0], "a", "x: contains NaN or Inf"),
    ([0.0, 0.0], "a", "x: expected a vector of length 3"),
    ([[0.0, 0.0, 0.0]], "a", "x: expected a vector of length 3"),
    (["a", "b", "c"], "a", "x: must hold real numbers"),
    ([0.0, 0.0, 0.0], "", "y: a label must not be empty"),
    ([0.0, 0.0, 0.0], True, "y: a label is a string or an integer"),
    ([0.0, 0.0, 0.0], 1.5, "y: a label is a string or an integer"),
]


@pytest.mark.parametrize(("x", "y", "message"), BAD_SAMPLES)
def test_bad_sample_raises_naming_the_argument_and_changes_nothing(x, y, message) -> None:
    X, labels = stream(40, 3, 2)
    learner = Learner(LearnerConfig(dim=3, gamma=0.05))
    learner.learn_many(X, labels)
    reference = Learner.from_state(*learner.to_state())
    with pytest.raises(ValueError, match=message):
        learner.learn_one(x, y)
    assert_same_state(learner, reference)


def test_bad_row_anywhere_in_a_batch_changes_nothing() -> None:
    X, y = stream(50, 3, 2)
    learner = Learner(LearnerConfig(dim=3))
    reference = Learner.from_state(*learner.to_state())
    X[37, 1] = np.nan
    with pytest.raises(ValueError, match=r"X: row 37 contains NaN"):
        learner.learn_many(X, y)
    with pytest.raises(ValueError, match=r"y\[4\]"):
        learner.learn_many(X[:10], [0, 1, 0, 1, None, 0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="y: expected 10 labels"):
        learner.learn_many(X[:10], y[:9])
    assert_same_state(learner, reference)


#: Step sizes large enough that steps are shrunk / capped / projected on these streams.
STEPS = {
    "opml": {"gamma": 0.05, "margin": 2.0},
    "copml": {"gamma": 0.05, "margin": 2.0},
    "sgd": {"eta": 0.05, "mu": 0.3, "lam": 0.01, "margin": 2.0},
    "sgd_psd": {"eta": 0.05, "step": "invsqrt", "lam": 0.01, "margin": 2.0},
    "brm": {"eta": 0.5, "lam": 0.01, "margin": 0.2},
}


#: (algorithm, step) pairs: OPML/COPML under each of their step rules and gamma="auto"; the
#: gradient learners under their own steps (STEPS).
BATCHING_CASES = [(a, s) for a in ("opml", "copml") for s in ("scaled", "paper", "auto")] + [
    (a, "own") for a in ("sgd", "sgd_psd", "brm")
]


@pytest.mark.parametrize(("algorithm", "step"), BATCHING_CASES)
@pytest.mark.parametrize("normalize", ["none", "l2"])
@pytest.mark.parametrize("d", [3, 64, 310])
def test_learn_many_equals_the_learn_one_loop(
    algorithm: str, normalize: str, d: int, step: str
) -> None:
    if algorithm == "sgd_psd" and d == 310:
        d = 96  # O(d^3) per step: 310 would take a minute for nothing more
    X, y = stream(400 if d < 300 else 120, d, 4, seed=d)
    X[:30] = X[:1]  # a single-class, repeated-sample prefix
    y[:30] = y[0]
    own: dict[str, object] = dict(STEPS[algorithm])
    if step != "own":
        own["gamma"] = "auto" if step == "auto" else 0.05
        own["step"] = "paper" if step == "paper" else "scaled"
        own["auto_warmup"] = 60  # blocks of 30 triplets end inside the stream
    config = LearnerConfig(
        dim=d,
        algorithm=algorithm,  # type: ignore[arg-type]
        normalize=normalize,  # type: ignore[arg-type]
        seed=9,
        **own,  # type: ignore[arg-type]
    )
    one, many = Learner(config), Learner(config)
    loop_results = [one.learn_one(x, label) for x, label in zip(X, y, strict=True)]
    batch_results = many.learn_many(X, y)
    assert loop_results == list(batch_results)
    assert_same_state(one, many)
    assert np.array_equal(one.L, many.L)
    if step == "auto":
        assert one.race is not None and one.race["rung"] >= 2  # blocks scored


def test_queries_follow_equations_1_and_2() -> None:
    X, y = stream(200, 5, 3)
    learner = Learner(LearnerConfig(dim=5, gamma=0.05, seed=2))
    learner.learn_many(X, y)
    L = learner.L
    a, b = X[0], X[1]
    expected = float(np.sum((L @ (a - b)) ** 2))  # Eq. 2
    assert learner.squared_distance(a, b) == pytest.approx(expected, rel=1e-12)
    M = L.T @ L
    assert learner.distance(a, b) == pytest.approx(math.sqrt((a - b) @ M @ (a - b)), rel=1e-10)
    many = learner.squared_distances(a, X[:20])
    assert many.shape == (20,)
    assert np.allclose(many, [learner.squared_distance(a, row) for row in X[:20]], rtol=1e-12)
    assert np.allclose(learner.transform(X[:7]), X[:7] @ L.T, rtol=1e-12)


def test_l2_normalisation_applies_to_samples_and_queries() -> None:
    learner = Learner(LearnerConfig(dim=2, normalize="l2"))
    learner.learn_one([3.0, 4.0], "a")
    assert np.allclose(learner.buffer("a"), [0.6, 0.8])
    assert learner.squared_distance([1.0, 0.0], [100.0, 0.0]) == 0.0
    assert learner.squared_distance([1e300, 0.0], [0.0, 1e-300]) == pytest.approx(2.0)
    assert np.array_equal(learner.transform([[0.0, 0.0]]), [[0.0, 0.0]])  # zero stays zero


def test_query_validation_names_the_argument() -> None:
    learner = Learner(LearnerConfig(dim=2))
    with pytest.raises(ValueError, match="a: expected a vector of length 2"):
        learner.squared_distance([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="b: contains NaN"):
        learner.squared_distance([1.0, 2.0], [np.nan, 2.0])
    with pytest.raises(ValueError, match=r"b: expected shape \(n, 2\)"):
        learner.squared_distances([1.0, 2.0], [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="X: row 1 contains NaN"):
        learner.transform([[1.0, 2.0], [np.inf, 0.0]])


def test_set_metric_warm_starts_and_validates() -> None:
    learner = Learner(LearnerConfig(dim=2))
    learner.set_metric([[2.0, 0.0], [0.0, 1.0]])
    assert learner.squared_distance([1.0, 0.0], [0.0, 0.0]) == 4.0
    for bad, message in [
        ([[1.0, 0.0]], r"L: expected shape \(2, 2\)"),
        ([[np.nan, 0.0], [0.0, 1.0]], "L: contains NaN"),
        ([[1e200, 0.0], [0.0, 1.0]], "L: entries must not exceed"),
    ]:
        with pytest.raises(ValueError, match=message):
            learner.set_metric(bad)
    assert np.array_equal(learner.L, [[2.0, 0.0], [0.0, 1.0]])


def test_L_view_is_read_only() -> None:
    learner = Learner(LearnerConfig(dim=2))
    with pytest.raises(ValueError, match="read-only"):
        learner.L[0, 0] = 5.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dim", 0, r"dim: must be in \[1, 32768\], got 0"),
        ("dim", 40000, r"dim: must be in \[1, 32768\]"),
        ("dim", 2.5, "dim: must be an integer"),
        ("dim", "64", "dim: must be an integer, got '64'"),
        ("dim", True, "dim: must be an integer"),
        ("algorithm", "lmnn", "algorithm: must be one of 'opml', 'copml', 'sgd', 'sgd_psd', 'brm'"),
        ("step", "fast", "step: must be one of 'scaled', 'paper'"),
        ("step", "descent", "step: must be one of 'scaled', 'paper' for algorithm 'copml'"),
        ("eta", 0.1, "eta: not used by algorithm 'copml'"),
        ("gamma", 0.0, r"gamma: must be in \(0, 1\], got 0.0"),
        ("gamma", 1e300, r"gamma: must be in \(0, 1\], got 1e\+300"),
        ("gamma", 1.5, r"gamma: must be in \(0, 1\]"),
        ("gamma", "fast", "gamma: a number or 'auto'"),
        ("gamma", [0.1], "gamma: must be a number"),
        ("gamma_pair", float("nan"), r"gamma_pair: must be in \(0, 1\], got nan"),
        ("gamma_pair", 2.0, r"gamma_pair: must be in \(0, 1\]"),
        ("margin", -1.0, r"margin: must be in \(0, 100\]"),
        ("margin", 1e3, r"margin: must be in \(0, 100\]"),
        ("margin", float("inf"), r"margin: must be in \(0, 100\]"),
        ("normalize", "l1", "normalize: must be 'none' or 'l2'"),
        ("seed", -1, r"seed: must be in \[0, "),
        ("seed", 2**128, r"seed: must be in \[0, "),
        ("seed", 1.0, "seed: must be an integer"),
        ("calibration_window", 0, r"calibration_window: must be in \[1, 1000000\]"),
        ("calibration_window", "10", "calibration_window: must be an integer"),
        ("auto_warmup", 5, r"auto_warmup: must be in \[10, 100000\]"),
    ],
)
def test_config_rejects_bad_hyperparameters(field: str, value: object, message: str) -> None:
    kwargs: dict[str, object] = {"dim": 3, field: value}
    with pytest.raises(ValueError, match=message):
        LearnerConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gamma", 1e300, r"gamma: must be in \(0, 1e\+06\]"),
        ("gamma", 2e6, r"gamma: must be in \(0, 1e\+06\]"),
        ("gamma", "auto", "gamma: 'auto' needs step='scaled'"),
        ("gamma_pair", -1e-3, r"gamma_pair: must be in \(0, 1e\+06\]"),
        ("margin", 1e13, r"margin: must be in \(0, 1e\+12\]"),
    ],
)
def test_paper_rule_ranges_are_its_own(field: str, value: object, message: str) -> None:
    kwargs: dict[str, object] = {"dim": 3, "step": "paper", field: value}
    with pytest.raises(ValueError, match=message):
        LearnerConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("algorithm", "field", "value", "message"),
    [
        ("sgd", "step", "scaled", "step: must be one of 'constant', 'descent', 'invsqrt' for algo"),
        ("brm", "step", "paper", "step: must be one of 'constant', 'descent', 'invsqrt' for algo"),
        ("opml", "step", "invsqrt", "step: must be one of 'scaled', 'paper' for algorithm 'opml'"),
        ("sgd", "gamma", "auto", "gamma: not used by algorithm 'sgd'"),
        ("sgd_psd", "auto_warmup", 100, "auto_warmup: not used by algorithm 'sgd_psd'"),
        ("sgd", "gamma_pair", 0.0, "gamma_pair: must be a finite number > 0"),
    ],
)
def test_step_values_depend_on_the_algorithm(
    algorithm: str, field: str, value: object, message: str
) -> None:
    kwargs: dict[str, object] = {"dim": 3, "algorithm": algorithm, field: value}
    with pytest.raises(ValueError, match=message):
        LearnerConfig(**kwargs)  # type: ignore[arg-type]
    gradient = LearnerConfig(dim=3, algorithm="sgd")
    assert (gradient.step, gradient.auto_warmup, gradient.gamma) == ("descent", None, None)
    assert LearnerConfig(dim=3, algorithm="opml").auto_warmup == 1000


def test_config_defaults_depend_on_the_step_rule() -> None:
    scaled = LearnerConfig(dim=3)
    paper = LearnerConfig(dim=3, step="paper")
    assert (scaled.step, scaled.gamma, scaled.gamma_pair, scaled.margin) == ("scaled", 0.05, 0.1, 1)
    assert (paper.step, paper.gamma, paper.gamma_pair, paper.margin) == ("paper", 1e-3, 1e-2, 1)
    # At the top of their ranges (inclusive) both rules are accepted.
    LearnerConfig(dim=32768, gamma=1.0, gamma_pair=1.0, margin=100.0, seed=2**128 - 1)
    LearnerConfig(dim=1, step="paper", gamma=1e6, gamma_pair=1e6, margin=1e12)
    assert LearnerConfig(dim=3, gamma="auto").gamma == "auto"
    # The stored form (asdict) builds the same config again, as the service reloads it.
    from dataclasses import asdict

    assert LearnerConfig(**asdict(paper)) == paper
