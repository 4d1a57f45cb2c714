"""The one read model of a model's status: what the model document, ``/events`` frames and the
Prometheus collector show, produced by the engine (:meth:`ModelRuntime.status
<service.engine.runtime.ModelRuntime.status>`) from one snapshot, so the three never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core import LearnerConfig
from service.core.certificates import Certificate
from service.core.operating_points import OperatingPoint
from service.engine.snapshot import Snapshot


@dataclass(frozen=True)
class ModelStatus:
    """A model's hyperparameters and live state, as of one snapshot.

    ``logged_seq`` is the last seq known to be in the log (never below ``snapshot.version``);
    ``checkpoint_seq`` / ``checkpoint_at`` describe the latest known checkpoint (``at`` in epoch
    seconds, None before the first); ``owner`` and ``fencing_token`` say whether this process
    holds the model's lease; ``staleness_s`` is how long ago this process last read up to the
    end of the log (None: not yet); ``certificate`` is the latest periodic certificate
    (``OPML_CERTIFICATE_EVERY``; None: off, or not enough held-out samples yet);
    ``operating_point`` the latest certified point of the model's ``operating_point`` config
    (None: ``"eer"``, not evaluated yet, or not certifiable: then ``certifiable`` is False).
    """

    name: str
    config: LearnerConfig
    created_at: float
    snapshot: Snapshot
    logged_seq: int
    checkpoint_seq: int
    checkpoint_at: float | None
    owner: bool
    fencing_token: int | None
    staleness_s: float | None
    certificate: Certificate | None = None
    operating_point: OperatingPoint | None = None
    certifiable: bool | None = None

    @property
    def version(self) -> int:
        return self.snapshot.version

    @property
    def lag(self) -> int:
        """Samples acknowledged but not yet applied."""
        return self.logged_seq - self.snapshot.version
