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

from typing import TYPE_CHECKING, Any

from clients.types import Array, Model

if TYPE_CHECKING:
    from service.core import BRM, COPML, OPML, SGD, SGDPSD, OnlineLDA

    Estimator = OPML | COPML | SGD | SGDPSD | BRM | OnlineLDA


def estimator_for(model: Model, L: Array) -> Estimator:
    """The estimator of ``model``'s algorithm (:class:`~service.core.OPML`,
    :class:`~service.core.COPML`, :class:`~service.core.SGD`, :class:`~service.core.SGDPSD`,
    :class:`~service.core.BRM`) with its hyperparameters, whose learner holds ``L``.

    Queries (``transform``, ``pair_distance``, ``get_mahalanobis_matrix``) answer exactly as the
    service did at that ``L``. The per-class buffer stays on the service, so a later
    ``partial_fit`` continues from ``L`` as a warm start, not from the service's stream.
    """
    # The core (numba, scipy: ~1 s to import) and scikit-learn load only when asked for, so
    # `import clients` and the `opml` command stay quick.
    try:
        from service.core import BRM, COPML, OPML, SGD, SGDPSD, Learner, LearnerConfig, OnlineLDA
    except ModuleNotFoundError as exc:  # the SDK installs alone; the core comes with the server
        raise ModuleNotFoundError(
            f"to_sklearn needs the algorithm core, which comes with opml-service ({exc}); "
            "install the server's distribution next to the client"
        ) from exc

    classes = {
        "opml": OPML,
        "copml": COPML,
        "sgd": SGD,
        "sgd_psd": SGDPSD,
        "brm": BRM,
        "lda": OnlineLDA,
    }
    if model.algorithm not in classes:
        raise ValueError(f"model: no estimator for algorithm {model.algorithm!r}")
    cls: type[Estimator] = classes[model.algorithm]
    names = [n for n in cls._get_param_names() if n != "random_state"]
    params: dict[str, Any] = {n: getattr(model, n, None) for n in names}
    if model.algorithm in ("opml", "copml"):
        # gamma "auto": the step the service's race serves (a service whose race ended
        # reports it as the winner; before the first sample, race again)
        race = model.race or {}
        params["gamma"] = race.get("winner") or race.get("serving") or model.gamma
        params["auto_warmup"] = int(model.raw.get("auto_warmup") or 1000)
        params["rehearsal"] = int(model.raw.get("rehearsal") or 0)
        params["rehearsal_memory"] = int(model.raw.get("rehearsal_memory") or 1000)
    if model.algorithm == "lda":
        params["refresh"] = int(model.raw.get("refresh") or 1000)
        params["shrinkage"] = float(model.raw.get("shrinkage") or 0.0)
    # a precondition ("whiten", "discriminant"): the estimator holds the served L W as its L
    # (queries answer the same); a later partial_fit continues it without the preconditioner.
    estimator = cls(**params, random_state=model.seed)
    config = LearnerConfig(
        dim=model.dim,
        algorithm=model.algorithm,  # type: ignore[arg-type]
        seed=model.seed,
        **params,
    )
    learner = Learner(config)
    learner.set_metric(L)
    estimator.learner_ = learner
    estimator.n_features_in_ = model.dim
    return estimator
