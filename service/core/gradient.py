"""The compiled learning loop of the gradient learners: ``sgd``, ``sgd_psd`` and ``brm``.

The same one-pass triplet construction as OPML's loop (:func:`service.core.update.learn_batch`,
Sec. III-A): the positive is the class's latest sample, the negative the latest sample of a
class drawn uniformly among the other seen classes with the sample's own uniform, so the three
learners see exactly OPML's triplets for the same stream and seed. While one class has been
seen, ``sgd`` takes the explicit twin of COPML's pair step (:func:`service.core.sgd.sgd_pair`);
``sgd_psd`` and ``brm`` buffer the sample (``single_class``, as OPML without pre-stage).

Each sample's triplet step is dispatched on ``kind`` inside the loop: :data:`SGD`
(:func:`service.core.sgd.sgd_triplet`), :data:`SGD_PSD` (:func:`service.core.psd.psd_triplet`),
:data:`BRM` (:func:`service.core.brm.brm_triplet`). Like OPML's loop it is compiled with numba
(cached on disk) and releases the GIL.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from service.core._validation import Array
from service.core.brm import brm_triplet
from service.core.psd import psd_triplet
from service.core.sgd import sgd_pair, sgd_triplet
from service.core.update import _JIT, NEW_CLASS, SINGLE_CLASS

#: ``kind`` codes of :func:`learn_batch_gradient`, by algorithm name.
KINDS = {"sgd": 0, "sgd_psd": 1, "brm": 2}
SGD, SGD_PSD, BRM = range(3)


@njit(**_JIT)  # type: ignore[untyped-decorator]
def negative_slot(u: float, c: int, slot: int) -> int:
    """The buffer row of the negative: uniform among the ``c - 1`` classes other than
    ``slot``, drawn with the uniform ``u`` in [0, 1) (Sec. III-A)."""
    j = int(u * (c - 1))
    if j >= slot:
        j += 1
    return j


@njit(**_JIT)  # type: ignore[untyped-decorator]
def learn_batch_gradient(
    kind: int,
    L: Array,
    H: Array,
    X: Array,
    slots: Any,
    known: Any,
    uniforms: Array,
    t0: int,
    eta: float,
    gamma_pair: float,
    mu: float,
    kappa: float,
    lam: float,
    rule: int,
    margin: float,
    state: Array,
    codes: Any,
    values: Array,
    fro2: Array,
) -> None:
    """Learn the rows of ``X`` in order, in place on ``L~``, the buffer ``H`` and ``state``.

    ``slots``, ``known``, ``uniforms``, ``codes`` and ``values`` as in OPML's ``learn_batch``.
    ``t0`` is the number of samples learned before this batch (sample ``t`` of the batch is
    number ``t0 + t + 1`` of the stream, for ``invsqrt``). ``state = [scale, bound]``: the lazy
    decay scale (served ``L = scale * L~``) and the bound of ``max |L~_ij|``. ``fro2[t]``
    receives ``||A_t||_F^2`` of every step that formed a triplet or pair (NaN otherwise).
    """
    d = X.shape[1]
    ab = np.empty((2, d))
    scale, bound = state[0], state[1]
    for t in range(X.shape[0]):
        slot, c = slots[t], known[t]
        x, out = X[t], values[t]
        out[:] = np.nan
        fro2[t] = np.nan
        step = t0 + t + 1
        if slot == c:
            codes[t] = NEW_CLASS
        elif c == 1:
            if kind == SGD:
                codes[t], scale, bound, fro2[t] = sgd_pair(
                    L, x - H[slot], scale, bound, step, gamma_pair, kappa, lam, rule, out
                )
            else:
                codes[t] = SINGLE_CLASS
        else:
            j = negative_slot(uniforms[t], c, slot)
            for k in range(d):
                ab[0, k] = x[k] - H[slot, k]
                ab[1, k] = x[k] - H[j, k]
            if kind == SGD:
                codes[t], scale, bound, fro2[t] = sgd_triplet(
                    L, ab, scale, bound, step, eta, mu, kappa, lam, rule, margin, out
                )
            elif kind == SGD_PSD:
                codes[t], bound, fro2[t] = psd_triplet(
                    L, ab, bound, step, eta, mu, kappa, lam, rule, margin, out
                )
            else:
                codes[t], scale, bound, fro2[t] = brm_triplet(
                    L, ab, scale, bound, step, eta, kappa, lam, rule, margin, out
                )
        H[slot] = x
    state[0], state[1] = scale, bound
