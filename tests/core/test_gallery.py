"""The transformed gallery: incremental refreshes against a full recompute, and the search
against the brute force (numpy, ``||L(q - g)||^2`` for every row), ties by id included."""

from __future__ import annotations

import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.gallery import (
    TransformedGallery,
    brute_force,
    difference_factors,
    max_relative_err,
    refresh_method,
)


def brute_top_k(G: np.ndarray, alive: np.ndarray, q: np.ndarray, L: np.ndarray, k: int):
    """Rows of the k smallest ``||L(q - g)||^2`` among alive rows, ties by row index (the
    order the tests give ids in), computed with numpy."""
    diff = (q - G) @ L.T
    sq = np.einsum("ij,ij->i", diff, diff)
    rows = [i for i in np.lexsort((np.arange(len(G)), sq)) if alive[i]]
    return rows[:k], sq


def ranked(rows: np.ndarray, values: np.ndarray, k: int) -> list[int]:
    """An answer of ``nearest`` sorted by (value, row) and cut at k (what the engine does)."""
    return [int(r) for _, r in sorted(zip(values.tolist(), rows.tolist(), strict=True))[:k]]


def assert_within_bound(view: TransformedGallery, G: np.ndarray, L: np.ndarray) -> None:
    """``||z_i - L g_i|| <= err ||g_i|| + err_abs`` for every row, ``L g_i`` in extended
    precision (the bound the search relies on)."""
    exact = (G.astype(np.longdouble) @ L.T.astype(np.longdouble)).astype(np.float64)
    error = np.linalg.norm(view.Z - exact, axis=1)
    assert np.all(error <= view.err * np.linalg.norm(G, axis=1) + view.err_abs)


def learner_steps(d: int, steps: int, seed: int) -> Learner:
    """A learner that has made ``steps`` triplet steps (each a rank-two change of L)."""
    rng = np.random.default_rng(seed)
    learner = Learner(LearnerConfig(dim=d, gamma=0.05, margin=5.0, seed=seed))
    learner.learn_many(rng.normal(size=(3, d)), ["a", "b", "c"])
    while learner.counts["triplet_update"] + learner.counts["shrunk_update"] < steps:
        learner.learn_one(rng.normal(size=d), str(rng.integers(3)))
    return learner


def test_incremental_refresh_equals_a_full_recompute() -> None:
    d, n = 128, 500
    rng = np.random.default_rng(0)
    G = rng.normal(size=(n, d))
    learner = learner_steps(d, 0, seed=1)
    view, _ = TransformedGallery.empty(learner.L).with_rows(G)
    incremental = 0
    for _ in range(12):
        before = learner.counts
        learner.learn_one(rng.normal(size=d), str(rng.integers(3)))
        after = learner.counts
        rank = 2 * (after["triplet_update"] - before["triplet_update"]) + 2 * (
            after["shrunk_update"] - before["shrunk_update"]
        )
        view, method = view.refreshed(learner.L, rank)
        incremental += method == "incremental"
        exact = G @ learner.L.T
        assert_within_bound(view, G, learner.L)
        np.testing.assert_allclose(view.Z, exact, rtol=0, atol=1e-12 * np.abs(exact).max())
    assert incremental >= 6  # most single steps changed L, each by rank two


def test_a_false_rank_bound_cannot_corrupt_the_view() -> None:
    """Told rank 0 for a change of rank 24, the factorisation misses most of it: the
    measured residual pushes the bound past the cap and the refresh falls back to full."""
    d, n = 64, 300
    rng = np.random.default_rng(2)
    G = rng.normal(size=(n, d))
    L0 = np.eye(d)
    L1 = L0 + rng.normal(size=(d, 24)) @ rng.normal(size=(24, d)) * 0.01
    view, _ = TransformedGallery.empty(L0).with_rows(G)
    refreshed, method = view.refreshed(L1, rank=0)
    assert method == "full"
    assert_within_bound(refreshed, G, L1)
    assert refreshed.err < max_relative_err(d) * np.linalg.norm(L1)


