"""The closed-form steps against their definitions computed with numpy.linalg (Eqs. 12, 16, 20)."""

from __future__ import annotations

import numpy as np
import pytest

from service.core._validation import MAX_ABS_ENTRY
from service.core.update import MIN_EIGENVALUE, eigenvalues, pair_step, triplet_step

DIMS = [2, 21, 64, 310]


def reference_triplet(L: np.ndarray, a: np.ndarray, b: np.ndarray, gamma: float) -> np.ndarray:
    """L (I + gamma A)^{-1} (Eq. 12), via a linear solve: (I + gamma A) L_t^T = L^T."""
    A = np.outer(a, a) - np.outer(b, b)
    return np.linalg.solve(np.eye(len(a)) + gamma * A, L.T).T


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def run_triplet(L0: np.ndarray, a: np.ndarray, b: np.ndarray, gamma: float, margin: float = 1e300):
    L = np.array(L0, order="C")
    step = triplet_step(L, np.stack([a, b]), gamma, margin)
    return L, step


def cases(d: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    a = rng.normal(size=d) / np.sqrt(d)
    b = rng.normal(size=d) / np.sqrt(d)
    return {
        "random": (a, b, 0.2),
        "colinear": (a, 0.5 * a, 0.2),
        "colinear_opposite": (a, -2.0 * a, 0.05),
        "x_t_equals_x_p": (np.zeros(d), b, 0.2),
        "x_t_equals_x_q": (a, np.zeros(d), 0.2),
        "large_norm": (1e3 * a, 1e3 * b, 1e-7),
        "large_norm_colinear": (1e3 * a, 1e3 * (a + 1e-9 * b), 1e-7),
        "tiny_norm": (1e-150 * a, 1e-150 * b, 0.2),
    }


@pytest.mark.parametrize("d", DIMS)
def test_triplet_update_equals_inverse_form(d: int) -> None:
    rng = np.random.default_rng(d)
    L0 = np.eye(d) + 0.3 * rng.normal(size=(d, d)) / np.sqrt(d)
    for name, (a, b, gamma) in cases(d, rng).items():
        L, step = run_triplet(L0, a, b, gamma)
        assert step.outcome == "triplet_update", name
        assert step.gamma == gamma, name
        assert rel_err(L, reference_triplet(L0, a, b, gamma)) < 1e-10, name


@pytest.mark.parametrize("d", DIMS)
def test_measurements_are_taken_before_the_update(d: int) -> None:
    rng = np.random.default_rng(d + 1)
    L0 = rng.normal(size=(d, d))
    a, b = rng.normal(size=d), rng.normal(size=d)
    _, step = run_triplet(L0, a, b, 1e-4, margin=1e300)
    assert step.d_pos == pytest.approx(np.sum((L0 @ a) ** 2), rel=1e-12)
    assert step.d_neg == pytest.approx(np.sum((L0 @ b) ** 2), rel=1e-12)
    assert step.hinge == pytest.approx(1e300 + step.d_pos - step.d_neg)


@pytest.mark.parametrize("d", DIMS)
def test_passive_step_leaves_L_bit_identical(d: int) -> None:
    rng = np.random.default_rng(d + 2)
    L0 = rng.normal(size=(d, d))
    a = 1e-3 * rng.normal(size=d)
    b = 10.0 * rng.normal(size=d)  # ||L b||^2 >> margin + ||L a||^2: hinge (Eq. 4) inactive
    L, step = run_triplet(L0, a, b, 0.1, margin=1.0)
    assert step.outcome == "passive"
    assert step.hinge is not None and step.hinge <= 0
    assert np.array_equal(L, L0)


@pytest.mark.parametrize("d", DIMS)
def test_pair_update_equals_inverse_form(d: int) -> None:
    rng = np.random.default_rng(d + 3)
    L0 = rng.normal(size=(d, d))
    for delta, gamma in [(rng.normal(size=d), 0.5), (1e2 * rng.normal(size=d), 1e-3)]:
        L = L0.copy()
        step = pair_step(L, delta, gamma)
        ref = L0 @ np.linalg.inv(np.eye(d) + gamma * np.outer(delta, delta))  # Eq. 20
        assert step.outcome == "pair_update"
        assert step.d_pos == pytest.approx(np.sum((L0 @ delta) ** 2), rel=1e-12)
        assert rel_err(L, ref) < 1e-10


@pytest.mark.parametrize("d", [2, 3, 21, 64])
def test_closed_form_eigenvalues_match_numpy(d: int) -> None:
    rng = np.random.default_rng(d + 4)
    for a, b in [
        (rng.normal(size=d), rng.normal(size=d)),
        (rng.normal(size=d), np.zeros(d)),
        (np.zeros(d), rng.normal(size=d)),
    ]:
        alpha, kappa, beta_b = a @ a, a @ b, b @ b
        plus, minus = eigenvalues(alpha, beta_b, alpha * beta_b - kappa**2)
        ref = np.linalg.eigvalsh(np.outer(a, a) - np.outer(b, b))
        scale = max(alpha, beta_b)
        assert plus == pytest.approx(ref[-1], abs=1e-12 * scale)
        assert minus == pytest.approx(ref[0], abs=1e-12 * scale)


@pytest.mark.parametrize("d", [2, 21, 64])
def test_step_that_would_break_positive_definiteness_is_shrunk(d: int) -> None:
    rng = np.random.default_rng(d + 5)
    L0 = np.eye(d)
    a = 0.1 * rng.normal(size=d)
    b = 10.0 * rng.normal(size=d) / np.sqrt(d)  # gamma ||b||^2 >> 1: 1 + gamma lambda_- < 0
    gamma = 1.0
    A = np.outer(a, a) - np.outer(b, b)
    assert np.linalg.eigvalsh(np.eye(d) + gamma * A)[0] < 0  # the unshrunk step is invalid
    L, step = run_triplet(L0, a, b, gamma)
    assert step.outcome == "shrunk_update"
    assert step.gamma is not None and 0 < step.gamma < gamma
    smallest = np.linalg.eigvalsh(np.eye(d) + step.gamma * A)[0]
    assert smallest == pytest.approx(MIN_EIGENVALUE, rel=1e-9)
    assert rel_err(L, reference_triplet(L0, a, b, step.gamma)) < 1e-10
    assert np.isfinite(L).all()


def test_overflowing_step_is_skipped_and_L_untouched() -> None:
    d = 8
    L0 = np.full((d, d), 1e149)
    a = np.full(d, 1e200)
    b = np.full(d, -1e200)
    L, step = run_triplet(L0, a, b, 0.1)
    assert step.outcome == "skipped"
    assert np.array_equal(L, L0)


def test_entry_bound_refuses_growth_past_the_limit() -> None:
    rng = np.random.default_rng(7)
    d = 4
    L0 = np.eye(d) * (MAX_ABS_ENTRY / 2)
    a = 1e-3 * rng.normal(size=d)
    b = rng.normal(size=d)
    b *= 1.0 / np.linalg.norm(b)
    # A shrunk step may stretch L by up to 1 / MIN_EIGENVALUE = 10 along b: past the limit.
    L, step = run_triplet(L0, a, b, 1e6)
    assert step.outcome == "skipped"
    assert np.array_equal(L, L0)
