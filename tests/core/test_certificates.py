"""Risk certificates: the numerics (docs/algorithms/certificates.md), coverage, tuples,
PAC-Bayes."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from service.core.certificates import QUANTITIES, NotEnoughHeldOut
from service.core.certificates.bounds import (
    _bin_inv_bisect,
    bin_inv_upper,
    hoeffding_upper,
    kl,
    kl_inv_lower,
    kl_inv_upper,
    xi,
)
from service.core.certificates.held_out import certify_held_out, tuple_errors
from service.core.certificates.pac_bayes import (
    GIBBS_TOLERANCE,
    SIGMA_GRID,
    THRESHOLD_GRID,
    certify_pac_bayes,
    gibbs_accept,
    gibbs_triplet_error,
)
from service.core.certificates.tuples import MIN_TUPLES, Tuples, build_tuples

# -- exact numbers (computed independently) ------------------------------------------------

#: m, k, delta, Bin^-1 (= Clopper-Pearson), kl^-1(k/m, ln(1/delta)/m), Hoeffding.
TABLE = [
    (100, 0, 0.05, 0.029513, 0.029513, 0.122387),
    (1000, 0, 0.05, 0.002991, 0.002991, 0.038702),
    (1000, 50, 0.05, 0.062863, 0.068685, 0.088702),
    (1000, 100, 0.05, 0.116992, 0.124808, 0.138702),
    (200, 20, 0.05, 0.141989, 0.159743, 0.186541),
    (10000, 500, 0.05, 0.053733, 0.055515, 0.062239),
    (5000, 250, 0.01, 0.057634, 0.059910, 0.071460),
]


@pytest.mark.parametrize(("m", "k", "delta", "binomial", "chernoff", "hoeffding"), TABLE)
def test_table_of_seed_specs_2_9(
    m: int, k: int, delta: float, binomial: float, chernoff: float, hoeffding: float
) -> None:
    assert float(bin_inv_upper(m, k, delta)) == pytest.approx(binomial, abs=1e-6)
    c = math.log(1 / delta) / m
    assert float(kl_inv_upper(k / m, c)) == pytest.approx(chernoff, abs=1e-6)
    assert float(hoeffding_upper(m, k, delta)) == pytest.approx(hoeffding, abs=1e-6)


def test_table_vectorised_equals_elementwise() -> None:
    m, k, delta = (np.array(col) for col in zip(*[row[:3] for row in TABLE], strict=True))
    assert np.allclose(bin_inv_upper(m, k, delta), [row[3] for row in TABLE], atol=1e-6)
    chernoff = kl_inv_upper(k / m, np.log(1 / delta) / m)
    assert np.allclose(chernoff, [row[4] for row in TABLE], atol=1e-6)


def test_xi_and_kl_inv_values() -> None:
    # the reference values are given to 5 decimals; the exact sums, to 1e-6 of those digits.
    assert xi(1) == pytest.approx(2.0, abs=1e-12)
    assert xi(8) == pytest.approx(4.24502, abs=5e-6)
    assert xi(100) == pytest.approx(13.20996, abs=5e-6)
    assert xi(1000) == pytest.approx(40.30321, abs=5e-6)
    assert float(kl_inv_upper(0.1, math.log(200) / 1000)) == pytest.approx(0.13368, abs=5e-6)
    for m in (1, 2, 7, 100, 3333, 10**5):  # Maurer: sqrt(m) <= xi(m) <= 2 sqrt(m)
        assert math.sqrt(m) <= xi(m) <= 2 * math.sqrt(m)
    # xi(2) by hand: 1 + 2 (1/2)(1/2) + 1 = 2.5
    assert xi(2) == pytest.approx(2.5, abs=1e-12)


def test_k_zero_closed_form_and_k_equal_m() -> None:
    m = np.array([1, 10, 100, 12345])
    assert np.array_equal(bin_inv_upper(m, 0, 0.05), -np.expm1(np.log(0.05) / m))
    assert np.array_equal(kl_inv_upper(0.0, np.log(1 / 0.05) / m), bin_inv_upper(m, 0, 0.05))
    assert np.array_equal(bin_inv_upper(m, m, 0.05), np.ones(4))


def test_kl_edges_and_symmetry() -> None:
    assert float(kl(0.0, 0.0)) == 0.0 and float(kl(1.0, 1.0)) == 0.0
    assert float(kl(0.3, 0.0)) == math.inf and float(kl(0.3, 1.0)) == math.inf
    assert float(kl(0.0, 0.3)) == pytest.approx(-math.log(0.7), rel=1e-15)
    q, p = np.random.default_rng(0).random((2, 1000))
    assert np.allclose(kl(q, p), kl(1 - q, 1 - p), rtol=1e-12, atol=0)
    assert (kl(q, p) >= 0).all()
    # near p -> 1 and q -> 0 with log1p / xlogy: no cancellation
    assert float(kl(1e-300, 1e-12)) == pytest.approx(-math.log1p(-1e-12), rel=1e-6)


# -- properties -------------------------------------------------------------


def _grid() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    q = np.concatenate([rng.random(20000), [0.0, 1.0, 1e-12, 1 - 1e-12, 0.5]])
    c = np.concatenate([rng.exponential(0.2, 20000), [0.0, 1e-9, 5.0, 40.0, 1e-300]])
    return q, c


def test_kl_inv_upper_properties() -> None:
    q, c = _grid()
    r = kl_inv_upper(q, c)
    assert (r >= q).all()
    assert (r <= q + np.sqrt(c / 2) + 1e-15).all()
    assert (r <= 1).all()
    # kl(q, r) <= c + 1e-9 unless r = 1, or r is the first double above the true inverse
    # (where kl is so steep that the next double down is already inside: float resolution).
    below = np.nextafter(r, 0)
    ok = (kl(q, r) <= c + 1e-9) | (r == 1) | (kl(q, below) <= c + 1e-9)
    assert ok.all()
    # the answer is the upper end: a hair less is still admissible only within tolerance
    inside = (r < 1) & (r > q)
    assert (kl(q[inside], r[inside] - 1e-9 * (1 - r[inside]) - 1e-11) <= c[inside]).all()


def test_kl_inv_upper_is_monotone_in_q_and_c() -> None:
    q = np.linspace(0, 1, 401)
    for c in (1e-4, 0.01, 0.3, 3.0):
        assert (np.diff(kl_inv_upper(q, c)) >= 0).all()
    c = np.linspace(0, 5, 401)
    for q0 in (0.0, 0.01, 0.3, 0.9):
        assert (np.diff(kl_inv_upper(q0, c)) >= 0).all()


def test_kl_inv_lower_properties() -> None:
    q, c = _grid()
    r = kl_inv_lower(q, c)
    assert ((r <= q) & (r >= 0)).all()
    assert (r >= q - np.sqrt(c / 2) - 1e-15).all()
    above = np.nextafter(r, 1)
    assert ((kl(q, r) <= c + 1e-9) | (r == 0) | (kl(q, above) <= c + 1e-9)).all()
    assert float(kl_inv_lower(0.5, 0.1)) == pytest.approx(1 - float(kl_inv_upper(0.5, 0.1)))


def test_binomial_bound_is_never_above_chernoff_and_is_the_exact_tail_inverse() -> None:
    rng = np.random.default_rng(2)
    m = rng.integers(1, 20000, 5000)
    k = (rng.random(5000) * (m + 1)).astype(int).clip(0, m)
    delta = np.exp(rng.uniform(np.log(1e-8), np.log(0.5), 5000))
    b = bin_inv_upper(m, k, delta)
    chernoff = kl_inv_upper(k / m, np.log(1 / delta) / m)
    assert (b <= chernoff + 1e-12).all()
    assert np.array_equal(b[k == 0], chernoff[k == 0]) or np.allclose(
        b[k == 0], chernoff[k == 0], rtol=1e-12, atol=1e-15
    )
    inner = (k > 0) & (k < m)
    tail = special.bdtr(k[inner], m[inner], b[inner])
    assert np.allclose(tail, delta[inner], rtol=1e-8, atol=0)


def test_bisection_fallback_agrees_with_the_beta_inverse() -> None:
    rng = np.random.default_rng(3)
    m = rng.integers(2, 5000, 300).astype(float)
    k = np.floor(rng.random(300) * (m - 1)) + 1
    delta = np.exp(rng.uniform(np.log(1e-6), np.log(0.3), 300))
    exact = special.betainccinv(k + 1, m - k, delta)
    bisected = _bin_inv_bisect(m, k, delta)
    assert (bisected >= exact - 1e-12).all()  # the upper end of the bracket
    assert np.allclose(bisected, exact, rtol=0, atol=2e-12)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: kl_inv_upper(1.5, 0.1), "q: must lie in"),
        (lambda: kl_inv_upper(0.5, -1.0), "c: must be >= 0"),
        (lambda: kl_inv_upper(0.5, math.nan), "c: must be >= 0"),
        (lambda: kl_inv_lower(-0.1, 0.1), "q: must lie in"),
        (lambda: bin_inv_upper(0, 0, 0.05), "m: must be"),
        (lambda: bin_inv_upper(10.5, 0, 0.05), "m: must be"),
        (lambda: bin_inv_upper(10, 11, 0.05), "k: must be"),
        (lambda: bin_inv_upper(10, 1, 0.0), "delta: must lie in"),
        (lambda: bin_inv_upper(10, 1, 1.0), "delta: must lie in"),
        (lambda: xi(0), "m: must be an integer"),
        (lambda: xi(2.0), "m: must be an integer"),  # type: ignore[arg-type]
    ],
)
def test_numerics_reject_bad_arguments_by_name(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# -- coverage: the real acceptance test -------------------------------------


class GaussianClasses:
    """5 Gaussian classes in d = 10 (unit within-class covariance) and a fixed metric L;
    draws fresh tuples and their errors.

    Class pairs follow the mix of :func:`build_tuples` with equally frequent classes: the
    first class uniform, the other class uniform among the rest.
    """

    classes, dim = 5, 10

    def __init__(self) -> None:
        rng = np.random.default_rng(7)
        self.centres = 1.2 * rng.normal(size=(self.classes, self.dim))
        self.L = np.eye(self.dim) + 0.4 * rng.normal(size=(self.dim, self.dim))
        self.image = self.centres @ self.L.T
        # The 80th percentile of same-class distances: false rejects ~0.2.
        noise = np.sqrt(2.0) * rng.normal(size=(100_000, self.dim)) @ self.L.T
        self.theta = float(np.quantile(np.einsum("ij,ij->i", noise, noise), 0.8))

    def samples(self, rng: np.random.Generator, k: np.ndarray) -> np.ndarray:
        return self.centres[k] + rng.normal(size=(len(k), self.dim))

    def _noise(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        """``L`` applied to N(0, scale^2 I) noise: the metric's view of a sample's noise."""
        return (scale * rng.normal(size=(n, self.dim))) @ self.L.T

    def errors(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        """Errors of n fresh tuples of each kind (in chunks: bounded memory). Works in the
        metric's image: ``L(x - x') = L(c_k - c_k') + L(noise - noise')``."""
        out: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES}
        sq = lambda z: np.einsum("ij,ij->i", z, z)  # noqa: E731
        for start in range(0, n, 100_000):
            size = min(100_000, n - start)
            k = rng.integers(0, self.classes, size)
            other = (k + rng.integers(1, self.classes, size)) % self.classes
            shift = self.image[k] - self.image[other]
            za, zp, zn = (self._noise(rng, size) for _ in range(3))
            out["triplet_error"].append(sq(za - zp) >= sq(shift + za - zn))
            out["false_accept"].append(sq(shift + self._noise(rng, size, 2**0.5)) <= self.theta)
            out["false_reject"].append(sq(self._noise(rng, size, 2**0.5)) > self.theta)
        return {name: np.concatenate(parts) for name, parts in out.items()}


def test_binomial_certificate_coverage_2000_repetitions() -> None:
    model = GaussianClasses()
    rng = np.random.default_rng(11)
    truth = {name: float(e.mean()) for name, e in model.errors(rng, 10**6).items()}
    assert min(truth.values()) > 0.05 and max(truth.values()) < 0.5  # a non-trivial test
    reps, m, delta = 2000, 500, 0.05
    limit = delta + 3 * math.sqrt(delta * (1 - delta) / reps)  # 0.0646
    assert limit == pytest.approx(0.0646, abs=1e-4)
    for name, errs in model.errors(rng, reps * m).items():
        k = errs.reshape(reps, m).sum(axis=1)
        bound = bin_inv_upper(m, k, delta)
        below = float(np.mean(bound < truth[name]))
        assert below <= limit, (name, below, truth[name])
        # and it is a tight bound, not a vacuous one: it misses now and then
        assert below > 0.005, (name, below)
        assert float(np.mean(bound)) < truth[name] + 0.06


def test_held_out_certificate_end_to_end_coverage() -> None:
    """The whole Tool A path (tuples from labels, counting, delta/3 each) on 300 fresh
    reservoirs: all three bounds hold together in >= 1 - delta of them (up to 3 SE)."""
    model = GaussianClasses()
    rng = np.random.default_rng(12)
    truth = {name: float(e.mean()) for name, e in model.errors(rng, 10**6).items()}
    reps, n, delta = 200, 3500, 0.05
    misses = 0
    for rep in range(reps):
        labels = rng.integers(0, model.classes, n)
        X = model.samples(rng, labels)
        c = certify_held_out(model.L, X, labels, model.theta, "caller", delta=delta, stream=rep)
        misses += any(getattr(c, name).bound < truth[name] for name in truth)
    assert misses / reps <= delta + 3 * math.sqrt(delta * (1 - delta) / reps)


# -- tuples from labels ----------------------------------------------------------------------


def _check_tuples(t: Tuples, labels: np.ndarray) -> None:
    used = np.concatenate([t.triplets.ravel(), t.positive_pairs.ravel(), t.negative_pairs.ravel()])
    assert len(np.unique(used)) == len(used)  # each sample in at most one tuple
    assert (labels[t.triplets[:, 0]] == labels[t.triplets[:, 1]]).all()
    assert (labels[t.triplets[:, 0]] != labels[t.triplets[:, 2]]).all()
    assert (labels[t.positive_pairs[:, 0]] == labels[t.positive_pairs[:, 1]]).all()
    assert (labels[t.negative_pairs[:, 0]] != labels[t.negative_pairs[:, 1]]).all()


@pytest.mark.parametrize("classes", [2, 3, 10, 200])
def test_tuples_are_disjoint_well_formed_and_use_most_samples(classes: int) -> None:
    rng = np.random.default_rng(classes)
    labels = rng.integers(0, classes, 7000)
    t = build_tuples(labels, np.random.default_rng(0))
    _check_tuples(t, labels)
    if classes <= 10:  # plenty of samples per class: almost every sample is in a tuple
        used = 3 * len(t.triplets) + 2 * len(t.positive_pairs) + 2 * len(t.negative_pairs)
        assert used >= 0.97 * len(labels)
        for kind in (t.triplets, t.positive_pairs, t.negative_pairs):
            assert abs(len(kind) - len(labels) / 7) <= 0.03 * len(labels) / 7


def test_tuples_depend_on_labels_and_the_generator_only() -> None:
    labels = np.random.default_rng(0).integers(0, 4, 1000)
    a = build_tuples(labels, np.random.default_rng(5))
    b = build_tuples(labels.copy(), np.random.default_rng(5))
    c = build_tuples(labels, np.random.default_rng(6))
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    assert not np.array_equal(a.triplets, c.triplets)


def test_class_mix_every_class_in_proportion_and_partners_spread() -> None:
    # 3 classes of sizes 1:2:4: anchors in proportion to class size (while others last), and
    # every ordered class pair occurs among negatives.
    labels = np.repeat([0, 1, 2], [1000, 2000, 4000])
    t = build_tuples(labels, np.random.default_rng(1))
    _check_tuples(t, labels)
    anchors = np.bincount(labels[t.positive_pairs[:, 0]], minlength=3)
    assert anchors / anchors.sum() == pytest.approx([1 / 7, 2 / 7, 4 / 7], abs=0.02)
    pairs = {(int(x), int(y)) for x, y in labels[t.negative_pairs]}
    assert pairs == {(i, j) for i in range(3) for j in range(3) if i != j}


def test_single_class_gives_no_cross_class_tuples() -> None:
    t = build_tuples(np.zeros(100, dtype=np.int64), np.random.default_rng(0))
    assert len(t.triplets) == len(t.negative_pairs) == 0 and len(t.positive_pairs) > 0


# -- Tool A: certify_held_out ----------------------------------------------------------------


def _reservoir(n: int, classes: int = 3, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    X = 2.0 * np.eye(d)[labels % d] + rng.normal(size=(n, d))
    L = np.eye(d) + 0.2 * rng.normal(size=(d, d))
    return L, X, labels


def test_certificate_counts_errors_with_the_frozen_metric_and_splits_delta() -> None:
    L, X, labels = _reservoir(2800)
    theta = 6.0
    c = certify_held_out(L, X, labels, theta, "caller", delta=0.05, seed=3, stream=2800)
    t = build_tuples(
        labels, np.random.Generator(np.random.PCG64(np.random.SeedSequence(3, spawn_key=(2, 2800))))
    )

    # brute force, one tuple at a time
    def d2(i: int, j: int) -> float:
        z = L @ (X[i] - X[j])
        return float(z @ z)

    trip = sum(d2(a, p) >= d2(a, q) for a, p, q in t.triplets)
    fa = sum(d2(i, j) <= theta for i, j in t.negative_pairs)
    fr = sum(d2(i, j) > theta for i, j in t.positive_pairs)
    for name, k, m in (
        ("triplet_error", trip, len(t.triplets)),
        ("false_accept", fa, len(t.negative_pairs)),
        ("false_reject", fr, len(t.positive_pairs)),
    ):
        b = getattr(c, name)
        assert (b.m, b.errors) == (m, k)
        assert b.empirical == k / m
        assert b.delta == pytest.approx(0.05 / 3)
        assert b.bound == float(bin_inv_upper(m, k, 0.05 / 3))
    assert c.certifies == "served" and c.validity == "per-request"
    assert (c.samples, c.classes, c.threshold, c.threshold_source) == (2800, 3, 6.0, "caller")
    assert "served metric" in c.statement and "exchangeable" in c.statement
    assert json.loads(json.dumps(c.to_dict()))["false_accept"]["m"] == len(t.negative_pairs)


def test_same_snapshot_same_certificate_and_kl_method_is_looser() -> None:
    L, X, labels = _reservoir(2100, seed=1)
    a = certify_held_out(L, X, labels, 5.0, "calibrated", seed=1, stream=9)
    b = certify_held_out(L, X.copy(), labels.copy(), 5.0, "calibrated", seed=1, stream=9)
    assert a == b
    k = certify_held_out(L, X, labels, 5.0, "calibrated", seed=1, stream=9, method="kl")
    for name in ("triplet_error", "false_accept", "false_reject"):
        exact, chernoff = getattr(a, name), getattr(k, name)
        assert (exact.m, exact.errors) == (chernoff.m, chernoff.errors)
        assert exact.bound <= chernoff.bound
        c = math.log(3 / 0.05) / chernoff.m
        assert chernoff.bound == float(kl_inv_upper(chernoff.empirical, c))


def test_ties_count_as_triplet_errors() -> None:
    X = np.zeros((140, 3))  # every distance is 0: every triplet a tie, every pair accepted
    labels = np.arange(140) % 2
    c = certify_held_out(np.eye(3), X, labels, 1.0, "caller")
    assert c.triplet_error.errors == c.triplet_error.m
    assert c.false_accept.errors == c.false_accept.m and c.false_reject.errors == 0


def test_not_enough_held_out_says_how_many_more() -> None:
    L, X, labels = _reservoir(2000, seed=4)
    with pytest.raises(NotEnoughHeldOut) as info:
        certify_held_out(L, X[:40], labels[:40], 5.0, "caller", window=5000)
    err = info.value
    assert err.have == 40 and err.needed > 0
    assert f"about {err.needed} more" in str(err)
    # that many more at the same class mix are enough
    n = 40 + err.needed
    certify_held_out(L, X[:n], labels[:n], 5.0, "caller", window=5000)
    with pytest.raises(NotEnoughHeldOut, match="of at least two classes"):
        certify_held_out(L, X[:500], np.zeros(500, dtype=np.int64), 5.0, "caller")
    with pytest.raises(NotEnoughHeldOut, match="raise it"):
        certify_held_out(L, X[:40], labels[:40], 5.0, "caller", window=40)
    assert MIN_TUPLES == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta": 0.0}, "delta: must be a number in"),
        ({"delta": 1.0}, "delta: must be a number in"),
        ({"delta": math.nan}, "delta: must be a number in"),
        ({"delta": "x"}, "delta: must be a number in"),
        ({"delta": 0.5}, "delta: the exact binomial inversion"),
        ({"method": "bayes"}, "method: must be one of"),
        ({"method": "pac-bayes"}, "method: the held-out certificate"),
        ({"threshold": -1.0}, "threshold: must be a finite number >= 0"),
        ({"threshold": math.inf}, "threshold: must be a finite number >= 0"),
        ({"L": np.ones(3)}, "L: expected a square matrix"),
        ({"L": np.full((4, 4), np.nan)}, "L: contains NaN"),
        ({"X": np.ones((700, 3))}, "X: expected shape"),
        ({"labels": np.zeros(5, dtype=int)}, "labels: expected 700 integer"),
        ({"labels": np.array(["a"] * 700)}, "labels: expected 700 integer"),
    ],
)
def test_certificate_rejects_bad_arguments_by_name(kwargs: dict, message: str) -> None:
    L, X, labels = _reservoir(700)
    args = {"L": L, "X": X, "labels": labels, "threshold": 5.0}
    args.update({k: v for k, v in kwargs.items() if k in args})
    rest = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(ValueError, match=message):
        certify_held_out(args["L"], args["X"], args["labels"], args["threshold"], "caller", **rest)
    # delta = 0.5 is fine with the unconditionally valid Chernoff form
    certify_held_out(L, X, labels, 5.0, "caller", delta=0.5, method="kl")


# -- Tool B: exact Gibbs risk ----------------------------------------------------------------


def _reference_gibbs(L: np.ndarray, a: np.ndarray, b: np.ndarray, sigma: float) -> float:
    """An independent path: the full d x d eigen-decomposition of A = a a^T - b b^T and
    adaptive quadrature of E_{X-}[P(X+ >= |l-| X- / l+)]."""
    A = np.outer(a, a) - np.outer(b, b)
    lam, W = np.linalg.eigh(A)
    lm, lp = lam[0], lam[-1]
    ncm = float(np.sum((L @ W[:, 0]) ** 2)) / sigma**2
    ncp = float(np.sum((L @ W[:, -1]) ** 2)) / sigma**2
    d = L.shape[0]

    def f(x: float) -> float:
        return float(stats.ncx2.pdf(x, d, ncm) * (1 - special.chndtr(-lm * x / lp, d, ncp)))

    mean, sd = ncm + d, math.sqrt(2 * (d + 2 * ncm))
    points = sorted({max(0.0, mean + k * sd) for k in (-40, -5, -1, 0, 1, 5, 40)})
    return sum(
        integrate.quad(f, lo, hi, epsabs=1e-15, epsrel=1e-13, limit=1000)[0]
        for lo, hi in itertools.pairwise(points)
    )


def test_exact_gibbs_triplet_error_matches_adaptive_quadrature() -> None:
    rng = np.random.default_rng(21)
    worst = 0.0
    for case in range(40):
        d = int(rng.choice([2, 3, 5, 10]))  # d = 1: a and b are colinear, see the next test
        L = rng.normal(size=(d, d))
        a, b = rng.normal(size=d), rng.normal(size=d)
        if case % 2:  # near the decision boundary: the hard cases
            b *= np.linalg.norm(L @ a) / np.linalg.norm(L @ b) * 10 ** rng.uniform(-0.1, 0.1)
        sigma = 10 ** rng.uniform(-1.5, 0.5) * np.linalg.norm(L) / d
        exact = float(gibbs_triplet_error(L, a[None], b[None], sigma)[0])
        ref = _reference_gibbs(L, a, b, sigma)
        if 1e-12 < exact < 1 - 1e-12:  # not settled by the tail bound
            worst = max(worst, abs(exact - ref))
        else:
            assert ref <= 1e-12 if exact <= 1e-12 else ref >= 1 - 1e-12
    assert worst <= 2e-11


def test_exact_gibbs_risk_matches_monte_carlo_within_4_standard_errors() -> None:
    rng = np.random.default_rng(22)
    d, draws = 5, 100_000
    L = np.eye(d) + 0.5 * rng.normal(size=(d, d))
    L /= np.linalg.norm(L)
    E = rng.normal(size=(draws, d, d))
    for sigma in (0.02, 0.08, 0.3):
        Lt = L + sigma * E
        a, b = rng.normal(size=(6, d)), rng.normal(size=(6, d))
        exact = gibbs_triplet_error(L, a, b, sigma)
        for i in range(6):
            hit = np.sum((Lt @ a[i]) ** 2, axis=1) >= np.sum((Lt @ b[i]) ** 2, axis=1)
            mc = float(hit.mean())
            se = math.sqrt(max(mc * (1 - mc), 1 / draws) / draws)
            assert abs(exact[i] - mc) <= 4 * se, (sigma, i, exact[i], mc)
        diff = rng.normal(size=(6, d))
        theta = float(np.median(np.sum((diff @ L.T) ** 2, axis=1)))
        lower, upper = gibbs_accept(L, diff, theta, sigma)
        for i in range(6):
            mc = float(np.mean(np.sum((Lt @ diff[i]) ** 2, axis=1) <= theta))
            se = math.sqrt(max(mc * (1 - mc), 1 / draws) / draws)
            assert lower[i] - 4 * se <= mc <= upper[i] + 4 * se, (sigma, i, upper[i], mc)


def test_gibbs_degenerate_triplets() -> None:
    L, s = np.eye(3), 0.3
    zero, e1, e2 = np.zeros(3), np.eye(3)[0], np.eye(3)[1]
    cases = [
        (zero, zero, 1.0),  # tie
        (zero, e1, 0.0),  # d(a, p) = 0 < d(a, n) almost surely
        (e1, 0.5 * e1, 1.0),  # b a shorter multiple of a: always an error
        (e1, -2.0 * e1, 0.0),  # a longer multiple: never (but with probability 0)
    ]
    for a, b, want in cases:
        got = float(gibbs_triplet_error(L, a[None], b[None], s)[0])
        assert got == pytest.approx(want, abs=1e-12), (a, b)
    for a, b in ((0.7, 0.5), (0.5, -0.7), (-1.0, 1.0)):  # d = 1: decided by |a| >= |b|
        got = float(gibbs_triplet_error([[2.0]], [[a]], [[b]], s)[0])
        assert got == (1.0 if abs(a) >= abs(b) else 0.0)
    # symmetric: |a| = |b|, orthogonal, isotropic noise and metric: a fair coin
    assert float(gibbs_triplet_error(L, e1[None], e2[None], s)[0]) == pytest.approx(0.5, abs=1e-9)
    lower, upper = gibbs_accept(L, zero[None], 0.0, s)  # distance 0 <= 0: always accepted
    assert lower[0] == upper[0] == 1.0


def test_pac_bayes_gibbs_risk_coverage() -> None:
    """kl^-1(R + tol, ln(xi(m)/delta)/m) over 200 repetitions of m = 50 fresh triplets and
    2000 repetitions of m = 500 fresh pairs (single sigma, prior = posterior: KL = 0, the
    tightest case): the bound is below the true Gibbs risk in <= delta + 3 SE of them."""
    model = GaussianClasses()
    L = model.L / np.linalg.norm(model.L)
    theta = model.theta / np.linalg.norm(model.L) ** 2
    sigma, delta = 1.0 / model.dim, 0.05
    rng = np.random.default_rng(31)

    def triplets(n: int) -> tuple[np.ndarray, np.ndarray]:
        k = rng.integers(0, model.classes, n)
        other = (k + rng.integers(1, model.classes, n)) % model.classes
        x = model.samples(rng, k)
        return x - model.samples(rng, k), x - model.samples(rng, other)

    def negative_diffs(n: int) -> np.ndarray:
        k = rng.integers(0, model.classes, n)
        other = (k + rng.integers(1, model.classes, n)) % model.classes
        return model.samples(rng, k) - model.samples(rng, other)

    # true Gibbs risks: exact per-tuple probabilities averaged over many fresh tuples
    a, b = triplets(10_000)
    true_triplet = float(gibbs_triplet_error(L, a, b, sigma).mean())
    true_far = float(gibbs_accept(L, negative_diffs(10**6), theta, sigma)[1].mean())
    assert 0.05 < true_triplet < 0.5 and 0.05 < true_far < 0.5
    for reps, m, true, risks in (
        (200, 50, true_triplet, lambda n: gibbs_triplet_error(L, *triplets(n), sigma)),
        (2000, 500, true_far, lambda n: gibbs_accept(L, negative_diffs(n), theta, sigma)[1]),
    ):
        R = risks(reps * m).reshape(reps, m).mean(axis=1)
        bound = kl_inv_upper(np.minimum(R + GIBBS_TOLERANCE, 1), math.log(xi(m) / delta) / m)
        below = float(np.mean(bound < true))
        assert below <= delta + 3 * math.sqrt(delta * (1 - delta) / reps), (m, below)


# -- Tool B: certify_pac_bayes ---------------------------------------------------------------


def test_pac_bayes_certificate_is_the_best_over_the_grid_without_a_factor_2() -> None:
    L, X, labels = _reservoir(1400, seed=5)
    prior = L + 0.01 * np.random.default_rng(0).normal(size=L.shape)
    c = certify_pac_bayes(
        L, prior, X, labels, 6.0, "calibrated", delta=0.05, seed=2, stream=7, prefix=1000
    )
    assert c.certifies == "gibbs" and c.method == "pac-bayes"
    assert "NOT of the served" in c.statement and "no Monte-Carlo" in c.statement
    assert c.details["delta_monte_carlo"] == 0.0
    d = L.shape[0]
    grid = SIGMA_GRID / d
    assert c.details["sigma_grid"] == pytest.approx(grid.tolist())
    Lh, Ph = L / np.linalg.norm(L), prior / np.linalg.norm(prior)
    theta_h = 6.0 / np.linalg.norm(L) ** 2
    t = build_tuples(
        labels, np.random.Generator(np.random.PCG64(np.random.SeedSequence(2, spawn_key=(2, 7))))
    )
    a = X[t.triplets[:, 0]] - X[t.triplets[:, 1]]
    b = X[t.triplets[:, 0]] - X[t.triplets[:, 2]]
    neg = X[t.negative_pairs[:, 0]] - X[t.negative_pairs[:, 1]]
    pos = X[t.positive_pairs[:, 0]] - X[t.positive_pairs[:, 1]]
    # FAR / FRR at the grid thresholds just above / below theta_h, the grid in the union bound
    far_t, frr_t = c.details["false_accept_threshold"], c.details["false_reject_threshold"]
    assert far_t in THRESHOLD_GRID and frr_t in THRESHOLD_GRID
    assert frr_t <= theta_h <= far_t <= frr_t * 2**0.125 * (1 + 1e-15)
    G = len(THRESHOLD_GRID)
    per_sigma = {
        "triplet_error": (1, lambda s: gibbs_triplet_error(Lh, a, b, s)),
        "false_accept": (G, lambda s: gibbs_accept(Lh, neg, far_t, s)[1]),
        "false_reject": (G, lambda s: 1 - gibbs_accept(Lh, pos, frr_t, s)[0]),
    }
    for name, (union, risk) in per_sigma.items():
        got = getattr(c, name)
        m = got.m
        best = 2.0
        for s in grid:  # every scale, no pruning
            kl_div = float(np.sum((Lh - Ph) ** 2)) / (2 * s**2)
            R = float(risk(s).mean())
            # ln(J G xi(m) / (delta/3)) / m inside kl^-1: never a factor 2
            c_s = (kl_div + math.log(len(grid) * union * xi(m) / (0.05 / 3))) / m
            bound = float(kl_inv_upper(min(R + GIBBS_TOLERANCE, 1), c_s))
            if bound < best:
                best, best_sigma, best_kl, best_R = bound, s, kl_div, R
        assert got.bound == pytest.approx(best, rel=1e-12, abs=1e-15)
        assert got.sigma == pytest.approx(best_sigma) and got.kl_divergence == pytest.approx(
            best_kl
        )
        assert got.empirical == pytest.approx(best_R, abs=1e-12)
        assert got.delta == pytest.approx(0.05 / 3)
    assert json.loads(json.dumps(c.to_dict()))["triplet_error"]["sigma"] == c.triplet_error.sigma


def test_pac_bayes_before_the_prefix_and_bad_input() -> None:
    L, X, labels = _reservoir(1400, seed=6)
    with pytest.raises(NotEnoughHeldOut, match="prior is frozen after 1000") as info:
        certify_pac_bayes(L, None, X, labels, 6.0, "caller", prefix=1000, trained=400)
    assert info.value.needed == 600 + 7 * MIN_TUPLES
    with pytest.raises(ValueError, match="L: a zero metric"):
        certify_pac_bayes(np.zeros_like(L), L, X, labels, 6.0, "caller")
    with pytest.raises(ValueError, match="sigmas: must be"):
        certify_pac_bayes(L, L, X, labels, 6.0, "caller", sigmas=[0.1, -1])
    with pytest.raises(ValueError, match="delta: must be"):
        certify_pac_bayes(L, L, X, labels, 6.0, "caller", delta=2)
    with pytest.raises(NotEnoughHeldOut):
        certify_pac_bayes(L, L, X[:30], labels[:30], 6.0, "caller")


def test_tuple_errors_on_a_hand_made_example() -> None:
    X = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    t = Tuples(
        triplets=np.array([[0, 1, 2], [0, 2, 1]]),
        positive_pairs=np.array([[0, 1], [0, 3]]),
        negative_pairs=np.array([[1, 2], [2, 3]]),
    )
    errs = tuple_errors(np.eye(2), X, t, threshold=4.0)
    assert errs["triplet_error"].tolist() == [False, True]
    assert errs["false_reject"].tolist() == [False, False]  # d = 1 and d = 4 <= 4
    assert errs["false_accept"].tolist() == [True, False]  # d = 4 <= 4 accepted; d = 13


@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1.0, 1e150, 1e300])
def test_certificates_stay_honest_numbers_at_float64_extremes(scale: float) -> None:
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 3, 1400)
    X = scale * (np.eye(4)[labels] + rng.normal(size=(1400, 4)))
    L = np.eye(4) + 0.3 * rng.normal(size=(4, 4))
    theta = 2.0 * scale * scale if 1e-150 <= scale <= 1e150 else 1.0  # squared units
    with np.errstate(all="raise"):  # no warning escapes: overflow is handled, not stumbled on
        held = certify_held_out(L, X, labels, theta, "caller")
        gibbs = certify_pac_bayes(L, L, X, labels, theta, "caller", sigmas=[0.1, 0.01])
    for c in (held, gibbs):
        for name in QUANTITIES:
            b = getattr(c, name)
            assert 0.0 <= b.empirical <= b.bound <= 1.0, (name, b)
    if scale == 1e300:  # every distance overflows: triplets are errors, no pair is accepted
        assert held.triplet_error.errors == held.triplet_error.m
        assert held.false_accept.errors == 0 and held.false_reject.errors == held.false_reject.m
