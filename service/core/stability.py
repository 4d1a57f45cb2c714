"""Step-mass stability diagnostics (docs/algorithms/gradient.md), labelled as such: **never a
generalisation bound**. The stability paper (Chen et al., AAAI 2023) is the source; its theorem and
lemma numbers are used below.

Replacing one sample's *features* (label kept) leaves the service's triplet index sequence
unchanged: it depends only on the labels and the seeded generator. The paper's Lemma 2
recursion then bounds how far two runs drift apart by ``2 L^2`` times the total step size of
the steps that used the replaced sample. Per sample ``i`` the learner keeps its step mass

    S_i = sum of eta_t over the steps t that used sample i

(as anchor at its arrival, as positive at the next arrival of its class, as negative each time
its class is drawn while it is the buffer entry; every step that formed a triplet or a pair
counts, passive and skipped ones too, since with other features the same step could have been
active). ``eta_t`` is the rule's step before the ``descent`` cap (``eta`` or ``eta / sqrt(t)``;
``gamma`` / ``gamma_pair`` for OPML/COPML, whose steps are in their own units): the cap depends
on the data, so the drift bound must hold for the uncapped step of the other run. O(1) per
step: one accumulator per buffer row, folded into a running max / sum when the row is
overwritten. With ``rehearsal > 0`` (:mod:`service.core.rehearsal`) a rehearsed sample takes a
new buffer entry, so its masses are kept per occurrence: ``n_samples`` counts occurrences and
``S_i`` is one occurrence's mass, not the sum over a sample's occurrences. Reported
(:class:`Stability`):

* ``step_mass_max = max_i S_i``, ``step_mass_mean``, ``n_samples``, ``n_steps`` (steps that
  formed a triplet or pair), ``n_updates`` (steps that changed ``L``), ``sum_eta``;
* ``B = max ||x||`` of the learned (normalised) samples, ``lipschitz = 8 B^2`` (a bound of
  ``||A_t||_F``), ``smoothness = 16 B^4 / mu`` (the tight constant; the paper writes ``64 B^4``
  with ``|phi''| <= 1`` where ``1/4`` holds) for ``sgd`` / ``sgd_psd`` with ``mu > 0``;
* ``capped_fraction``: the share of steps whose step met the 1-expansiveness condition of the
  regularised loss, ``eta_t (alpha_t + 2 lam) <= 2`` with ``alpha_t = ||A_t||_F^2 / (4 mu)``
  (the paper's ``eta <= 2 / alpha``, Lemma 2 / Lemma 9, with the decay's curvature added);
  ``sgd`` / ``sgd_psd`` only (for ``mu = 0`` the loss is not smooth and no step meets it);
* ``gamma_hat = 2 (8 B^2)^2 step_mass_max``: Lemma 2's uniform-stability parameter for feature
  replacement, reported **only** for ``sgd_psd`` with ``mu > 0`` when every step met the
  condition (convex loss in ``M``, per-step projection, non-expansive steps); ``None`` for every
  other algorithm and setting. OPML, COPML, L-SGD and BRM are not convex in their parameter
  (4.2): no stability parameter exists for them.

Even where ``gamma_hat`` is defined, the paper's Theorem 1 turns it into a bound that is
numerically vacuous at any realistic ``n`` (:func:`theorem1_bound`): the honest
generalisation numbers are held-out certificates, not these diagnostics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numba import njit

from service.core._validation import Array
from service.core.gradient import INVSQRT
from service.core.update import (
    _JIT,
    NEW_CLASS,
    PAIR_UPDATE,
    SGD_UPDATE,
    SHRUNK_UPDATE,
    SINGLE_CLASS,
    TRIPLET_UPDATE,
)

# Running totals kept in one float64 array (counts are exact up to 2^53).
MASS_MAX, MASS_SUM, FOLDED, STEPS, UPDATES, SUM_ETA, CAPPED, NORM_MAX = range(8)
_TOTALS = ("mass_max", "mass_sum", "folded", "steps", "updates", "sum_eta", "capped", "norm_max")


@dataclass(frozen=True, slots=True)
class Stability:
    """Step-mass diagnostics of a learner (see the module docstring); not a bound.

    >>> s = Stability(n_samples=4, n_steps=2, n_updates=2, sum_eta=0.5, step_mass_max=0.5,
    ...               step_mass_mean=0.375, B=1.0, lipschitz=8.0, smoothness=None,
    ...               capped_fraction=None, gamma_hat=None)
    >>> s.to_dict()["gamma_hat"] is None
    True
    """

    n_samples: int
    n_steps: int
    n_updates: int
    sum_eta: float
    step_mass_max: float
    step_mass_mean: float | None
    B: float | None
    lipschitz: float | None
    smoothness: float | None
    capped_fraction: float | None
    gamma_hat: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@njit(**_JIT)  # type: ignore[untyped-decorator]
def account(
    X: Array,
    slots: Any,
    known: Any,
    negatives: Any,
    codes: Any,
    fro2: Array,
    t0: int,
    rule: int,
    eta_triplet: float,
    eta_pair: float,
    mu: float,
    lam: float,
    masses: Array,
    totals: Array,
) -> None:
    """Fold one batch's steps into the per-row ``masses`` and the running ``totals``."""
    for t in range(X.shape[0]):
        x = X[t]
        total = 0.0
        for v in x:
            total += v * v
        norm = math.sqrt(total)
        if not 1e-300 < total < math.inf:  # under- or overflow: ||x|| from x / max |x_i|
            top = np.abs(x).max()
            total = 0.0
            if top > 0.0:
                for v in x:
                    total += (v / top) * (v / top)
            norm = top * math.sqrt(total)
        totals[NORM_MAX] = max(totals[NORM_MAX], norm)
        slot, c, code = slots[t], known[t], codes[t]
        if code == NEW_CLASS:
            masses[slot] = 0.0
            continue
        if code == SINGLE_CLASS:  # buffered only: the old entry leaves with its mass
            eta = 0.0
        else:
            eta = eta_pair if c == 1 else eta_triplet
            if rule == INVSQRT:
                eta /= math.sqrt(t0 + t + 1)
            masses[slot] += eta  # the positive (or the pair's older sample)
            if c > 1:
                masses[negatives[t]] += eta
            totals[STEPS] += 1.0
            totals[SUM_ETA] += eta
            if code in (PAIR_UPDATE, TRIPLET_UPDATE, SHRUNK_UPDATE, SGD_UPDATE):
                totals[UPDATES] += 1.0
            if mu > 0.0 and eta * (fro2[t] + 8.0 * mu * lam) <= 8.0 * mu:
                totals[CAPPED] += 1.0
        totals[MASS_MAX] = max(totals[MASS_MAX], masses[slot])
        totals[MASS_SUM] += masses[slot]
        totals[FOLDED] += 1.0
        masses[slot] = eta  # the anchor, now the class's buffer entry


