"""Every Redis key name of the service, in one place.

One model's keys share the hash tag ``{name}`` so a Lua script or MULTI touching them stays in
one Redis Cluster slot. The only key outside a model's slot is the registry set.

>>> ModelKeys("faces").log
'opml:{faces}:log'
>>> len(set(ModelKeys("faces").all()))
10
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "opml"

#: Set of model names (the registry). Not hash-tagged: it spans models.
REGISTRY = f"{PREFIX}:models"


@dataclass(frozen=True)
class ModelKeys:
    """The keys of one model."""

    name: str

    @property
    def _base(self) -> str:
        return f"{PREFIX}:{{{self.name}}}"

    @property
    def meta(self) -> str:
        """Hash: ``config`` (JSON), ``seq`` (last assigned seq), ``puts``, ``created_at``,
        ``gallery`` (count of changes to the gallery: enrols and deletes)."""
        return f"{self._base}:meta"

    @property
    def log(self) -> str:
        """Stream: the ingestion log. Sample seq ``s`` has entry id ``s-1``; see storage.codec."""
        return f"{self._base}:log"

    @property
    def classes(self) -> str:
        """Set: every class key ever logged (enforces the classes-per-model limit atomically)."""
        return f"{self._base}:classes"

    @property
    def idempotency(self) -> str:
        """Hash: ``h:<Idempotency-Key>`` / ``w:<frame id>`` -> ``first last fingerprint``."""
        return f"{self._base}:idem"

    @property
    def idempotency_expiry(self) -> str:
        """Sorted set: the same fields, scored by their expiry time (ms since the epoch)."""
        return f"{self._base}:idem-exp"

    @property
    def checkpoint(self) -> str:
        """Hash: ``meta`` (JSON, incl. the log position) and the learner arrays as bytes."""
        return f"{self._base}:ckpt"

    @property
    def buffer(self) -> str:
        """Hash: the per-class latest-sample buffer H (class -> vector bytes), with the ckpt."""
        return f"{self._base}:buffer"

    @property
    def lease(self) -> str:
        """String ``"<fencing token> <owner id>"`` with a TTL: who runs the model's writer."""
        return f"{self._base}:lease"

    @property
    def fence(self) -> str:
        """Integer: the latest fencing token granted (INCR); checkpoints with an older one fail."""
        return f"{self._base}:fence"

    @property
    def gallery(self) -> str:
        """Hash: the identification gallery, item key -> its id, label and vector (bytes laid
        out by :func:`~service.storage.codec.encode_gallery_item`)."""
        return f"{self._base}:gallery"

    def all(self) -> list[str]:
        """Every key of this model (DELETE removes exactly these)."""
        return [
            self.meta,
            self.log,
            self.classes,
            self.idempotency,
            self.idempotency_expiry,
            self.checkpoint,
            self.buffer,
            self.lease,
            self.fence,
            self.gallery,
        ]
