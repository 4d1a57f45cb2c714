"""All Redis reads and writes of the service (key names from :mod:`service.storage.keys`).

Writes that must be atomic are Lua scripts (run with EVALSHA; redis-py reloads them after a
server restart): appending a request's samples together with its seqs and its idempotency
record; appending a metric replacement; writing a checkpoint together with the buffer H and
trimming the log behind it; taking, renewing and releasing a model's writer lease. Every script
first checks that the model still exists, so a write racing a DELETE never resurrects keys.

Fencing: a lease grant takes a new token from ``INCR <fence>``; the checkpoint script refuses a
write whose token is not the latest granted, inside Redis, so a process that was paused past its
lease (GC, SIGSTOP, a VM migration) and resumes can never overwrite a newer owner's checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.storage.codec import StreamId, encode_labels, parse_id
from service.storage.keys import REGISTRY, ModelKeys

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1], 'seq', 0, 'puts', 0, 'created_at', ARGV[2])
return 1
"""

# Purge up to 64 expired idempotency records (``now``: the time in ms); shared by the scripts
# that write records.
_PURGE = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[{expiry}], '-inf', now, 'LIMIT', 0, 64)
if #expired > 0 then
  redis.call('HDEL', KEYS[{idem}], unpack(expired))
  redis.call('ZREM', KEYS[{expiry}], unpack(expired))
end
"""

# KEYS: meta, log, classes, idem, idem-exp
# ARGV: now_ms, ttl_ms, max_classes, groups, then per group: idem field ('' = none), fingerprint,
#       n, x block, labels (JSON array), k, then its k distinct labels. Groups are appended in
#       order, each exactly as if alone (a group commit: one script, one AOF write and fsync for
#       requests/frames that arrived together), each as ONE log entry ``<last seq>-1`` holding
#       its n samples (see service.storage.codec).
# -> {0} no model | {1, r1, r2, ...}, per group r = {1, first, last} | {2, "first last fingerprint"}
#    replay | {3, classes} would exceed the class limit (that group alone: nothing of it logged)
_APPEND = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
"""
    + _PURGE.format(idem=4, expiry=5)
    + """
local ttl = tonumber(ARGV[2])
local max_classes = tonumber(ARGV[3])
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local out = {1}
local p = 5
for g = 1, tonumber(ARGV[4]) do
  local field, fp, n = ARGV[p], ARGV[p + 1], tonumber(ARGV[p + 2])
  local x, y, k = ARGV[p + 3], ARGV[p + 4], tonumber(ARGV[p + 5])
  local base = p + 5  -- distinct label i = ARGV[base + i]
  p = base + k + 1
  local prev = false
  if field ~= '' then prev = redis.call('HGET', KEYS[4], field) end
  if prev then
    out[#out + 1] = {2, prev}
  else
    local fresh = {}
    for i = 1, k do
      if redis.call('SISMEMBER', KEYS[3], ARGV[base + i]) == 0 then
        fresh[#fresh + 1] = ARGV[base + i]
      end
    end
    local have = 0
    if #fresh > 0 then have = redis.call('SCARD', KEYS[3]) end
    if #fresh > 0 and have + #fresh > max_classes then
      out[#out + 1] = {3, have}
    else
      local first = seq + 1
      seq = seq + n
      redis.call('XADD', KEYS[2], string.format('%d-1', seq), 'n', n, 'x', x, 'y', y)
      for i = 1, #fresh do redis.call('SADD', KEYS[3], fresh[i]) end
      if field ~= '' then
        redis.call('HSET', KEYS[4], field, string.format('%d %d %s', first, seq, fp))
        redis.call('ZADD', KEYS[5], now + ttl, field)
      end
      out[#out + 1] = {1, first, seq}
    end
  end
end
redis.call('HSET', KEYS[1], 'seq', seq)
return out
"""
)

# KEYS: meta, gallery, idem, idem-exp
# ARGV: now_ms, ttl_ms, max_items, idem field ('' = none), fingerprint, then item key / value
#       pairs (distinct keys; a key already enrolled is replaced)
# -> {0} no model | {1, changes, added, size} | {2, "fingerprint added size"} replay |
#    {3, size} the gallery would exceed max_items (nothing written)
_ENROL = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
"""
    + _PURGE.format(idem=3, expiry=4)
    + """
local field = ARGV[4]
if field ~= '' then
  local prev = redis.call('HGET', KEYS[3], field)
  if prev then return {2, prev} end