class StabilityTracker:
    """The step masses of a learner's stream (see the module docstring).

    ``eta_triplet`` / ``eta_pair`` are the nominal steps of triplet and pair steps, ``rule``
    a code of :data:`service.core.gradient.STEP_RULES`, ``mu`` the smoothing of ``sgd`` /
    ``sgd_psd`` (``None`` for the others), ``convex`` whether the learner is M-SGD.

    >>> tracker = StabilityTracker(eta_triplet=0.25, eta_pair=0.0, rule=0, mu=None, lam=0.0)
    >>> X = np.eye(3)
    >>> tracker.reserve(2)
    >>> codes = np.array([0, 0, 8])                 # new_class, new_class, sgd_update
    >>> slots, known, negatives = np.array([0, 1, 0]), np.array([0, 1, 2]), np.array([0, 0, 1])
    >>> tracker.observe(X, slots, known, negatives, codes, np.zeros(3), t0=0)
    >>> r = tracker.report(n_classes=2)
    >>> r.step_mass_max, r.n_samples, r.n_updates, r.gamma_hat
    (0.25, 3, 1, None)
    """

    def __init__(
        self,
        eta_triplet: float,
        eta_pair: float,
        rule: int,
        mu: float | None,
        lam: float,
        convex: bool = False,
    ) -> None:
        self.eta_triplet = eta_triplet
        self.eta_pair = eta_pair
        self.rule = rule
        self.mu = mu
        self.lam = lam
        self.convex = convex
        self._masses: Array = np.zeros(4)
        self._totals: Array = np.zeros(len(_TOTALS))

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` buffer rows (doubling, as the learner's buffer)."""
        if rows > len(self._masses):
            grown = np.zeros(max(rows, 2 * len(self._masses)))
            grown[: len(self._masses)] = self._masses
            self._masses = grown

    def observe(
        self,
        X: Array,
        slots: Any,
        known: Any,
        negatives: Any,
        codes: Any,
        fro2: Array,
        t0: int,
    ) -> None:
        """Account for a learned batch (the arguments the learning loop had, and its codes)."""
        account(
            X,
            slots,
            known,
            negatives,
            codes,
            fro2,
            t0,
            self.rule,
            self.eta_triplet,
            self.eta_pair,
            -1.0 if self.mu is None else self.mu,
            self.lam,
            self._masses,
            self._totals,
        )

    def report(self, n_classes: int) -> Stability:
        """The diagnostics now; ``n_classes`` buffer rows hold live samples."""
        live = self._masses[:n_classes]
        totals = self._totals
        n_samples = int(totals[FOLDED]) + n_classes
        steps = int(totals[STEPS])
        mass_max = float(max(totals[MASS_MAX], live.max(initial=0.0)))
        B = float(totals[NORM_MAX]) if n_samples else None
        lipschitz = 8.0 * B * B if B is not None and math.isfinite(8.0 * B * B) else None
        smooth = self.mu is not None and self.mu > 0.0
        smoothness = None
        if smooth and lipschitz is not None:
            smoothness = lipschitz * lipschitz / (4.0 * self.mu)  # type: ignore[operator]
        capped = int(totals[CAPPED])
        gamma_hat = None
        if self.convex and smooth and capped == steps and lipschitz is not None:
            gamma_hat = 2.0 * lipschitz * lipschitz * mass_max  # Lemma 2
        return Stability(
            n_samples=n_samples,
            n_steps=steps,
            n_updates=int(totals[UPDATES]),
            sum_eta=float(totals[SUM_ETA]),
            step_mass_max=mass_max,
            step_mass_mean=float((totals[MASS_SUM] + live.sum()) / n_samples)
            if n_samples
            else None,
            B=B if B is None or math.isfinite(B) else None,
            lipschitz=lipschitz,
            smoothness=smoothness if smoothness is None or math.isfinite(smoothness) else None,
            capped_fraction=capped / steps if smooth and steps else None,
            gamma_hat=gamma_hat if gamma_hat is None or math.isfinite(gamma_hat) else None,
        )

    def to_state(self, n_classes: int) -> dict[str, Any]:
        """JSON-safe state (floats round-trip exactly through JSON)."""
        return {
            "masses": self._masses[:n_classes].tolist(),
            **dict(zip(_TOTALS, self._totals.tolist(), strict=True)),
        }

    def restore(self, state: dict[str, Any], n_classes: int) -> None:
        """Inverse of :meth:`to_state` (ValueError if it does not match ``n_classes``)."""
        self.reserve(n_classes)
        masses = np.asarray(state["masses"], dtype=np.float64)
        if masses.shape != (n_classes,):
            raise ValueError("stability: masses and classes do not match")
        self._masses[:n_classes] = masses
        self._totals[:] = [float(state[name]) for name in _TOTALS]


def theorem1_bound(gamma: float, M: float, n_pos: int, n_neg: int, delta: float) -> float:
    """The stability paper's Theorem 1: ``|R_S - R| <= 6 gamma + e (8 M (1/sqrt(n-) +
    2/sqrt(n+ - 1)) sqrt(log(e/delta)) + 24 sqrt(2) gamma (ceil(log2(n- (n+ - 1)^2)) + 2)
    log(e/delta))`` for a ``gamma``-uniformly stable algorithm and a loss bounded by ``M``.

    A calculator, to show what the theory would give: with everything granted it is
    above 1 for a loss of range 1 at any realistic ``n``, i.e. vacuous.

    >>> round(theorem1_bound(gamma=0.06, M=1.0, n_pos=10**4, n_neg=10**4, delta=0.05), 1)
    930.7
    """
    if not 0.0 < delta < 1.0 / math.e:
        raise ValueError(f"delta: must be in (0, 1/e), got {delta!r}")
    if n_pos < 2 or n_neg < 1:
        raise ValueError(f"n_pos: need n_pos >= 2 and n_neg >= 1, got {n_pos} and {n_neg}")
    if not gamma >= 0.0:
        raise ValueError(f"gamma: must be >= 0, got {gamma!r}")
    if not M > 0.0:
        raise ValueError(f"M: must be > 0, got {M!r}")
    log_term = math.log(math.e / delta)
    pairs = math.ceil(math.log2(n_neg * (n_pos - 1) ** 2))
    inner = 8.0 * M * (1.0 / math.sqrt(n_neg) + 2.0 / math.sqrt(n_pos - 1)) * math.sqrt(log_term)
    inner += 24.0 * math.sqrt(2.0) * gamma * (pairs + 2) * log_term
    return 6.0 * gamma + math.e * inner