def test_a_full_refresh_is_a_float32_product_within_its_bound() -> None:
    """A full refresh holds ``Z`` as the float32 product (half the cost); its bound holds,
    incremental refreshes may follow it, an enrol rounds its images to float32, and an enrol
    past float32's range turns ``Z`` to float64; every answer stays the brute force's."""
    d, n = 128, 400
    rng = np.random.default_rng(9)
    G = rng.normal(size=(n, d))
    L0 = np.eye(d) + 0.1 * rng.normal(size=(d, d))
    view, _ = TransformedGallery.empty(np.eye(d)).with_rows(G)
    assert view.err_abs == 0.0  # made in float64
    view, method = view.refreshed(L0, rank=None)
    assert method == "full" and view.err_abs > 0.0
    np.testing.assert_array_equal(view.Z, view.Z.astype(np.float32))  # float32 values
    assert 1e-8 * np.linalg.norm(L0) < view.err < max_relative_err(d) * np.linalg.norm(L0)
    assert_within_bound(view, G, L0)
    L1 = L0 + np.outer(rng.normal(size=d), rng.normal(size=d)) * 0.01  # rank one
    view, method = view.refreshed(L1, rank=1)
    assert method == "incremental"
    assert_within_bound(view, G, L1)
    view, _ = view.refreshed(L0, rank=None)  # float32 again
    extra = rng.normal(size=(30, d))
    view, start = view.with_rows(extra)
    assert start == n
    G = np.vstack([G, extra])
    np.testing.assert_array_equal(view.Z, view.Z.astype(np.float32))
    assert_within_bound(view, G, L0)
    huge = 1e30 * rng.normal(size=(1, d))  # its image is past float32's range
    wide, _ = view.with_rows(huge)
    assert wide.err == view.err and not np.array_equal(wide.Z[-1], wide.Z[-1].astype(np.float32))
    np.testing.assert_array_equal(wide.Z[: len(G)], view.Z)  # the float32 rows, converted
    alive = np.ones(len(G), dtype=bool)
    for q in rng.normal(size=(10, d)):
        ((rows, values),) = view.nearest(q[None, :], 5)
        want, sq = brute_top_k(G, alive, q, L0, 5)
        assert ranked(rows, values, 5) == want
        np.testing.assert_allclose(values, sq[rows], rtol=1e-12)
    ((rows, values),) = wide.nearest(G[:1], 2)
    assert ranked(rows, values, 2)[0] == 0


def test_difference_factors_bound_their_residual() -> None:
    rng = np.random.default_rng(3)
    d = 48
    L0 = rng.normal(size=(d, d))
    P, V = rng.normal(size=(d, 6)), rng.normal(size=(6, d))
    L1 = L0 + P @ V
    Q, B, bound = difference_factors(L0, L1, rank=6)
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-12)
    residual = np.linalg.norm((L1 - L0) - Q @ B)
    assert residual <= bound < 1e-10 * np.linalg.norm(L1)
    _, _, short = difference_factors(L0, L1, rank=2)  # too few columns: the bound says so
    assert short > 1e-3 * np.linalg.norm(L1 - L0)


def test_policy() -> None:
    assert refresh_method(2, 10_000, 128) == "incremental"  # 32 (2 + 2) = 128
    assert refresh_method(3, 10_000, 128) == "full"
    assert refresh_method(14, 10_000, 512) == "incremental"  # 32 (14 + 2) = 512
    assert refresh_method(15, 10_000, 512) == "full"
    assert refresh_method(None, 10_000, 128) == "full"  # unknown change (PUT metric)
    assert refresh_method(2, 128, 128) == "full"  # n <= d: the full product is as cheap


@pytest.mark.parametrize("d", [3, 17, 64])
def test_nearest_is_the_brute_force_with_ties_by_id(d: int) -> None:
    rng = np.random.default_rng(d)
    G = rng.normal(size=(300, d))
    G[10] = G[20] = G[30]  # three equal rows: exact ties, broken by row (id) order
    G[40] = G[5]
    learner = learner_steps(d, 5, seed=d)
    view, _ = TransformedGallery.empty(np.eye(d)).with_rows(G)
    view, _ = view.refreshed(learner.L, rank=None)
    view = view.without(np.array([7, 20]))  # dead rows never answer
    alive = np.ones(len(G), dtype=bool)
    alive[[7, 20]] = False
    queries = np.vstack([rng.normal(size=(20, d)), G[[30, 5, 7]]])
    for k in (1, 3, 10, view.size):
        answers = view.nearest(queries, k)
        for q, (rows, values) in zip(queries, answers, strict=True):
            want, sq = brute_top_k(G, alive, q, learner.L, k)
            assert ranked(rows, values, k) == want
            np.testing.assert_allclose(values, sq[rows], rtol=1e-12, atol=1e-12)
            assert len(rows) < k + 4  # the bound stage keeps k rows and the rare near-tie


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e12, 1e25])
def test_rows_closer_than_float32_can_tell_are_ranked_exactly(scale: float) -> None:
    """The bound stage's product runs in float32 (its rounding bounded and added to delta)
    while the scale allows, in float64 beyond (1e25) and with every row left to the exact
    stage where float32 underflows (1e-30): 60 rows 1e-10 apart relative to their size, far
    below float32's resolution, are ranked as the brute force ranks them."""
    d = 24
    rng = np.random.default_rng(11)
    base = rng.normal(size=d)
    near = base + 1e-10 * rng.normal(size=(60, d))
    G = scale * np.vstack([near, base + rng.normal(size=(200, d))])
    L = np.eye(d) + 0.1 * rng.normal(size=(d, d))
    view, _ = TransformedGallery.empty(L).with_rows(G)
    alive = np.ones(len(G), dtype=bool)
    for q in scale * (base + 1e-10 * rng.normal(size=(3, d))):
        for k in (1, 5, 60):
            ((rows, values),) = view.nearest(q[None, :], k)
            assert ranked(rows, values, k) == brute_top_k(G, alive, q, L, k)[0]


