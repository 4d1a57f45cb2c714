"""Online SGD on the triplet margin loss for the linear ``L``: OPML's explicit twin.

In our words in docs/algorithms/gradient.md. Sources: the stability paper (Chen et al., AAAI 2023)
and Jaffe 2020 (gradient descent on the triplet margin loss); ``Eq. n`` alone is the OPML paper's.

The loss of a triplet with ``z = ||L a||^2 - ||L b||^2 + margin`` (Eq. 4's hinge argument)::

    l_mu(z) = mu * softplus(z / mu)        mu > 0   (Jaffe's LogSumExp smoothing; the corrected
    l_0(z)  = max(0, z)                    mu = 0    logistic loss is mu = 1; OPML's hinge)

The stability paper's Eq. (6) has the sign flipped (``log(1 + exp(-z))`` rewards wrong orderings);
this module implements ``softplus(+z)``. Its gradient is ``grad_L l = 2 q L A`` with
``A = a a^T - b b^T`` and ``q = sigma(z / mu)`` (``q = 1[z > 0]`` for the hinge), so one step
with the decay ``lam`` of the regulariser ``lam ||L||_F^2`` is the rank-two update

    L <- (1 - 2 eta lam) L - s (L a) a^T + s (L b) b^T,      s = 2 eta_t q,

computed like OPML's (Eq. 16): one BLAS pass for ``[L a, L b]`` and one fused pass adding both
rank-one terms: O(d^2), no ``d x d`` temporary, the same memory traffic as the OPML step.
With ``mu = 0``, ``lam = 0`` and ``2 eta = gamma`` it equals OPML's ``L (I + gamma A)^{-1}`` to
first order in ``gamma``: OPML is the implicit (backward-Euler) step, this the explicit one.

Step-size rules (1.6; ``t`` is the sample's 1-based position in the stream, so the rule does
not depend on how samples are batched):

* ``constant``: ``eta_t = eta``;
* ``invsqrt``: ``eta_t = eta / sqrt(t)`` (the stability paper's Corollary 1 schedule);
* ``descent`` (default): ``eta_t = min(eta, kappa / (2 q lambda_+))`` with ``lambda_+`` the
  largest eigenvalue of ``A`` (O(1), Lemma 2's closed form). Then ``s lambda_+ <= kappa`` and
  the triplet's ``z`` does not increase (002's descent condition, derived for the ``d x d``
  case in 1.6). ``kappa = 1`` is 002's greedy step, which makes ``I - s A`` singular: one step
  deletes a direction of ``L``; ``kappa`` is therefore limited to ``(0, 0.5]``, where
  ``I - s A`` keeps every eigenvalue on ``span{a, b}`` at or above 1/2.

The decay factor ``c = 1 - 2 eta lam`` uses the rule's step (before the descent cap), so it does
not depend on the data; it is applied lazily: ``L = scale * L~``, ``scale <- c scale`` costs
O(1), and the rank-two term is added to ``L~`` divided by ``c``. When ``scale``
falls below :data:`~service.core.gradient.MIN_SCALE` = 1e-16, ``L~`` is renormalised
(O(d^2), once every ``ln(1e16) / (2 eta lam)`` steps). The spec suggests 1e-100; 1e-16 keeps
``L~`` within 16 orders of magnitude of the served ``L``, so the overflow guard below, which
bounds ``L~``, never refuses a step that the served ``L`` could take.

The kernels (:func:`~service.core.gradient.sgd_triplet`, :func:`~service.core.gradient.sgd_pair`)
are in :mod:`service.core.gradient` with the loop, for numba's cache (see there).

Cold start: while one class has been seen, COPML's pair step (Eq. 20) has the explicit
twin ``L <- L - s (L delta) delta^T`` with ``s = gamma_pair`` (``2 eta = gamma_1``), under the
same rule (``descent``: ``s ||delta||^2 <= kappa``) and decay.

Guards (the same policy as :mod:`service.core.update`): a step whose squared distances, or
whose ``||A||_F^2 = lambda_+^2 + lambda_-^2``, overflow float64 is ``skipped`` (differences of
norm beyond ~1e77, e.g. samples of magnitude 1e100), as is a step that could push an entry of
``L~`` past :data:`~service.core._validation.MAX_ABS_ENTRY`; ``L`` is untouched then. ``q`` is
``expit(z / mu)``, which never overflows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.core._validation import Array
from service.core.gradient import STEP_RULES, sgd_triplet
from service.core.update import StepResult, _single


def triplet_loss(z: Any, mu: float) -> Array:
    """``l_mu(z) = mu * softplus(z / mu)`` (``mu > 0``), ``max(0, z)`` (``mu = 0``).

    Evaluated as ``max(z, 0) + mu * log1p(exp(-|z| / mu))``: no overflow for any ``z``.

    >>> triplet_loss([-1.0, 0.0, 2.0], 0.0).tolist()
    [0.0, 0.0, 2.0]
    >>> bool(triplet_loss(0.0, 0.1) == 0.1 * np.log(2))
    True
    """
    zs = np.asarray(z, dtype=np.float64)
    if mu == 0.0:
        out: Array = np.maximum(zs, 0.0)
        return out
    with np.errstate(over="ignore"):  # |z| / mu = inf: exp(-inf) = 0, the hinge
        out = np.maximum(zs, 0.0) + mu * np.log1p(np.exp(-np.abs(zs) / mu))
    return out


def sgd_step(
    L: Array,
    ab: Array,
    eta: float,
    margin: float = 1.0,
    mu: float = 0.0,
    step: str = "constant",
    kappa: float = 0.5,
    t: int = 1,
) -> StepResult:
    """One L-SGD step (1.5, no decay) on a C-contiguous ``L`` in place; ``ab = [a; b]``.

    >>> L = np.eye(2)
    >>> r = sgd_step(L, np.array([[0.0, 0.1], [1.0, 0.0]]), eta=0.25)   # s = 2 eta = 0.5
    >>> r.outcome, r.gamma, L.round(3).tolist()
    ('sgd_update', 0.25, [[1.5, 0.0], [0.0, 0.995]])
    """
    out = np.empty(4)
    code, _, _, _ = sgd_triplet(
        L,
        np.ascontiguousarray(ab, dtype=np.float64),
        1.0,
        float(np.abs(L).max()),
        t,
        eta,
        mu,
        kappa,
        0.0,
        STEP_RULES.index(step),
        margin,
        out,
    )
    return _single(code, out)