end
local added = 0
for i = 6, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then added = added + 1 end
end
local size = redis.call('HLEN', KEYS[2])
if size + added > tonumber(ARGV[3]) then return {3, size} end
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
local changes = redis.call('HINCRBY', KEYS[1], 'gallery', 1)
size = size + added
if field ~= '' then
  redis.call('HSET', KEYS[3], field, string.format('%s %d %d', ARGV[5], added, size))
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), field)
end
return {1, changes, added, size}
"""
)

# KEYS: meta, gallery; ARGV: item key -> {0} no model | {1, changes} | {2} no such item
_DELETE_ITEM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return {2} end
return {1, redis.call('HINCRBY', KEYS[1], 'gallery', 1)}
"""

# KEYS: meta, log; ARGV: L bytes -> {0} | {1, entry id}
_APPEND_METRIC = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local puts = redis.call('HINCRBY', KEYS[1], 'puts', 1)
local id = string.format('%d-%d', seq, puts + 1)
redis.call('XADD', KEYS[2], id, 'L', ARGV[1])
return {1, id}
"""

# KEYS: meta, ckpt, buffer, log, fence
# ARGV: trim min id, fencing token, n, then n ckpt field/value pairs, then buffer class/vector
#       pairs (the fields: service.storage.checkpoint)
# -> 1 written | 0 no model | -1 fenced (a newer token was granted: this writer lost its lease)
_CHECKPOINT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('GET', KEYS[5]) ~= ARGV[2] then return -1 end
local n = tonumber(ARGV[3])
redis.call('DEL', KEYS[2])
for i = 4, 3 + 2 * n, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('DEL', KEYS[3])
for i = 4 + 2 * n, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('XTRIM', KEYS[4], 'MINID', ARGV[1])
return 1
"""

# KEYS: lease, fence, meta; ARGV: owner id, ttl ms, created_at, held token ('' = none)
# -> {0} no such model (or another incarnation) | {1, token} held by us | {2, token} by another
_CLAIM = """
if redis.call('HGET', KEYS[3], 'created_at') ~= ARGV[3] then return {0} end
local cur = redis.call('GET', KEYS[1])
if cur then
  if ARGV[4] ~= '' and cur == ARGV[4] .. ' ' .. ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(ARGV[4])}
  end
  return {2, tonumber(string.match(cur, '^(%d+)'))}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {1, token}
"""

# KEYS: lease; ARGV: "<token> <owner id>" -> 1 released | 0 not ours
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Appended:
    """Outcome of an append: the seqs, and whether it replayed an earlier answer."""

    first_seq: int
    last_seq: int
    replayed: bool = False
    fingerprint: str = ""


@dataclass(frozen=True)
class Group:
    """One request's / frame's samples for an append, logged as one entry: ``x``, the raw
    bytes of its (n, d) block (:func:`~service.storage.codec.encode_vector`); ``keys``, its n
    class keys; its idempotency field ('' = none) and the fingerprint of its samples."""

    x: bytes
    keys: list[str]
    idempotency_field: str
    fingerprint: str

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Tail:
    """One consistent read of a model's log tail and of where its latest checkpoint stands."""

    entries: list[tuple[StreamId, dict[bytes, bytes]]]
    checkpoint_applied: StreamId | None
    checkpoint_time: float | None


@dataclass(frozen=True)
class Enrolled:
    """Outcome of an enrol: ``added`` of its items were new (the others replaced items with
    the same key), the gallery then held ``size`` items, and it was the ``changes``-th change
    of the gallery (0 for a replay, which changed nothing)."""

    added: int
    size: int
    changes: int
    replayed: bool = False
    fingerprint: str = ""


class GalleryFull(Exception):
    """Enrolling would exceed the gallery's size limit; it holds ``size`` items."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class NoSuchItem(Exception):
    """No gallery item has that key."""


class Fenced(Exception):
    """A checkpoint was refused: a newer fencing token was granted to another writer."""


class NoSuchModel(Exception):
    """The model's keys are gone (deleted)."""


class TooManyClasses(Exception):
    """Appending would exceed the classes-per-model limit; ``have`` classes exist."""

    def __init__(self, have: int) -> None:
        super().__init__(have)
        self.have = have


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs).

    >>> redacted_url("redis://:pw@localhost:6379/0")
    'redis://:***@localhost:6379/0'
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def connect(url: str, timeout_s: float) -> Redis:
    """A client whose every call is bounded by ``timeout_s``; one quick retry (stale socket).

    Credentials and TLS come with the URL: ``redis://user:password@host:6379/0``, or
    ``rediss://...`` for TLS (query options such as ``ssl_cert_reqs``, ``ssl_ca_certs``).
    """
    client: Redis = Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=10,
    )
    return client