def test_near_ties_are_decided_by_the_exact_values() -> None:
    """Rows a few ulps apart: the expanded square cannot tell them apart, the exact stage
    can; the answer is ordered by the brute-force values."""
    d = 32
    rng = np.random.default_rng(5)
    base = rng.normal(size=d)
    G = np.vstack([base + i * 1e-15 * rng.normal(size=d) for i in range(8)] + [base + 3.0])
    L = rng.normal(size=(d, d))
    view, _ = TransformedGallery.empty(L).with_rows(G)
    q = base + 0.5
    ((rows, values),) = view.nearest(q[None, :], k=3)
    assert set(range(8)) <= set(rows.tolist())  # every near-tie was recomputed exactly
    exact = brute_force(G, np.arange(len(G)), q, L)
    assert ranked(rows, values, 3) == [int(i) for i in np.lexsort((np.arange(9), exact))[:3]]


def test_equal_rows_get_equal_values() -> None:
    d = 37  # rows at odd offsets: alignment must not change the arithmetic
    rng = np.random.default_rng(6)
    G = np.repeat(rng.normal(size=(1, d)), 50, axis=0)
    values = brute_force(G, np.arange(50), rng.normal(size=d), rng.normal(size=(d, d)))
    assert len(set(values.tolist())) == 1


def test_appending_never_changes_an_older_view() -> None:
    rng = np.random.default_rng(7)
    d = 8
    first, _ = TransformedGallery.empty(np.eye(d)).with_rows(rng.normal(size=(10, d)))
    snapshot = first.Z.copy()
    second, start = first.with_rows(rng.normal(size=(100, d)))  # grows past the capacity
    third, _ = second.with_rows(rng.normal(size=(5, d)))  # in place
    branch, _ = second.with_rows(rng.normal(size=(5, d)))  # second is no longer the latest
    assert start == 10 and third.n == branch.n == 115
    np.testing.assert_array_equal(first.Z, snapshot)
    assert not np.array_equal(third.G[110:], branch.G[110:])
    np.testing.assert_array_equal(third.G[:110], second.G)


def test_compacted_keeps_alive_rows_in_order() -> None:
    rng = np.random.default_rng(8)
    G = rng.normal(size=(20, 4))
    view, _ = TransformedGallery.empty(np.eye(4)).with_rows(G)
    compact, kept = view.without(np.array([0, 3, 19])).compacted()
    assert kept.tolist() == [i for i in range(20) if i not in (0, 3, 19)]
    np.testing.assert_array_equal(compact.G, G[kept])
    assert compact.size == compact.n == 17


def test_k_out_of_range_is_refused() -> None:
    view, _ = TransformedGallery.empty(np.eye(2)).with_rows(np.eye(2))
    with pytest.raises(ValueError, match=r"^k: "):
        view.nearest(np.zeros((1, 2)), 3)
    with pytest.raises(ValueError, match=r"^k: "):
        view.nearest(np.zeros((1, 2)), 0)


def test_overflowing_rows_are_left_to_the_exact_stage() -> None:
    G = np.array([[1e200, 0.0], [1.0, 0.0], [2.0, 0.0]])
    view, _ = TransformedGallery.empty(np.eye(2)).with_rows(G)
    ((rows, values),) = view.nearest(np.array([[0.0, 0.0]]), k=2)
    assert ranked(rows, values, 2) == [1, 2]
    ((rows, values),) = view.nearest(np.array([[0.0, 0.0]]), k=3)
    assert ranked(rows, values, 3) == [1, 2, 0] and values[rows.tolist().index(0)] == np.inf
