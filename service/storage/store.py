"""All Redis reads and writes of the service (key names from :mod:`service.keys`).

Writes that must be atomic are Lua scripts (run with EVALSHA; redis-py reloads them after a
server restart): appending a request's samples together with its seqs and its idempotency
record; appending a metric replacement; writing a checkpoint together with the buffer H and
trimming the log behind it. Every script first checks that the model still exists, so a write
racing a DELETE never resurrects keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.keys import REGISTRY, ModelKeys
from service.storage.codec import StreamId, parse_id

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1], 'seq', 0, 'puts', 0, 'created_at', ARGV[2])
return 1
"""

# KEYS: meta, log, classes, idem, idem-exp
# ARGV: now_ms, ttl_ms, idem field ('' = none), fingerprint, max_classes, n, x1, y1, x2, y2, ...
# -> {0} no model | {1, first, last} | {2, "first last fingerprint"} replay | {3, classes} full
_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 64)
if #expired > 0 then
  redis.call('HDEL', KEYS[4], unpack(expired))
  redis.call('ZREM', KEYS[5], unpack(expired))
end
local field = ARGV[3]
if field ~= '' then
  local prev = redis.call('HGET', KEYS[4], field)
  if prev then return {2, prev} end
end
local n = tonumber(ARGV[6])
local seen, fresh = {}, {}
for i = 1, n do
  local y = ARGV[6 + 2 * i]
  if not seen[y] then
    seen[y] = true
    if redis.call('SISMEMBER', KEYS[3], y) == 0 then fresh[#fresh + 1] = y end
  end
end
if #fresh > 0 then
  local have = redis.call('SCARD', KEYS[3])
  if have + #fresh > tonumber(ARGV[5]) then return {3, have} end
end
local first = tonumber(redis.call('HGET', KEYS[1], 'seq')) + 1
for i = 1, n do
  redis.call('XADD', KEYS[2], string.format('%d-1', first + i - 1),
             'x', ARGV[5 + 2 * i], 'y', ARGV[6 + 2 * i])
end
local last = first + n - 1
redis.call('HSET', KEYS[1], 'seq', last)
for i = 1, #fresh do redis.call('SADD', KEYS[3], fresh[i]) end
if field ~= '' then
  redis.call('HSET', KEYS[4], field, string.format('%d %d %s', first, last, ARGV[4]))
  redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), field)
end
return {1, first, last}
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

# KEYS: meta, ckpt, buffer, log; ARGV: meta json, L, calibration, trim min id, class1, vec1, ...
_CHECKPOINT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[3])
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'meta', ARGV[1], 'L', ARGV[2], 'calibration', ARGV[3])
redis.call('XTRIM', KEYS[4], 'MINID', ARGV[4])
return 1
"""


@dataclass(frozen=True)
class Appended:
    """Outcome of an append: the seqs, and whether it replayed an earlier answer."""

    first_seq: int
    last_seq: int
    replayed: bool = False
    fingerprint: str = ""


class NoSuchModel(Exception):
    """The model's keys are gone (deleted)."""


class TooManyClasses(Exception):
    """Appending would exceed the classes-per-model limit; ``have`` classes exist."""

    def __init__(self, have: int) -> None:
        super().__init__(have)
        self.have = have


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as read back: JSON meta, ``L`` / calibration bytes, buffer H rows."""

    meta: dict[str, Any]
    L: bytes
    calibration: bytes
    buffer: dict[str, bytes]


def connect(url: str, timeout_s: float) -> Redis:
    """A client whose every call is bounded by ``timeout_s``; one quick retry (stale socket)."""
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

    async def forget_name(self, name: str) -> None:
        await self.client.srem(REGISTRY, name)

    async def delete_model(self, name: str) -> None:
        """Remove every key of the model, then its registry entry."""
        await self.client.delete(*ModelKeys(name).all())
        await self.client.srem(REGISTRY, name)

    async def logged_seq(self, name: str) -> int:
        raw = await self.client.hget(ModelKeys(name).meta, "seq")
        return int(raw) if raw is not None else 0

    # -- the log -----------------------------------------------------------------------------

    async def append_samples(
        self,
        name: str,
        rows: list[tuple[bytes, str]],
        *,
        idempotency_field: str,
        fingerprint: str,
        now_ms: int,
        ttl_ms: int,
        max_classes: int,
    ) -> Appended:
        """Append samples atomically with their seqs and idempotency record (see ``_APPEND``)."""
        keys = ModelKeys(name)
        args: list[Any] = [now_ms, ttl_ms, idempotency_field, fingerprint, max_classes, len(rows)]
        for x, y in rows:
            args += [x, y]
        out = await self._append(
            keys=[keys.meta, keys.log, keys.classes, keys.idempotency, keys.idempotency_expiry],
            args=args,
        )
        code = int(out[0])
        if code == 0:
            raise NoSuchModel(name)
        if code == 3:
            raise TooManyClasses(int(out[1]))
        if code == 2:
            first, last, fp = out[1].decode().split(" ", 2)
            return Appended(int(first), int(last), replayed=True, fingerprint=fp)
        return Appended(int(out[1]), int(out[2]), fingerprint=fingerprint)

    async def append_metric(self, name: str, L: bytes) -> StreamId:
        keys = ModelKeys(name)
        out = await self._append_metric(keys=[keys.meta, keys.log], args=[L])
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        return parse_id(out[1])

    async def read_log(
        self, name: str, after: str, count: int
    ) -> list[tuple[StreamId, dict[bytes, bytes]]]:
        """Up to ``count`` entries with ids >= ``after`` (pass the id after the last one read)."""
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            await self.client.xrange(ModelKeys(name).log, min=after, count=count),
        )
        return [(parse_id(entry_id), fields) for entry_id, fields in entries]

    # -- checkpoints ---------------------------------------------------------------------------

    async def write_checkpoint(
        self,
        name: str,
        meta: dict[str, Any],
        L: bytes,
        calibration: bytes,
        buffer: list[tuple[str, bytes]],
        trim_min_id: str,
    ) -> bool:
        """Replace the checkpoint and H, and trim the log before ``trim_min_id``, atomically."""
        keys = ModelKeys(name)
        args: list[Any] = [json.dumps(meta), L, calibration, trim_min_id]
        for label, row in buffer:
            args += [label, row]
        done = await self._checkpoint(
            keys=[keys.meta, keys.checkpoint, keys.buffer, keys.log], args=args
        )
        return bool(done)

    async def read_checkpoint(self, name: str) -> Checkpoint | None:
        keys = ModelKeys(name)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.checkpoint)
            pipe.hgetall(keys.buffer)
            ckpt, buffer = await pipe.execute()
        if not ckpt:
            return None
        return Checkpoint(
            meta=json.loads(ckpt[b"meta"]),
            L=ckpt[b"L"],
            calibration=ckpt[b"calibration"],
            buffer={k.decode(): v for k, v in buffer.items()},
        )
