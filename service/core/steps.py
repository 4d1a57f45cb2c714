"""The step rules of OPML / COPML, their defaults, and where each hyperparameter is valid.

``step="scaled"`` (default) reads ``gamma``, ``gamma_pair`` and ``margin`` in units of the
running mean ``S`` of the squared norms of the stream's difference vectors; ``step="paper"``
in the input's own units, the paper's literal rule (derivation and invariance:
:mod:`service.core.update`). ``gamma="auto"`` races :data:`service.core.race.GRID`
(:mod:`service.core.race`). These are the ``step`` values of ``opml`` / ``copml``; the same field
takes the gradient learners' schedules for ``sgd``, ``sgd_psd`` and ``brm``
(:data:`service.core.config.STEP_VALUES`, :mod:`service.core.sgd`).

Ranges (refused outside, ``ValueError`` naming the argument; ``(low, high]``):

============================  ===================  =================  ==========================
hyperparameter                ``step="scaled"``    ``step="paper"``   why the bound
============================  ===================  =================  ==========================
``gamma``                     (0, 1] or "auto"     (0, 1e6]           below
``gamma_pair``                (0, 1]               (0, 1e6]           below
``margin``                    (0, 100]             (0, 1e12]          below
``dim``                       1 ... 32768          same               ``L`` is 8 d^2 bytes (8 GiB)
``seed``                      0 ... 2^128 - 1      same               PCG64's seed entropy
``calibration_window``        1 ... 1,000,000      same               16 bytes per pair
``auto_warmup``               10 ... 100,000       same               k x the CPU while racing
============================  ===================  =================  ==========================

The OPML step is defined for every ``gamma > 0`` only thanks to the shrink guard (Lemma 2 holds
for ``gamma < 1/4`` and ``||x|| <= 1``): past the bounds above the guard, not ``gamma``, sets
almost every step. In scaled units a triplet is shrunk when ``gamma ||b||^2 > 0.9 S``, so at
``gamma = 1`` any negative difference longer than the typical one is; ``gamma = 1`` already gave
5-NN errors over 50 % on the digits (0.2 is the largest grid value of ``"auto"``). The pair step
(Eq. 20) has no guard to hit, but ``gamma_pair = 1`` already divides ``L`` by about 2 along a
typical pair difference per step. ``margin`` in scaled units compares with the gap
``||L b||^2 - ||L a||^2`` of typical differences (about 1 at the start): at 100 every triplet
stays active until ``L`` has stretched by about 10. In the paper's units the bounds only keep
the arithmetic finite and refuse nonsense (``gamma = 1e300``): ``gamma = 1e6`` is a full step
(``gamma ||b||^2 ~ 1``) for inputs at a scale of 1e-3, ``margin = 1e12`` a margin for inputs at
a scale of 1e6; for data outside that, ``step="scaled"`` is the tool.

Defaults (``benchmarks/results/gamma_grid.md``, ``table2.md``, ``scales.md``): scaled
``gamma = 0.05``, ``gamma_pair = 0.1``, ``margin = 1``; paper ``gamma = 1e-3``,
``gamma_pair = 1e-2``, ``margin = 1`` (``gamma_grid.md``).
"""

from __future__ import annotations

from typing import Any, Literal

from service.core._validation import check_range

Step = Literal["scaled", "paper"]

STEPS: tuple[Step, ...] = ("scaled", "paper")
AUTO = "auto"

#: Default ``gamma`` and ``gamma_pair`` of each step rule.
DEFAULTS: dict[str, tuple[float, float]] = {"scaled": (0.05, 0.1), "paper": (1e-3, 1e-2)}
#: Upper bounds of ``gamma`` / ``gamma_pair`` and of ``margin`` (lower bound: > 0).
LIMITS: dict[str, tuple[float, float]] = {"scaled": (1.0, 100.0), "paper": (1e6, 1e12)}


def resolve(
    step: Any, gamma: Any, gamma_pair: Any, margin: Any
) -> tuple[Step, float | str, float, float]:
    """Validated ``(step, gamma, gamma_pair, margin)``; ``None`` means the rule's default.

    >>> resolve(None, None, None, 1.0)
    ('scaled', 0.05, 0.1, 1.0)
    >>> resolve("paper", None, 0.5, 2)
    ('paper', 0.001, 0.5, 2.0)
    >>> resolve("scaled", "auto", None, 1.0)[1]
    'auto'
    >>> resolve("paper", "auto", None, 1.0)
    Traceback (most recent call last):
    ...
    ValueError: gamma: 'auto' needs step='scaled' (the paper's units have no scale-free grid)
    """
    if step is None:
        step = "scaled"
    if step not in STEPS:
        raise ValueError(f"step: must be one of {', '.join(map(repr, STEPS))}, got {step!r}")
    rule: Step = step
    default_gamma, default_pair = DEFAULTS[rule]
    top, top_margin = LIMITS[rule]
    if isinstance(gamma, str):
        if gamma != AUTO:
            raise ValueError(f"gamma: a number or 'auto', got {gamma!r}")
        if rule != "scaled":
            raise ValueError(
                "gamma: 'auto' needs step='scaled' (the paper's units have no scale-free grid)"
            )
        chosen: float | str = AUTO
    else:
        chosen = default_gamma if gamma is None else check_range(gamma, "gamma", 0.0, top)
    pair = default_pair if gamma_pair is None else check_range(gamma_pair, "gamma_pair", 0.0, top)
    return rule, chosen, pair, check_range(margin, "margin", 0.0, top_margin)
