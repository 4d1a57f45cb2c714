"""Risk certificates: high-confidence upper bounds on the errors of a metric and threshold.

A verification user asks: "at this threshold, how often will it wrongly accept or wrongly
reject, and how sure are you?". A certificate answers with three bounds, each holding with a
stated confidence, for three 0-1 errors (docs/algorithms/certificates.md):

* ``triplet_error``: ``P[ ||L(x_a - x_p)||^2 >= ||L(x_a - x_n)||^2 ]`` (ties count as errors),
  anchor and positive of one class, the negative of another;
* ``false_accept``: ``P[ ||L(x - x')||^2 <= theta | y != y' ]`` (the service's ``same <=> d <=
  theta``);
* ``false_reject``: ``P[ ||L(x - x')||^2 > theta | y = y' ]``.

Two tools (docs/algorithms/certificates.md):

* **Held-out test-set bound** (``method="binomial"``, the default, or ``"kl"``): the frozen
  served ``L`` and ``theta`` are evaluated on disjoint tuples of samples the learner never saw
  (the held-out reservoir of :mod:`service.core.holdout`), and ``k`` errors in ``m`` tuples
  give Langford's bound ``Bin^{-1}(m, k, delta)`` (``"binomial"``, exact) or its Chernoff
  relaxation ``kl^{-1}(k/m, ln(1/delta)/m)`` (``"kl"``). This certifies exactly what is
  served.
* **PAC-Bayes-kl** (``method="pac-bayes"``): no samples held out; a prior centred at ``L``
  frozen after a prefix of the training stream, an isotropic Gaussian posterior around the
  current (Frobenius-normalised) ``L``, the exact Gibbs risk on post-prefix training samples.
  This certifies the *randomised* (Gibbs) metric, not the served one; the answer says so.

Choices where the spec leaves room (each stated in every answer):

* **Confidence split.** The three bounds hold *together* with probability ``>= 1 - delta``:
  each is computed at ``delta / 3`` (union bound; no independence needed). For PAC-Bayes each
  quantity's ``delta / 3`` is further split over the ``J`` values of the sigma grid. The Gibbs
  risk is computed exactly (no Monte-Carlo), so no second delta is spent. Validity is per
  request: a user who asks for certificates ``j = 1, 2, ...`` on one stream and wants them all
  valid at once should ask for ``delta_j = delta / (j (j + 1))``.
* **Tuples** (:func:`~service.core.certificates.tuples.build_tuples`) are formed from labels and
  a seeded generator only, never from features, and each sample is in at most one tuple, so
  conditional on the labels the tuple errors are independent (docs/algorithms/certificates.md). The
  samples are shuffled and dealt into a triplet pool (3/7), a positive-pair pool (2/7) and a
  negative-pair pool (2/7), which gives the three quantities about the same number of tuples.
  Positive pairs are two samples of one class. Negative pairs and triplets are formed in rounds
  (round-robin over classes): in each round every class that still has enough samples takes part
  once, and the classes of the round are put in a random cyclic order, each class being paired with
  the next one. So every class counts in proportion to its held-out samples, against a random other
  class of the round; the certified rates are averages over that class mix (and the answer says
  so).
* **Binomial inversion.** For independent errors with different means (class pairs differ) the
  exact binomial inversion is valid when the confidence per quantity is ``<= 0.1`` (Hoeffding
  1956, docs/algorithms/certificates.md), i.e. ``delta <= 0.3``; above it ask for ``method="kl"``,
  valid unconditionally.

* **PAC-Bayes details.** The Gibbs risk of a triplet is one 1-D quadrature of non-central
  chi-square functions (exact to ~1e-11;
  :data:`~service.core.certificates.pac_bayes.GIBBS_TOLERANCE` = 1e-9 is added), of a pair
  one non-central chi-square cdf. The served threshold and ``||L||_F`` depend on the training
  stream, so the false accept / reject rates are certified at the values of a threshold grid
  fixed in advance just above / below the normalised threshold, the grid in the union bound.

Use (the service maps the errors: ``NotEnoughHeldOut`` to 409, ``ValueError`` to 422)::

    certificate = learner.certificate(delta=0.05, method="binomial")  # or "kl", "pac-bayes"
    certificate.to_dict()   # {method, certifies, delta, validity, threshold, threshold_source,
                            #  samples, classes, window, version, statement, details,
                            #  triplet_error / false_accept / false_reject: {m, errors,
                            #  empirical, bound, delta[, sigma, kl_divergence]}}

or, on a snapshot (``L``, the reservoir's rows and class codes, the served threshold),
:func:`~service.core.certificates.held_out.certify_held_out` /
:func:`~service.core.certificates.pac_bayes.certify_pac_bayes`. The learner is not thread-safe:
take the certificate where the learner is updated, or on such a snapshot. Cost (2-core machine under
load, CPU time): held-out, 5000 samples, 0.04 s at d = 64 and 0.2 s at d = 1024 (one
``(4n/7) x d x d`` product); PAC-Bayes, a window of 5000, 0.4-0.8 s at d = 10 and 64 (the
quadrature; scales whose bound cannot win are skipped).

The argument is one chain (each bound's validity depends on how the tuples were built and
how delta was split); its links are the modules of this package:

* :mod:`~service.core.certificates.bounds`: the numerics (docs/algorithms/certificates.md),
  pure and vectorised: the kl and binomial inversions (the conservative end of their final
  bracket), Maurer's xi;
* :mod:`~service.core.certificates.tuples`: the disjoint tuples, from labels and a seeded
  generator, and when there are too few;
* :mod:`~service.core.certificates.held_out`: the held-out test-set bound of the served metric;
* :mod:`~service.core.certificates.pac_bayes`: the PAC-Bayes-kl bound of the Gibbs metric;
* this module: what is certified (:data:`QUANTITIES`), the arguments, and the answer
  (:class:`Certificate`, :class:`Bound`, :class:`NotEnoughHeldOut`, :class:`NoHoldout`).

The threshold a certificate certifies by default is the served one, whose rule lives beside
the calibration it comes from (:func:`service.core.calibration.served_threshold`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from service.core._validation import Array, as_float_array, check_matrix, check_metric

Method = Literal["binomial", "kl", "pac-bayes"]
METHODS: tuple[Method, ...] = ("binomial", "kl", "pac-bayes")

#: The three certified quantities, in the order of every answer.
QUANTITIES = ("triplet_error", "false_accept", "false_reject")

#: Largest per-quantity confidence parameter at which the exact binomial inversion is valid for
#: independent errors with different means (Hoeffding 1956; docs/algorithms/certificates.md).
BINOMIAL_MAX_DELTA = 0.1


def check_metric_and_samples(L: Any, X: Any, labels: Any) -> tuple[Array, Array, NDArray[np.int64]]:
    """A square finite ``L``, samples ``X`` with as many columns, one integer code per row."""
    arr = as_float_array(L, "L")
    if arr.ndim != 2:
        raise ValueError(f"L: expected a square matrix, got shape {arr.shape}")
    Lm = check_metric(arr, arr.shape[0], "L")
    Xs = check_matrix(X, Lm.shape[0], "X")
    codes = np.asarray(labels)
    if codes.shape != (len(Xs),) or codes.dtype.kind not in "iu":
        raise ValueError(f"labels: expected {len(Xs)} integer class codes, got {codes.shape}")
    return Lm, Xs, codes.astype(np.int64)


def check_certificate_args(delta: Any, method: Any) -> tuple[float, Method]:
    """``delta`` in (0, 1) (and ``<= 3 * 0.1`` for the exact binomial inversion) and a known
    ``method``; ValueError naming the argument otherwise.

    >>> check_certificate_args(0.05, "binomial")
    (0.05, 'binomial')
    >>> check_certificate_args(1.5, "binomial")
    Traceback (most recent call last):
    ...
    ValueError: delta: must be a number in (0, 1), got 1.5
    """
    if method not in METHODS:
        raise ValueError(f"method: must be one of {', '.join(METHODS)}; got {method!r}")
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"delta: must be a number in (0, 1), got {delta!r}") from None
    if isinstance(delta, bool) or not 0.0 < d < 1.0:
        raise ValueError(f"delta: must be a number in (0, 1), got {delta!r}")
    if method == "binomial" and d / len(QUANTITIES) > BINOMIAL_MAX_DELTA:
        raise ValueError(
            f"delta: the exact binomial inversion is valid for non-identical tuples up to "
            f"delta = {len(QUANTITIES) * BINOMIAL_MAX_DELTA:g} ({BINOMIAL_MAX_DELTA:g} per "
            f"quantity); got {delta!r}: use method='kl'"
        )
    return d, method


class NotEnoughHeldOut(Exception):
    """Too few samples to certify yet: ``needed`` more (an estimate at the current class mix)
    on top of the ``have`` there are. The service answers 409.

    >>> e = NotEnoughHeldOut(120, 30, "not enough held-out samples")
    >>> e.needed, e.have, str(e)
    (120, 30, 'not enough held-out samples')
    """

    def __init__(self, needed: int, have: int, message: str) -> None:
        super().__init__(message)
        self.needed = needed
        self.have = have


class NoHoldout(ValueError):
    """The model holds no samples out (``holdout = 0`` and none flagged), so the held-out
    tools have nothing to certify on; a ValueError like the other "not configured" refusals,
    its own type so that the service can say how its users fix it.

    >>> isinstance(NoHoldout("holdout: none"), ValueError)
    True
    """


# -- the answer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """One certified quantity: ``errors`` among ``m`` tuples, the ``empirical`` rate, and the
    ``bound`` that the true rate stays below with probability >= ``1 - delta``.

    PAC-Bayes adds the posterior scale ``sigma`` chosen on the grid and ``kl_divergence``
    ``KL(Q || P)``; there ``errors`` is the sum of exact Gibbs error probabilities.

    >>> Bound(m=100, errors=0, empirical=0.0, bound=0.0295, delta=0.05).to_dict()["bound"]
    0.0295
    """

    m: int
    errors: float
    empirical: float
    bound: float
    delta: float
    sigma: float | None = None
    kl_divergence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.sigma is None:
            del out["sigma"], out["kl_divergence"]
        return out


@dataclass(frozen=True)
class Certificate:
    """A certificate: three bounds that hold together with probability >= ``1 - delta``.

    ``certifies`` is ``"served"`` (the deterministic ``L`` and ``threshold`` that queries use)
    or ``"gibbs"`` (PAC-Bayes: the randomised metric around ``L``). ``samples`` / ``classes``
    describe the samples the tuples came from (the reservoir, or the PAC-Bayes bound window)
    and ``window`` its capacity. ``validity`` is ``"per-request"``: see the module docstring
    for certificates that must hold all at once. ``statement`` says it in a sentence.

    >>> from service.core import Learner, LearnerConfig
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 1500)
    >>> X = 3.0 * np.eye(4)[y] + rng.normal(size=(1500, 4))
    >>> learner = Learner(LearnerConfig(dim=4, holdout=0.5))
    >>> _ = learner.learn_many(X, y)
    >>> c = learner.certificate(delta=0.05)
    >>> c.method, c.certifies, c.threshold_source, c.false_accept.delta == 0.05 / 3
    ('binomial', 'served', 'calibrated', True)
    >>> c.false_accept.empirical <= c.false_accept.bound <= 1.0
    True
    >>> sorted(c.to_dict())[:4] == ["certifies", "classes", "delta", "details"]
    True
    """

    method: Method
    certifies: Literal["served", "gibbs"]
    delta: float
    triplet_error: Bound
    false_accept: Bound
    false_reject: Bound
    threshold: float
    threshold_source: str
    samples: int
    classes: int
    window: int
    version: int | None
    statement: str
    validity: str = "per-request"
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: plain numbers, strings and dicts."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in QUANTITIES:
            out[name] = getattr(self, name).to_dict()
        return out


def _bound_text(name: str, b: Bound) -> str:
    return f"{name} <= {b.bound:.4g} ({b.errors:.6g} errors in {b.m})"


def summary(bounds: dict[str, Bound]) -> str:
    """The three bounds in a sentence's words."""
    return "; ".join(
        _bound_text(text, bounds[name])
        for name, text in zip(
            QUANTITIES, ("triplet error", "false accept rate", "false reject rate"), strict=True
        )
    )


CLASS_MIX = (
    "the rates are averages over the class mix of the tuples: every class in proportion to "
    "its samples there, paired with a random other class"
)
