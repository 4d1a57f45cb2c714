"""A model of the service as a fitted :mod:`service.core` estimator, for offline use.

>>> import numpy as np
>>> from clients.types import Model, VerificationState
>>> model = Model("faces", 2, "opml", 0.01, 0.01, 1.0, "none", 7, 5, 5, 2, {},
...               VerificationState(None, False))
>>> est = estimator_for(model, np.diag([2.0, 1.0]))
>>> type(est).__name__, est.transform([[1.0, 1.0]]).tolist()
('OPML', [[2.0, 1.0]])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from clients.types import Array, Model

if TYPE_CHECKING:
    from service.core import COPML, OPML


def estimator_for(model: Model, L: Array) -> OPML | COPML:
    """An :class:`~service.core.OPML` / :class:`~service.core.COPML` with ``model``'s
    hyperparameters whose learner holds ``L``.

    Queries (``transform``, ``pair_distance``, ``get_mahalanobis_matrix``) answer exactly as the
    service did at that ``L``. The per-class buffer stays on the service, so a later
    ``partial_fit`` continues from ``L`` as a warm start, not from the service's stream.
    """
    # The core (numba, scipy: ~1 s to import) and scikit-learn load only when asked for, so
    # `import clients` and the `opml` command stay quick.
    from service.core import COPML, OPML, Learner, LearnerConfig

    estimator: OPML | COPML
    step: Literal["scaled", "paper"] = "paper" if model.step == "paper" else "scaled"
    # gamma "auto": the step the service's race kept (while it still races, race again)
    race = model.race or {}
    gamma = race.get("winner") or model.gamma
    warmup = int(model.raw.get("auto_warmup", 1000))
    hyper: dict[str, Any] = dict(
        gamma=gamma,
        margin=model.margin,
        normalize=model.normalize,
        step=step,
        auto_warmup=warmup,
        random_state=model.seed,
    )
    if model.algorithm == "opml":
        estimator = OPML(**hyper)
    else:
        estimator = COPML(gamma_pair=model.gamma_pair, **hyper)
    config = LearnerConfig(
        dim=model.dim,
        algorithm="opml" if model.algorithm == "opml" else "copml",
        step=step,
        gamma=gamma,
        gamma_pair=model.gamma_pair,
        margin=model.margin,
        normalize="l2" if model.normalize == "l2" else "none",
        seed=model.seed,
        auto_warmup=warmup,
    )
    learner = Learner(config)
    learner.set_metric(L)
    estimator.learner_ = learner
    estimator.n_features_in_ = model.dim
    return estimator
