"""The online metric learning core: pure numpy (and scipy's BLAS), no web, Redis or asyncio.

Li, Gao, Wang, Zhou, Huo, Shi, "OPML: A One-Pass Closed-Form Solution for Online Metric
Learning", Pattern Recognition 75 (2018). Equation numbers in this package are the paper's
unless a module says otherwise; the gradient learners and BRM cite theirs
(docs/algorithms/gradient.md, docs/algorithms/brm.md).

* :class:`Learner` / :class:`LearnerConfig` -- the online learner the service runs
  (``algorithm``: ``opml``, ``copml``, ``sgd``, ``sgd_psd``, ``brm``; :mod:`service.core.learner`,
  :mod:`service.core.config`; its state format :mod:`service.core.state`).
* :class:`MetricView` -- the read-only queries of one metric ``L``, what a snapshot holds
  (:mod:`service.core.view`).
* :class:`OPML`, :class:`COPML`, :class:`SGD`, :class:`SGDPSD`, :class:`BRM`,
  :class:`OnlineLDA` -- scikit-learn / metric-learn style estimators.
* :class:`ThresholdCalibrator` -- online EER calibration of the verification threshold.
* :class:`Certificate` / :class:`NotEnoughHeldOut` -- risk certificates of the served metric
  (``Learner.certificate``; :mod:`service.core.certificates`, :mod:`service.core.holdout`).
* :class:`Stability` -- step-mass diagnostics (:mod:`service.core.stability`), not a bound.

The estimators are imported on first use: they pull in scikit-learn (when installed), which
the service and the command line need not pay for at start-up.
"""

from typing import TYPE_CHECKING, Any

from service.core.calibration import Calibration, ThresholdCalibrator
from service.core.certificates import Certificate, NotEnoughHeldOut
from service.core.config import LearnerConfig
from service.core.learner import Learner, warm_up
from service.core.normalize import normalize_rows
from service.core.stability import Stability
from service.core.update import OUTCOMES, StepResult, StepResults
from service.core.view import MetricView

__all__ = [
    "BRM",
    "COPML",
    "OPML",
    "OUTCOMES",
    "SGD",
    "SGDPSD",
    "Calibration",
    "Certificate",
    "Learner",
    "LearnerConfig",
    "MetricView",
    "NotEnoughHeldOut",
    "OnlineLDA",
    "Stability",
    "StepResult",
    "StepResults",
    "ThresholdCalibrator",
    "normalize_rows",
    "warm_up",
]

_ESTIMATORS = ("OPML", "COPML", "SGD", "SGDPSD", "BRM", "OnlineLDA")

if TYPE_CHECKING:
    from service.core.estimators import BRM, COPML, OPML, SGD, SGDPSD, OnlineLDA


def __getattr__(name: str) -> Any:
    if name in _ESTIMATORS:
        from service.core import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'service.core' has no attribute {name!r}")
