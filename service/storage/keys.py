"""Every Redis key name of the service, in one place.

One model's keys share the hash tag ``{name}`` so a Lua script or MULTI touching them stays in
one Redis Cluster slot. Outside the models' slots: the model index and the members hash (each
a key of its own, touched alone), and each model's wake channel (pub/sub).

>>> ModelKeys("faces").log
'opml:{faces}:log'
>>> len(set(ModelKeys("faces").all()))
10
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "opml"

#: Set of model names (the model index). Not hash-tagged: it spans models.
MODEL_INDEX = f"{PREFIX}:models"
#: Hash of the live service processes: member id -> ``"<expiry ms> <info JSON>"`` (heartbeats).
MEMBERS = f"{PREFIX}:members"
#: Prefix of the models' wake channels (:func:`wake_channel`).
WAKE = f"{PREFIX}:wake"


def wake_channel(name: str) -> str:
    """The wake channel of model ``name``: the name is published on it when the model's owner
    must act at once, after each append made through another process (by the append script)
    and when a process releases the model (the one that should own it takes it). One channel
    per model: only the process that learns it (or should) subscribes, so an append costs one
    notification in the whole deployment, not one per process.

    >>> wake_channel("faces")
    'opml:wake:faces'
    """
    return f"{WAKE}:{name}"


def name_of_channel(channel: bytes) -> str:
    """The model name of a channel made by :func:`wake_channel`.

    >>> name_of_channel(b"opml:wake:faces")
    'faces'
    """
    text = channel.decode()
    head = f"{WAKE}:"
    if not text.startswith(head):
        raise ValueError(f"channel: {text!r} is not a model's wake channel")
    return text[len(head) :]


#: SCAN pattern of every model's meta hash (``{`` and ``}`` are literal in Redis patterns).
META_PATTERN = f"{PREFIX}:{{*}}:meta"


def name_of_meta(key: bytes) -> str:
    """The model name of a meta key found by :data:`META_PATTERN`.

    >>> name_of_meta(b"opml:{faces}:meta")
    'faces'
    """
    text = key.decode()
    head, tail = f"{PREFIX}:{{", "}:meta"
    if not (text.startswith(head) and text.endswith(tail)):
        raise ValueError(f"key: {text!r} is not a model's meta key")
    return text[len(head) : -len(tail)]


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
        ``applied`` (the owner's last applied seq, published per batch), ``gallery`` (count
        of changes to the gallery: enrols and deletes), and with ``OPML_REDIS_WAIT_REPLICAS``
        > 0 ``confirmed`` (the log id up to which appends are confirmed by replicas). The
        model exists if and only if this key does."""
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
