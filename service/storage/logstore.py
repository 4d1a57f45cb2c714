"""The log aggregate: a model's log (a stream of sample groups and metric replacements), its
seq counters and confirmed watermark (in the meta), and its checkpoint (with the buffer H), which
trims the log behind it.

Writes that must be atomic are Lua scripts (``append.lua``, ``append_metric.lua``,
``checkpoint.lua``); every script first checks that the model still exists, so a write racing
a DELETE never resurrects keys. The reads are scripts too (``read_tail.lua``,
``read_checkpoint.lua``): atomic on a single server and in a cluster alike, in one round trip.

Replicas (``OPML_REDIS_WAIT_REPLICAS`` = n > 0, see :mod:`service.storage.client`). Each
confirmed append raises the model's ``confirmed`` watermark (a log id in the meta) and the
writers read the log only up to it: an entry that is in the master alone is never applied, so a
failover that loses it cannot leave a learner ahead of the surviving log. An append refused for
lack of replicas (or whose confirmation failed) stays in the master's log unapplied until a later
confirmed append (its retry with the same idempotency key, or any other) covers it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, cast

from service.storage.client import Connection
from service.storage.codec import StreamId, encode_labels, format_id, parse_id
from service.storage.errors import Fenced, NoSuchModel, Overtaken, TooManyClasses, guarded
from service.storage.keys import ModelKeys, wake_channel


class Appended(NamedTuple):
    """Outcome of an append: the seqs, and whether it replayed an earlier answer. (A named
    tuple: one is made per group of every append, and a frozen dataclass costs twice as much to
    make.)"""

    first_seq: int
    last_seq: int
    replayed: bool = False
    fingerprint: str = ""
    #: Metric replacements (PUT metric) logged before this entry (-1: not known); with
    #: ``first_seq`` it says which entry precedes this one in the log.
    puts: int = -1


@dataclass(frozen=True)
class Group:
    """One request's / frame's samples for an append, logged as one entry: ``x``, the raw
    bytes of its (n, d) block (:func:`~service.storage.codec.encode_vector`); ``keys``, its n
    class keys; its idempotency field ('' = none), the fingerprint of its samples and their
    ``holdout`` flags."""

    x: bytes | memoryview
    keys: list[str]
    idempotency_field: str
    fingerprint: str
    #: The ``holdout`` flags (:func:`~service.storage.codec.encode_flags`; b"" = none set).
    holdout: bytes = b""

    def __len__(self) -> int:
        return len(self.keys)

    @cached_property
    def labels(self) -> bytes:
        """The keys as the log entry's ``y`` (:func:`~service.storage.codec.encode_labels`),
        encoded once for the append script and :meth:`entry_fields`."""
        return encode_labels(self.keys)

    def entry_fields(self) -> dict[bytes, bytes]:
        """The fields of the log entry the append script (``append.lua``'s XADD) makes of this
        group, as a read of the log returns them (the writer applies an append of its own
        process from these, :meth:`service.engine.writer.Writer.offer`)."""
        # ``x`` may be a view of a frame's immutable bytes (codec.block_bytes), which decodes as
        # bytes do (np.frombuffer): not copied for the type's sake.
        x = cast(bytes, self.x)
        fields = {b"n": b"%d" % len(self.keys), b"x": x, b"y": self.labels}
        if self.holdout:
            fields[b"h"] = self.holdout
        return fields


@dataclass(frozen=True)
class Tail:
    """One consistent read of a model's log tail and of where its latest checkpoint stands."""

    entries: list[tuple[StreamId, dict[bytes, bytes]]]
    checkpoint_applied: StreamId | None
    checkpoint_time: float | None


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """A hash or stream entry as a script returns it (field, value, field, value, ...).

    >>> _pairs([b"n", b"1", b"y", b"[]"])
    {b'n': b'1', b'y': b'[]'}
    """
    return dict(zip(flat[::2], flat[1::2], strict=True))


@guarded
class LogStore:
    """A model's log, seqs and checkpoint (every failure of Redis: Unavailable).

    >>> from service.storage.client import connect
    >>> LogStore(Connection(connect("redis://127.0.0.1:1/0", 1.0))).conn.cluster
    False
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def logged_seq(self, name: str) -> int:
        """The last seq the writers may apply: the last assigned one, or with replicas awaited
        the last confirmed one."""
        if self.conn.wait_replicas:
            raw = await self.conn.client.hget(ModelKeys(name).meta, "confirmed")
            return 0 if raw is None else parse_id(raw)[0]
        raw = await self.conn.client.hget(ModelKeys(name).meta, "seq")
        return int(raw) if raw is not None else 0

    async def progress(self, name: str) -> tuple[int, int]:
        """(last logged seq, the owner's last published applied seq) of a model."""
        seq, applied = await self.conn.client.hmget(ModelKeys(name).meta, ["seq", "applied"])
        return int(seq or 0), int(applied or 0)

    async def _confirmed(self, name: str, entry: StreamId) -> None:
        """Replicas have every log entry up to ``entry``: let the writers read that far."""
        await self.conn.run("confirm", [ModelKeys(name).meta], [*entry, wake_channel(name), name])

    async def append_groups(
        self,
        name: str,
        groups: list[Group],
        *,
        now_ms: int,
        ttl_ms: int,
        max_classes: int,
        max_records: int = 0,
        announce: bool = True,
        on_dropped: Callable[[int], object] | None = None,
    ) -> list[Appended | TooManyClasses]:
        """Append several groups in order in one script (:class:`NoSuchModel` if the model is
        gone); each group's outcome is its own: appended, replayed, or over the class limit.
        With replicas awaited, :class:`NotReplicated` fails them all (see the module
        docstring). ``announce``: publish the append on the model's channel (not needed when
        the caller is the process that learns the model: it wakes its own writer).
        ``ttl_ms`` and ``max_records`` (0: no cap) bound the model's idempotency records
        (``append.lua``); ``on_dropped`` is called with the number of records the cap removed, when
        it removed any."""
        keys = ModelKeys(name)
        # With replicas awaited the owner is woken by the confirmation instead (confirm.lua).
        channel = wake_channel(name) if announce and not self.conn.wait_replicas else ""
        args: list[Any] = [now_ms, ttl_ms, max_classes, len(groups), channel, name, max_records]
        for group in groups:
            if not group.keys:
                raise ValueError("groups: a group has at least one sample")
            sample_keys = group.keys
            distinct = sample_keys if len(sample_keys) == 1 else list(dict.fromkeys(sample_keys))
            args += [group.idempotency_field, group.fingerprint, len(group.keys), group.x,
                     group.labels, group.holdout, len(distinct),
                     *distinct]  # fmt: skip
        out = await self.conn.run_replicated(
            "append",
            [keys.meta, keys.log, keys.classes, keys.idempotency, keys.idempotency_expiry],
            args,
        )
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        results: list[Appended | TooManyClasses] = []
        puts, dropped = int(out[1]), int(out[2])
        if dropped and on_dropped is not None:
            on_dropped(dropped)
        for group, r in zip(groups, out[3:], strict=True):
            code = int(r[0])
            if code == 3:
                results.append(TooManyClasses(int(r[1])))
            elif code == 2:
                first, last, fp = r[1].decode().split(" ", 2)
                results.append(Appended(int(first), int(last), replayed=True, fingerprint=fp))
            else:
                results.append(
                    Appended(int(r[1]), int(r[2]), fingerprint=group.fingerprint, puts=puts)
                )
        if self.conn.wait_replicas:
            last = max((r.last_seq for r in results if isinstance(r, Appended)), default=0)
            if last:  # a replay's entries were logged before the WAIT's write: covered too
                await self._confirmed(name, (last, 1))
        return results

    async def append_metric(self, name: str, L: bytes) -> StreamId:
        keys = ModelKeys(name)
        channel = "" if self.conn.wait_replicas else wake_channel(name)
        out = await self.conn.run_replicated(
            "append_metric", [keys.meta, keys.log], [L, channel, name]
        )
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        entry = parse_id(out[1])
        if self.conn.wait_replicas:
            await self._confirmed(name, entry)
        return entry

    async def read_tail(
        self, name: str, after: str, count: int, *, applied: int, created_at: str
    ) -> Tail:
        """Up to ``count`` entries (one or more samples each) with ids >= ``after`` (with
        replicas awaited: up to the confirmed watermark), and the checkpoint's position, read
        atomically: if the checkpoint is past ``after`` the log before it is trimmed. Publishes
        the reader's ``applied`` seq too, unless the model is another incarnation than the
        reader's (its ``created_at`` stamp differs; see ``read_tail.lua``)."""
        keys = ModelKeys(name)
        entries, (ckpt_applied, at), confirmed = await self.conn.run(
            "read_tail",
            [keys.log, keys.checkpoint, keys.meta],
            [after, count, applied, created_at],
        )
        tail = [(parse_id(entry_id), _pairs(flat)) for entry_id, flat in entries]
        if self.conn.wait_replicas:  # only what replicas confirmed (see the module docstring)
            limit = (0, 0) if confirmed is None else parse_id(confirmed)
            tail = [(entry_id, fields) for entry_id, fields in tail if entry_id <= limit]
        return Tail(
            entries=tail,
            checkpoint_applied=None if ckpt_applied is None else parse_id(ckpt_applied),
            checkpoint_time=None if at is None else float(at),
        )

    async def write_checkpoint(
        self,
        name: str,
        ckpt: dict[str, bytes],
        buffer: dict[str, bytes],
        *,
        applied: StreamId,
        created_at: str,
        trim_min_id: str,
        fencing_token: int,
    ) -> bool:
        """Replace the checkpoint and H (:mod:`service.storage.checkpoint` fields), which cover
        the log up to ``applied``, and trim the log before ``trim_min_id``, atomically; False
        if the model is gone or is another incarnation (its ``created_at`` stamp differs: a
        new one counts its fencing tokens from 1 again). :class:`Fenced` if ``fencing_token``
        is not the latest granted; :class:`Overtaken` if the stored checkpoint covers a later
        position than ``applied`` (a newer owner's: the log it trimmed cannot be replayed onto
        this older state)."""
        keys = ModelKeys(name)
        args: list[Any] = [trim_min_id, fencing_token, format_id(applied), created_at, len(ckpt)]
        for pair in (*ckpt.items(), *buffer.items()):
            args += pair
        done = int(
            await self.conn.run(
                "checkpoint", [keys.meta, keys.checkpoint, keys.buffer, keys.log, keys.fence], args
            )
        )
        if done == -1:
            raise Fenced(name)
        if done == -2:
            raise Overtaken(name)
        return done == 1

    async def read_checkpoint(self, name: str) -> tuple[dict[str, bytes], dict[str, bytes]] | None:
        """The ``ckpt`` and ``buffer`` hash fields, read together (None: no checkpoint yet)."""
        keys = ModelKeys(name)
        ckpt, buffer = await self.conn.run("read_checkpoint", [keys.checkpoint, keys.buffer], [])
        if not ckpt:
            return None
        return (
            {k.decode(): v for k, v in _pairs(ckpt).items()},
            {k.decode(): v for k, v in _pairs(buffer).items()},
        )
