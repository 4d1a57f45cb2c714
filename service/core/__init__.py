"""The OPML / COPML algorithm core: pure numpy (and scipy's BLAS), no web, Redis or asyncio.

Li, Gao, Wang, Zhou, Huo, Shi, "OPML: A One-Pass Closed-Form Solution for Online Metric
Learning", Pattern Recognition 75 (2018). Equation numbers in this package are the paper's.

* :class:`Learner` / :class:`LearnerConfig` -- the online learner the service runs.
* :class:`OPML` / :class:`COPML` -- scikit-learn / metric-learn style estimators.
* :class:`ThresholdCalibrator` -- online EER calibration of the verification threshold.
* :class:`Certificate` / :class:`NotEnoughHeldOut` -- risk certificates of the served metric
  (``Learner.certificate``; :mod:`service.core.certificates`, :mod:`service.core.holdout`).

``OPML`` and ``COPML`` are imported on first use: they pull in scikit-learn (when installed),
which the service and the command line need not pay for at start-up.
"""

from typing import TYPE_CHECKING, Any

from service.core.calibration import Calibration, ThresholdCalibrator
from service.core.certificates import Certificate, NotEnoughHeldOut
from service.core.learner import OUTCOMES, Learner, LearnerConfig, normalize_rows, warm_up
from service.core.update import StepResult, StepResults

__all__ = [
    "COPML",
    "OPML",
    "OUTCOMES",
    "Calibration",
    "Certificate",
    "Learner",
    "LearnerConfig",
    "NotEnoughHeldOut",
    "StepResult",
    "StepResults",
    "ThresholdCalibrator",
    "normalize_rows",
    "warm_up",
]


if TYPE_CHECKING:
    from service.core.estimators import COPML, OPML


def __getattr__(name: str) -> Any:
    if name in ("OPML", "COPML"):
        from service.core import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'service.core' has no attribute {name!r}")