class Store:
    """The service's view of Redis (bytes in, bytes out)."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._create = client.register_script(_CREATE)
        self._append = client.register_script(_APPEND)
        self._append_metric = client.register_script(_APPEND_METRIC)
        self._enrol = client.register_script(_ENROL)
        self._delete_item = client.register_script(_DELETE_ITEM)
        self._checkpoint = client.register_script(_CHECKPOINT)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)

    async def ping(self) -> None:
        await self.client.ping()

    async def server_version(self) -> tuple[int, ...]:
        info = await self.client.info("server")
        return tuple(int(p) for p in str(info["redis_version"]).split(".")[:3])

    # -- models ----------------------------------------------------------------------------

    async def create_model(self, name: str, config: dict[str, Any], created_at: float) -> bool:
        """Create the model's meta hash; False if it exists."""
        await self.client.sadd(REGISTRY, name)
        keys = ModelKeys(name)
        done = await self._create(keys=[keys.meta], args=[json.dumps(config), repr(created_at)])
        return bool(done)

    async def model_names(self) -> list[str]:
        names = cast(set[bytes], await self.client.smembers(REGISTRY))
        return sorted(n.decode() for n in names)

    async def model_meta(self, name: str) -> dict[str, str] | None:
        raw = cast(dict[bytes, bytes], await self.client.hgetall(ModelKeys(name).meta))
        return {k.decode(): v.decode() for k, v in raw.items()} if raw else None

    async def created_stamps(self, names: list[str]) -> dict[str, str | None]:
        """Each model's ``created_at`` as stored (None: gone); tells incarnations apart."""
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hget(ModelKeys(name).meta, "created_at")
            stamps = await pipe.execute()
        return {n: None if s is None else s.decode() for n, s in zip(names, stamps, strict=True)}

    async def delete_model(self, name: str) -> None:
        """Remove every key of the model, then its registry entry."""
        await self.client.delete(*ModelKeys(name).all())
        await self.client.srem(REGISTRY, name)

    async def logged_seq(self, name: str) -> int:
        raw = await self.client.hget(ModelKeys(name).meta, "seq")
        return int(raw) if raw is not None else 0

    # -- the log -----------------------------------------------------------------------------

    async def append_groups(
        self, name: str, groups: list[Group], *, now_ms: int, ttl_ms: int, max_classes: int
    ) -> list[Appended | TooManyClasses]:
        """Append several groups in order in one script (:class:`NoSuchModel` if the model is
        gone); each group's outcome is its own: appended, replayed, or over the class limit."""
        keys = ModelKeys(name)
        args: list[Any] = [now_ms, ttl_ms, max_classes, len(groups)]
        for group in groups:
            if not group.keys:
                raise ValueError("groups: a group has at least one sample")
            distinct = list(dict.fromkeys(group.keys))
            args += [group.idempotency_field, group.fingerprint, len(group.keys), group.x,
                     encode_labels(group.keys), len(distinct), *distinct]  # fmt: skip
        out = await self._append(
            keys=[keys.meta, keys.log, keys.classes, keys.idempotency, keys.idempotency_expiry],
            args=args,
        )
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        results: list[Appended | TooManyClasses] = []
        for group, r in zip(groups, out[1:], strict=True):
            code = int(r[0])
            if code == 3:
                results.append(TooManyClasses(int(r[1])))
            elif code == 2:
                first, last, fp = r[1].decode().split(" ", 2)
                results.append(Appended(int(first), int(last), replayed=True, fingerprint=fp))
            else:
                results.append(Appended(int(r[1]), int(r[2]), fingerprint=group.fingerprint))
        return results

    async def append_metric(self, name: str, L: bytes) -> StreamId:
        keys = ModelKeys(name)
        out = await self._append_metric(keys=[keys.meta, keys.log], args=[L])
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        return parse_id(out[1])

    async def read_tail(self, name: str, after: str, count: int) -> Tail:
        """Up to ``count`` entries (one or more samples each) with ids >= ``after``, and the
        checkpoint's position, read in one transaction: if the checkpoint is past ``after``
        the log before it is trimmed."""
        keys = ModelKeys(name)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hmget(keys.checkpoint, ["applied", "time"])
            pipe.xrange(keys.log, min=after, count=count)
            (applied, at), entries = await pipe.execute()
        return Tail(
            entries=[(parse_id(entry_id), fields) for entry_id, fields in entries],
            checkpoint_applied=None if applied is None else parse_id(applied),
            checkpoint_time=None if at is None else float(at),
        )

    # -- the gallery ---------------------------------------------------------------------------

    async def enrol(
        self,
        name: str,
        items: dict[str, bytes],
        *,
        idempotency_field: str,
        fingerprint: str,
        now_ms: int,
        ttl_ms: int,
        max_items: int,
    ) -> Enrolled:
        """Write gallery items (key -> :func:`~service.storage.codec.encode_gallery_item`)
        and the idempotency record, atomically; :class:`NoSuchModel`, :class:`GalleryFull`."""
        keys = ModelKeys(name)
        args: list[Any] = [now_ms, ttl_ms, max_items, idempotency_field, fingerprint]
        for pair in items.items():
            args += pair
        out = await self._enrol(
            keys=[keys.meta, keys.gallery, keys.idempotency, keys.idempotency_expiry], args=args
        )
        code = int(out[0])
        if code == 0:
            raise NoSuchModel(name)
        if code == 3:
            raise GalleryFull(int(out[1]))
        if code == 2:
            fp, added, size = out[1].decode().split(" ")
            return Enrolled(int(added), int(size), 0, replayed=True, fingerprint=fp)
        return Enrolled(int(out[2]), int(out[3]), int(out[1]), fingerprint=fingerprint)

    async def delete_item(self, name: str, key: str) -> int:
        """Remove a gallery item; the gallery's change count after it (:class:`NoSuchModel`,
        :class:`NoSuchItem`)."""
        keys = ModelKeys(name)
        out = await self._delete_item(keys=[keys.meta, keys.gallery], args=[key])
        code = int(out[0])
        if code == 0:
            raise NoSuchModel(name)
        if code == 2:
            raise NoSuchItem(key)
        return int(out[1])

    async def gallery_changes(self, name: str) -> int:
        """How many times the gallery was changed (enrols and deletes, by any process)."""
        raw = await self.client.hget(ModelKeys(name).meta, "gallery")
        return int(raw) if raw is not None else 0

    async def read_gallery(self, name: str, attempts: int = 5) -> tuple[int, dict[str, bytes]]:
        """Every gallery item (key -> stored value) and the change count they are as of.

        Read in chunks (``HSCAN``: a large gallery does not block Redis for one long reply);
        the change count is read before and after, and the scan repeated (``attempts`` times)
        if another process changed the gallery meanwhile.
        """
        keys = ModelKeys(name)
        for _ in range(attempts):
            before = await self.gallery_changes(name)
            items: dict[str, bytes] = {}
            async for field, value in self.client.hscan_iter(keys.gallery, count=1000):
                items[field.decode()] = value
            after = await self.gallery_changes(name)
            if after == before:
                break
        return after, items

    # -- checkpoints ---------------------------------------------------------------------------

    async def write_checkpoint(
        self,
        name: str,
        ckpt: dict[str, bytes],
        buffer: dict[str, bytes],
        *,
        trim_min_id: str,
        fencing_token: int,
    ) -> bool:
        """Replace the checkpoint and H (:mod:`service.storage.checkpoint` fields) and trim the
        log before ``trim_min_id``, atomically; False if the model is gone, :class:`Fenced` if
        ``fencing_token`` is not the latest granted."""
        keys = ModelKeys(name)
        args: list[Any] = [trim_min_id, fencing_token, len(ckpt)]
        for pair in (*ckpt.items(), *buffer.items()):
            args += pair
        done = int(
            await self._checkpoint(
                keys=[keys.meta, keys.checkpoint, keys.buffer, keys.log, keys.fence], args=args
            )
        )
        if done == -1:
            raise Fenced(name)
        return done == 1

    # -- leases ----------------------------------------------------------------------------------

    async def claim_lease(
        self, name: str, owner: str, ttl_ms: int, created_at: str, held: int | None
    ) -> tuple[bool, int | None]:
        """Renew our lease (``held`` = its token) or take a free one.

        Returns (ours, token): (True, our token), (False, the holder's token) or (False, None)
        when the model is gone or is another incarnation (``created_at`` differs).
        """
        keys = ModelKeys(name)
        out = await self._claim(
            keys=[keys.lease, keys.fence, keys.meta],
            args=[owner, ttl_ms, created_at, "" if held is None else str(held)],
        )
        code = int(out[0])
        if code == 0:
            return False, None
        return code == 1, int(out[1])

    async def release_lease(self, name: str, owner: str, token: int) -> bool:
        return bool(await self._release(keys=[ModelKeys(name).lease], args=[f"{token} {owner}"]))

    async def read_checkpoint(self, name: str) -> tuple[dict[str, bytes], dict[str, bytes]] | None:
        """The ``ckpt`` and ``buffer`` hash fields, read together (None: no checkpoint yet)."""
        keys = ModelKeys(name)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.checkpoint)
            pipe.hgetall(keys.buffer)
            ckpt, buffer = await pipe.execute()
        if not ckpt:
            return None
        return (
            {k.decode(): v for k, v in ckpt.items()},
            {k.decode(): v for k, v in buffer.items()},
        )
