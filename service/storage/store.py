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
from redis.asyncio.client import PubSub
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.storage.codec import StreamId, encode_labels, parse_id
from service.storage.keys import APPENDED, MEMBERS, REGISTRY, ModelKeys

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1], 'seq', 0, 'puts', 0, 'created_at', ARGV[2])
return 1
"""

# KEYS: meta, log, classes, idem, idem-exp
# ARGV: now_ms, ttl_ms, max_classes, groups, channel, model name (published on the channel
#       when anything was appended), then per group: idem field ('' = none), fingerprint,
#       n, x block, labels (JSON array), k, then its k distinct labels. Groups are appended in
#       order, each exactly as if alone (a group commit: one script, one AOF write and fsync for
#       requests/frames that arrived together), each as ONE log entry ``<last seq>-1`` holding
#       its n samples (see service.storage.codec).
# -> {0} no model | {1, r1, r2, ...}, per group r = {1, first, last} | {2, "first last fingerprint"}
#    replay | {3, classes} would exceed the class limit (that group alone: nothing of it logged)
_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 64)
if #expired > 0 then
  redis.call('HDEL', KEYS[4], unpack(expired))
  redis.call('ZREM', KEYS[5], unpack(expired))
end
local ttl = tonumber(ARGV[2])
local max_classes = tonumber(ARGV[3])
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local first_seq = seq
local out = {1}
local p = 7
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
if seq > first_seq then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return out
"""

# KEYS: meta, log; ARGV: L bytes, channel, model name -> {0} | {1, entry id}
_APPEND_METRIC = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local puts = redis.call('HINCRBY', KEYS[1], 'puts', 1)
local id = string.format('%d-%d', seq, puts + 1)
redis.call('XADD', KEYS[2], id, 'L', ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return {1, id}
"""

# KEYS: meta, ckpt, log; ARGV: applied seq, first id, count
# -> {checkpoint's applied id or nil, its time or nil, {{id, {field, value, ...}}, ...}}
#    (publishes the reader's applied seq in meta if it moved and the model still exists: an
#    idle writer's reads write nothing, so they cost no AOF write)
_READ_TAIL = """
local was = redis.call('HGET', KEYS[1], 'applied')
if was ~= ARGV[1] and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'applied', ARGV[1])
end
local c = redis.call('HMGET', KEYS[2], 'applied', 'time')
return {c[1], c[2], redis.call('XRANGE', KEYS[3], ARGV[2], '+', 'COUNT', ARGV[3])}
"""

# KEYS: members; ARGV: member id, info JSON, ttl ms -> flat list of the live members' id, info
# (our heartbeat, and expired members removed, with the server's clock: no skew between hosts)
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d %s', now + tonumber(ARGV[3]), ARGV[2]))
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local expiry, info = string.match(all[i + 1], '^(%d+) (.*)$')
  if tonumber(expiry) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = info
  end
end
return out
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
# (member ids are the processes' advertised URLs: no two live processes share one)
# -> {0} no such model (or another incarnation) | {1, token} held by us | {2, token} by another
_CLAIM = """
if redis.call('HGET', KEYS[3], 'created_at') ~= ARGV[3] then return {0} end
local cur = redis.call('GET', KEYS[1])
if cur then
  if ARGV[4] ~= '' and cur == ARGV[4] .. ' ' .. ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(ARGV[4])}
  end
  local token, holder = string.match(cur, '^(%d+) (.*)$')
  if ARGV[4] ~= '' or holder ~= ARGV[1] then return {2, tonumber(token)} end
  -- held under our own member id but not by us: a previous incarnation of this process (one
  -- address), which is dead: taken anew, with a new fencing token
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
        self._checkpoint = client.register_script(_CHECKPOINT)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._read_tail = client.register_script(_READ_TAIL)

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
        args: list[Any] = [now_ms, ttl_ms, max_classes, len(groups), APPENDED, name]
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
        out = await self._append_metric(keys=[keys.meta, keys.log], args=[L, APPENDED, name])
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        return parse_id(out[1])

    async def read_tail(self, name: str, after: str, count: int, *, applied: int) -> Tail:
        """Up to ``count`` entries (one or more samples each) with ids >= ``after``, and the
        checkpoint's position, read atomically by one script that also publishes the reader's
        ``applied`` seq (the owner's progress, for other processes' admission control): if
        the checkpoint is past ``after`` the log before it is trimmed."""
        keys = ModelKeys(name)
        ckpt_applied, at, entries = await self._read_tail(
            keys=[keys.meta, keys.checkpoint, keys.log], args=[applied, after, count]
        )
        return Tail(
            entries=[
                (parse_id(entry_id), dict(zip(flat[::2], flat[1::2], strict=True)))
                for entry_id, flat in entries
            ],
            checkpoint_applied=None if ckpt_applied is None else parse_id(ckpt_applied),
            checkpoint_time=None if at is None else float(at),
        )

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

    async def lease_holder(self, name: str) -> str | None:
        """The member id of the process holding the model's lease (None: nobody)."""
        raw = cast(bytes | None, await self.client.get(ModelKeys(name).lease))
        return None if raw is None else raw.decode().split(" ", 1)[1]

    # -- progress and membership -------------------------------------------------------------

    async def progress(self, name: str) -> tuple[int, int]:
        """(last logged seq, the owner's last published applied seq) of a model."""
        seq, applied = await self.client.hmget(ModelKeys(name).meta, ["seq", "applied"])
        return int(seq or 0), int(applied or 0)

    async def heartbeat(self, member: str, info: str, ttl_ms: int) -> dict[str, str]:
        """Announce ``member`` (``info``: its JSON) for ``ttl_ms``; the live members' infos."""
        flat = await self._heartbeat(keys=[MEMBERS], args=[member, info, ttl_ms])
        return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}

    async def leave(self, member: str) -> None:
        """``member`` stops (a graceful shutdown): the others need not wait for its expiry."""
        await self.client.hdel(MEMBERS, member)

    async def notify(self, name: str) -> None:
        """Announce on :data:`~service.storage.keys.APPENDED` that model ``name`` needs its
        owner's attention (it was released: the process that should own it takes it now)."""
        await self.client.publish(APPENDED, name)

    def appends(self) -> PubSub:
        """A pub/sub subscription object for :data:`~service.storage.keys.APPENDED` (each
        message: the name of a model whose log just grew)."""
        return self.client.pubsub()

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
