"""All Redis reads and writes of the service (key names from :mod:`service.storage.keys`).

Writes that must be atomic are Lua scripts (run with EVALSHA; redis-py reloads them after a
server restart): appending a request's samples together with its seqs and its idempotency
record; appending a metric replacement; writing a checkpoint together with the buffer H and
trimming the log behind it; taking, renewing and releasing a model's writer lease. Every script
first checks that the model still exists, so a write racing a DELETE never resurrects keys.

Fencing: a lease grant takes a new token from ``INCR <fence>``; the checkpoint script refuses a
write whose token is not the latest granted, inside Redis, so a process that was paused past its
lease (GC, SIGSTOP, a VM migration) and resumes can never overwrite a newer owner's checkpoint.

Redis Cluster. ``OPML_REDIS_URL`` may name any node of a cluster: :meth:`Store.open` asks that
node ``INFO cluster`` and, on ``cluster_enabled:1``, switches to redis-py's cluster client (same
timeouts; the retries of both are in :func:`_client_options`). No script touches two slots, and
the store uses no MULTI (its atomic reads are scripts too): every script works on one model's
keys, which share the hash tag ``{name}``; the registry set ``opml:models`` (its own slot) is
only read or written by single commands and non-transactional pipelines, which the cluster
client splits by node. MOVED / ASK are followed by the client; everything the cluster client
raises is a :class:`~redis.exceptions.RedisError` (its ``RedisClusterException`` family, e.g.
"slot not covered" during a failover, becomes :class:`ClusterUnavailable`), so a failover is a
503 with ``Retry-After`` and recovers by itself.

Models. A model exists if and only if its meta hash exists. The registry set is an index that
may lag behind the metas: create writes the meta first (``_CREATE``) and then adds the name;
delete removes every key of the model, meta included, in one ``DEL`` (atomic: one slot) and then
the name. So a crash between the two steps leaves, at worst, a registry name without a meta (not
a model: skipped and removed at start-up) or a meta whose name is missing from the registry
(found at start-up by :meth:`Store.repair_registry`, and at any time by name through
:meth:`Store.model_exists`); never a model without its meta or half of a deleted model.

Replicas (``OPML_REDIS_WAIT_REPLICAS`` = n > 0). A sample or metric append is acknowledged only
after ``WAIT n`` on the same connection as its script (so WAIT measures that very write; on a
cluster, at the master of the model's slot) confirmed n replicas; else :class:`NotReplicated`.
Each confirmed append then raises the model's ``confirmed`` watermark (a log id in the meta) and
the writers read the log only up to it: an entry that is in the master alone is never applied, so
a failover that loses it cannot leave a learner ahead of the surviving log. An append refused
for lack of replicas stays in the master's log unapplied until a later confirmed append (its
retry with the same idempotency key, or any other) covers it.

Why one module of this length: it is the only file that speaks Redis, and most of it is the Lua
scripts, each next to the method that runs it; splitting it would put a script and its caller
(and the key layout both rely on) in different files.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit, urlunsplit

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    ConnectionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
)
from redis.maint_notifications import MaintNotificationsConfig

from service.storage.codec import StreamId, encode_labels, parse_id
from service.storage.keys import (
    MEMBERS,
    META_PATTERN,
    REGISTRY,
    ModelKeys,
    appended_channel,
    name_of_meta,
)
from service.storage.lane import Lane

log = logging.getLogger("service.store")

#: Either client: a single Redis server or a Redis Cluster.
Client = Redis | RedisCluster

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

# Keep at most ``cap`` idempotency records (ARGV ``cap``; 0: no cap) after a call that wrote
# ``added`` of them: past it, those closest to expiry go first (with one TTL: the oldest). At
# most ``added + 64`` go per call (in chunks: ``unpack`` has a limit), so a lowered cap is
# reached over a few calls, and no call does unbounded work. ``dropped``: how many went.
_CAP = """
local dropped = 0
if added > 0 and cap > 0 then
  local over = redis.call('ZCARD', KEYS[{expiry}]) - cap
  if over > added + 64 then over = added + 64 end
  while over > 0 do
    local k = math.min(over, 1000)
    local oldest = redis.call('ZRANGE', KEYS[{expiry}], 0, k - 1)
    redis.call('HDEL', KEYS[{idem}], unpack(oldest))
    redis.call('ZREMRANGEBYRANK', KEYS[{expiry}], 0, k - 1)
    over = over - k
    dropped = dropped + k
  end
end
"""

# KEYS: meta, log, classes, idem, idem-exp
# ARGV: now_ms, ttl_ms, max_classes, groups, channel, model name (published on the channel
#       when anything was appended), the cap on idempotency records (0: none), then per group:
#       idem field ('' = none), fingerprint, n, x block, labels (JSON array), holdout flags
#       ('' = none), k, then its k distinct labels. Groups are appended in order, each exactly
#       as if alone (a group commit: one script, one AOF write and fsync for requests/frames
#       that arrived together), each as ONE log entry ``<last seq>-1`` holding its n samples
#       (see service.storage.codec).
# -> {0} no model | {1, puts, dropped, r1, r2, ...}, per group r = {1, first, last} | {2, "first
#    last fingerprint"} replay | {3, classes} would exceed the class limit (that group alone:
#    nothing of it logged); puts: the metric replacements logged so far (all of them before
#    these groups); dropped: the idempotency records the cap removed (_CAP)
_APPEND = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local now = tonumber(ARGV[1])
"""
    + _PURGE.format(idem=4, expiry=5)
    + """
local ttl = tonumber(ARGV[2])
local max_classes = tonumber(ARGV[3])
local cap = tonumber(ARGV[7])
local added = 0
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local first_seq = seq
local out = {1, tonumber(redis.call('HGET', KEYS[1], 'puts') or '0'), 0}
local p = 8
for g = 1, tonumber(ARGV[4]) do
  local field, fp, n = ARGV[p], ARGV[p + 1], tonumber(ARGV[p + 2])
  local x, y, h, k = ARGV[p + 3], ARGV[p + 4], ARGV[p + 5], tonumber(ARGV[p + 6])
  local base = p + 6  -- distinct label i = ARGV[base + i]
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
      local id = string.format('%d-1', seq)
      if h == '' then
        redis.call('XADD', KEYS[2], id, 'n', n, 'x', x, 'y', y)
      else
        redis.call('XADD', KEYS[2], id, 'n', n, 'x', x, 'y', y, 'h', h)
      end
      for i = 1, #fresh do redis.call('SADD', KEYS[3], fresh[i]) end
      if field ~= '' then
        redis.call('HSET', KEYS[4], field, string.format('%d %d %s', first, seq, fp))
        redis.call('ZADD', KEYS[5], now + ttl, field)
        added = added + 1
      end
      out[#out + 1] = {1, first, seq}
    end
  end
end
"""
    + _CAP.format(idem=4, expiry=5)
    + """
out[3] = dropped
redis.call('HSET', KEYS[1], 'seq', seq)
if seq > first_seq then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return out
"""
)

# KEYS: meta, gallery, idem, idem-exp
# ARGV: now_ms, ttl_ms, max_items, idem field ('' = none), fingerprint, the cap on idempotency
#       records (0: none), then item key / value pairs (distinct keys; a key already enrolled
#       is replaced)
# -> {0} no model | {1, changes, added, size, dropped} | {2, "fingerprint added size"} replay |
#    {3, size} the gallery would exceed max_items (nothing written); dropped: as _APPEND
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
local new_items = 0
for i = 7, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then new_items = new_items + 1 end
end
local size = redis.call('HLEN', KEYS[2])
if size + new_items > tonumber(ARGV[3]) then return {3, size} end
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
local changes = redis.call('HINCRBY', KEYS[1], 'gallery', 1)
size = size + new_items
local cap, added = tonumber(ARGV[6]), 0
if field ~= '' then
  redis.call('HSET', KEYS[3], field, string.format('%s %d %d', ARGV[5], new_items, size))
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), field)
  added = 1
end
"""
    + _CAP.format(idem=3, expiry=4)
    + """
return {1, changes, new_items, size, dropped}
"""
)

# KEYS: meta, gallery; ARGV: item key -> {0} no model | {1, changes} | {2} no such item
_DELETE_ITEM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return {2} end
return {1, redis.call('HINCRBY', KEYS[1], 'gallery', 1)}
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

# KEYS: meta; ARGV: seq, part of a log id confirmed by replicas, channel, model name
# -> 0 no model | 1 (publishes the name when the watermark rose: the owner reads that far now)
# Raises the model's ``confirmed`` watermark to that id (never lowers it: appends confirmed out of
# order by several processes each cover every entry logged before them).
_CONFIRM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local s, k = tonumber(ARGV[1]), tonumber(ARGV[2])
local cur = redis.call('HGET', KEYS[1], 'confirmed')
if cur then
  local cs, ck = string.match(cur, '^(%d+)-(%d+)$')
  cs, ck = tonumber(cs), tonumber(ck)
  if cs > s or (cs == s and ck >= k) then return 1 end
end
redis.call('HSET', KEYS[1], 'confirmed', string.format('%d-%d', s, k))
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
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

# The two reads below are scripts rather than MULTI: atomic on a single server and in a cluster
# alike (redis-py's asyncio cluster client runs each command queued in a MULTI in a thread of its
# own with a new event loop, blocking the service's loop: measured at 1.6 ms per log read), in one
# round trip; the Lua copy of the log entries costs about what MULTI's reply does.

# KEYS: log, ckpt, meta; ARGV: min id, count, the reader's applied seq
# -> {entries as XRANGE gives them, {ckpt applied, ckpt time}, meta confirmed (or nil)}
# Also publishes the reader's applied seq in meta (the owner's progress, read by the admission
# control of other processes) if it moved and the model still exists: an idle writer's reads
# write nothing, so they cost no AOF write.
_READ_TAIL = """
local was = redis.call('HGET', KEYS[3], 'applied')
if was ~= ARGV[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'applied', ARGV[3])
end
return {redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2]),
        redis.call('HMGET', KEYS[2], 'applied', 'time'),
        redis.call('HGET', KEYS[3], 'confirmed')}
"""

# KEYS: ckpt, buffer -> {ckpt field, value, ...}, {buffer class, vector, ...}
_READ_CHECKPOINT = """
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
"""

# KEYS: lease; ARGV: "<token> <owner id>" -> 1 released | 0 not ours
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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

    x: bytes
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
        """The fields of the log entry the append script (``_APPEND``'s XADD) makes of this
        group, as a read of the log returns them (the writer applies an append of its own
        process from these, :meth:`service.engine.writer.Writer.offer`)."""
        fields = {b"n": b"%d" % len(self.keys), b"x": self.x, b"y": self.labels}
        if self.holdout:
            fields[b"h"] = self.holdout
        return fields


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


class ClusterUnavailable(ConnectionError):
    """The cluster client could not serve a command (no reachable node, a slot not covered
    during a failover, ...): redis-py raises these outside the RedisError family."""


class NotReplicated(RedisError):
    """An append is in the master but fewer replicas than ``OPML_REDIS_WAIT_REPLICAS``
    confirmed it in time (nothing of it is applied until a confirmed append covers it)."""


class TooManyClasses(Exception):
    """Appending would exceed the classes-per-model limit; ``have`` classes exist."""

    def __init__(self, have: int) -> None:
        super().__init__(have)
        self.have = have


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """A hash or stream entry as a script returns it (field, value, field, value, ...).

    >>> _pairs([b"n", b"1", b"y", b"[]"])
    {b'n': b'1', b'y': b'[]'}
    """
    return dict(zip(flat[::2], flat[1::2], strict=True))


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


def _client_options(timeout_s: float, retries: int) -> dict[str, Any]:
    """The options of both clients: every call bounded by ``timeout_s``; ``retries`` quick
    retries of a call that failed on a lost connection or a timeout.

    A pooled connection left stale by a Redis restart is found before a command is sent on it
    (the pool sees its end of stream and reconnects). redis-py 8 skips that check while the
    pool's maintenance notifications are on, its default ("auto", for Redis Enterprise's
    planned failovers, which this service does not use): off here, or the first call on each
    stale connection fails ("Connection closed by server") and a /readyz answers 503 while the
    same Redis acknowledges samples.

    The single-server client retries nothing (``retries`` 0): a call that failed after it was
    sent may have run (a script's append among them), and running it again would apply its
    samples twice. The cluster client retries once at the cluster level, as redis-py's own
    failover handling requires (it re-reads the slot map and sends again); its connections to
    the nodes never retry.
    """
    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), retries),
        "health_check_interval": 10,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }


class _CPacking:
    """Commands packed by hiredis's C packer (``hiredis.pack_command``), as redis-py's
    synchronous client does when hiredis is installed; its asyncio connections pack every
    argument in Python, ~10 us per append group of eight arguments on a busy event loop (one
    sample per WS frame: 11.8k -> 12.2k frames/s, measured ad hoc). The bytes are the same
    (numbers as ``repr``, strings as UTF-8); an argument hiredis does not take (a bool, None, a
    lone surrogate) goes to redis-py's own packer, which refuses it as it always did."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]  # a command name may hold its subcommand ("SCRIPT LOAD"): split it
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except (TypeError, ValueError):
            return cast(list[bytes], super().pack_command(*args))  # type: ignore[misc]


_C_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _c_packing(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    """``cls`` (a plain, TLS or Unix-socket connection) with :class:`_CPacking`."""
    if cls not in _C_PACKING:
        _C_PACKING[cls] = type(f"CPacking{cls.__name__}", (_CPacking, cls), {})
    return _C_PACKING[cls]


def connect(url: str, timeout_s: float) -> Redis:
    """A client of the single Redis server at ``url`` (see :func:`_client_options`), whose
    connections pack commands in C (:class:`_CPacking`).

    Credentials and TLS come with the URL: ``redis://user:password@host:6379/0``, or
    ``rediss://...`` for TLS (query options such as ``ssl_cert_reqs``, ``ssl_ca_certs``).
    """
    pool = BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=timeout_s, **_client_options(timeout_s, 0)
    )
    pool.connection_class = _c_packing(pool.connection_class)
    client = Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # closing the client closes its pool
    return client


#: Connections of one process to a single Redis server. A burst of concurrent calls beyond it
#: (every writer of hundreds of models polling at once) waits for a free connection, bounded
#: by ``OPML_REDIS_TIMEOUT_S`` like every call, rather than failing: redis-py 8's default pool
#: refuses the 101st concurrent call at once (MaxConnectionsError, seen as a 503 on a create).
MAX_CONNECTIONS = 512


def _closed_transport(exc: RuntimeError) -> ConnectionError:
    """A write on a connection whose socket the event loop already closed (a node killed
    during a failover) raises RuntimeError in uvloop ("the handler is closed") and asyncio
    ("unable to perform operation on ... closed"), not a RedisError: it is a lost connection.
    Any other RuntimeError is re-raised as it is."""
    if "closed" not in str(exc):
        raise exc
    return ConnectionError(f"the connection to Redis was closed ({exc})")


class _ClusterPipeline(ClusterPipeline):
    """redis-py's cluster pipeline whose failures are all RedisErrors (see _Cluster)."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc
        except RuntimeError as exc:
            raise _closed_transport(exc) from exc


class _Cluster(RedisCluster):
    """redis-py's asyncio cluster client, except that its ``RedisClusterException`` family
    (not a RedisError: e.g. no reachable node, a slot not covered while a failover is under way)
    is raised as :class:`ClusterUnavailable`, and a write on a connection the event loop closed
    (a killed node) as a ConnectionError, so every caller's ``except RedisError`` (503 +
    Retry-After, writer and loader backoff) covers the cluster's failures too."""

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        try:
            return await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc
        except RuntimeError as exc:
            raise _closed_transport(exc) from exc

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            raise ValueError("shard_hint: not supported by the cluster client")
        # redis-py's typing marks an attribute of its pipeline abstract that only its client
        # class sets; redis-py builds ClusterPipeline(self, transaction) exactly like this.
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]


def connect_cluster(url: str, timeout_s: float) -> RedisCluster:
    """A client of the Redis Cluster that the node at ``url`` belongs to (it finds the other
    nodes itself; the options of :func:`connect`, but one cluster-level retry: see
    :func:`_client_options`)."""
    try:
        client: RedisCluster = _Cluster.from_url(url, **_client_options(timeout_s, 1))
    except RedisClusterException as exc:  # e.g. a database other than 0 in the URL
        raise ClusterUnavailable(f"OPML_REDIS_URL names a cluster node: {exc}") from exc
    return client


class Store:
    """The service's view of Redis (bytes in, bytes out), on one server or a Redis Cluster.

    ``wait_replicas`` > 0: appends are acknowledged only once that many replicas confirmed them
    (``WAIT``, at most ``wait_timeout_ms``), and the log is read only up to the confirmed
    watermark (see the module docstring).

    >>> store = Store(connect("redis://127.0.0.1:1/0", 1.0), wait_replicas=1)
    >>> store.cluster, store.wait_replicas
    (False, 1)
    """

    def __init__(
        self, client: Client, *, wait_replicas: int = 0, wait_timeout_ms: int = 1000
    ) -> None:
        if wait_replicas < 0:
            raise ValueError(f"wait_replicas: must be >= 0, not {wait_replicas}")
        self.client: Client = client
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        #: (url, timeout) while :meth:`open` has not yet asked the server whether it is a cluster.
        self._pending: tuple[str, float] | None = None
        self._opening = asyncio.Lock()
        #: The connection the appends of samples and metrics go through (None: through
        #: redis-py; see service.storage.lane). Not with replicas awaited: WAIT goes on the
        #: connection of the write it waits for, which redis-py's pipeline keeps together.
        self._lane = Lane.of(client) if isinstance(client, Redis) and not wait_replicas else None
        self._register_scripts()

    @classmethod
    def connect(cls, url: str, timeout_s: float, *, wait_replicas: int = 0) -> Store:
        """A store for ``url``; :meth:`open` finds out whether it names a cluster node. Nothing
        is sent before (so the service starts, and says it is not ready, while Redis is down).
        The WAIT timeout is half of ``timeout_s``: the WAIT's answer is always read well within
        the socket timeout."""
        store = cls(
            connect(url, timeout_s),
            wait_replicas=wait_replicas,
            wait_timeout_ms=max(1, int(timeout_s * 500)),
        )
        store._pending = (url, timeout_s)
        return store

    def _register_scripts(self) -> None:
        client = self.client
        self._create = client.register_script(_CREATE)
        self._append = client.register_script(_APPEND)
        self._append_metric = client.register_script(_APPEND_METRIC)
        self._confirm = client.register_script(_CONFIRM)
        self._enrol = client.register_script(_ENROL)
        self._delete_item = client.register_script(_DELETE_ITEM)
        self._checkpoint = client.register_script(_CHECKPOINT)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)
        self._read_tail = client.register_script(_READ_TAIL)
        self._read_checkpoint = client.register_script(_READ_CHECKPOINT)
        self._heartbeat = client.register_script(_HEARTBEAT)

    @property
    def cluster(self) -> bool:
        """Whether the client is the Redis Cluster client."""
        return isinstance(self.client, RedisCluster)

    async def open(self) -> None:
        """Ask the node the URL names whether it is part of a cluster (``INFO cluster``) and,
        if so, switch to the cluster client. Once; a RedisError while Redis is unreachable (the
        caller retries). A store made from a client is open from the start."""
        async with self._opening:
            if self._pending is None:
                return
            url, timeout_s = self._pending
            info = await self.client.info("cluster")
            if int(info.get("cluster_enabled", 0)):
                cluster = connect_cluster(url, timeout_s)
                try:
                    await cluster.initialize()
                except BaseException:
                    await cluster.aclose()
                    raise
                standalone, self.client = self.client, cluster
                if self._lane is not None:
                    await self._lane.aclose()
                    self._lane = None
                self._register_scripts()
                await standalone.aclose()
                log.info("Redis Cluster: %d master(s)", len(cluster.get_primaries()))
            self._pending = None

    async def aclose(self) -> None:
        if self._lane is not None:
            await self._lane.aclose()
        await self.client.aclose()

    async def ping(self) -> None:
        await self.client.ping()

    async def server_version(self) -> tuple[int, ...]:
        info = await self.client.info("server")
        return tuple(int(p) for p in str(info["redis_version"]).split(".")[:3])

    # -- models ----------------------------------------------------------------------------

    async def create_model(self, name: str, config: dict[str, Any], created_at: float) -> bool:
        """Create the model (its meta hash), then index it in the registry; False if it
        exists. A failure between the two leaves a model missing from the index, which
        :meth:`repair_registry` and :meth:`model_exists` find."""
        keys = ModelKeys(name)
        done = await self._create(keys=[keys.meta], args=[json.dumps(config), repr(created_at)])
        if done:
            await self.client.sadd(REGISTRY, name)
        return bool(done)

    async def model_exists(self, name: str) -> bool:
        """Whether the model exists (its meta does), whatever the registry says: one EXISTS."""
        return bool(await self.client.exists(ModelKeys(name).meta))

    async def model_names(self) -> list[str]:
        """The registry: every model's name, and possibly a few names whose create or delete
        did not finish (their meta is missing: not models)."""
        names = cast(set[bytes], await self.client.smembers(REGISTRY))
        return sorted(n.decode() for n in names)

    async def repair_registry(self) -> list[str]:
        """Make the registry list exactly the models (start-up): remove names without a meta,
        add metas whose name is missing; log each repair; return the models' names.

        Metas are found with ``SCAN MATCH opml:{*}:meta`` on every master (the cluster client
        scans each one): O(keys) once per start, the price of an index that may lag behind."""
        registered = set(await self.model_names())
        metas = {name_of_meta(key) async for key in self.client.scan_iter(META_PATTERN, 1000)}
        for name in sorted(metas - registered):
            log.warning("model %r was missing from the registry (a create that did not "
                        "finish); added", name)  # fmt: skip
            await self.client.sadd(REGISTRY, name)
        dangling = sorted(registered - metas)
        if dangling:
            await self.client.srem(REGISTRY, *dangling)
            # A create of that name may be under way: its meta written after our SCAN and its
            # name added before our SREM. Look again after the SREM and put such names back.
            for name in dangling:
                if await self.model_exists(name):
                    await self.client.sadd(REGISTRY, name)
                    metas.add(name)
                else:
                    log.warning("registry name %r has no model (a create or delete that did "
                                "not finish); removed", name)  # fmt: skip
        return sorted(metas)

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
        """Remove every key of the model in one DEL (atomic: they share one slot; the model
        stops existing with its meta), then its registry entry."""
        await self.client.delete(*ModelKeys(name).all())
        await self.client.srem(REGISTRY, name)

    async def logged_seq(self, name: str) -> int:
        """The last seq the writers may apply: the last assigned one, or with replicas awaited
        the last confirmed one."""
        if self.wait_replicas:
            raw = await self.client.hget(ModelKeys(name).meta, "confirmed")
            return 0 if raw is None else parse_id(raw)[0]
        raw = await self.client.hget(ModelKeys(name).meta, "seq")
        return int(raw) if raw is not None else 0

    # -- replicas --------------------------------------------------------------------------------

    async def _run_replicated(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Run ``script``; with replicas awaited, send ``WAIT n timeout`` after it on the same
        connection (WAIT counts the replicas that have that connection's latest write; on a
        cluster both go to the master of the keys' slot). :class:`NotReplicated` if fewer."""
        if not self.wait_replicas:
            if self._lane is not None:
                return await self._lane.script(script, keys, args)
            return await script(keys=keys, args=args)
        client = self.client
        for _ in range(3):
            evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
            wait = ("WAIT", self.wait_replicas, self.wait_timeout_ms)
            if isinstance(client, RedisCluster):
                await client.initialize()
                master = client.get_node_from_key(keys[0])
                cluster_pipe = client.pipeline(transaction=False)
                cluster_pipe.execute_command(*evalsha, target_nodes=master)
                cluster_pipe.execute_command(*wait, target_nodes=master)
                # a redirect is handled below: followed alone, the script would leave the WAIT
                out, acks = await cluster_pipe.execute(
                    raise_on_error=False, allow_redirections=False
                )
            else:
                pipe = client.pipeline(transaction=False)
                pipe.execute_command(*evalsha)
                pipe.execute_command(*wait)
                out, acks = await pipe.execute(raise_on_error=False)
            if isinstance(out, NoScriptError):  # a restarted or newly promoted server
                await client.script_load(script.script)
                continue
            if isinstance(out, AskError):  # MOVED (or ASK: a slot being migrated)
                # One keyed command through the client's own redirect handling teaches it
                # where the slot is now; then run the pair again at the right master.
                await client.exists(keys[0])
                continue
            for result in (out, acks):
                if isinstance(result, Exception):
                    raise result
            if int(acks) < self.wait_replicas:
                raise NotReplicated(
                    f"Redis replicas: {int(acks)} of {self.wait_replicas} confirmed the write "
                    f"within {self.wait_timeout_ms} ms (OPML_REDIS_WAIT_REPLICAS); it is not "
                    "acknowledged: retry with the same Idempotency-Key / frame id"
                )
            return out
        raise ClusterUnavailable(f"the slot of {keys[0]} is moving between masters; retry")

    async def _confirmed(self, name: str, entry: StreamId) -> None:
        """Replicas have every log entry up to ``entry``: let the writers read that far."""
        await self._confirm(
            keys=[ModelKeys(name).meta], args=[*entry, appended_channel(name), name]
        )

    # -- the log -----------------------------------------------------------------------------

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
        (``_CAP``); ``on_dropped`` is called with the number of records the cap removed, when
        it removed any."""
        keys = ModelKeys(name)
        # With replicas awaited the owner is woken by the confirmation instead (_CONFIRM).
        channel = appended_channel(name) if announce and not self.wait_replicas else ""
        args: list[Any] = [now_ms, ttl_ms, max_classes, len(groups), channel, name, max_records]
        for group in groups:
            if not group.keys:
                raise ValueError("groups: a group has at least one sample")
            sample_keys = group.keys
            distinct = sample_keys if len(sample_keys) == 1 else list(dict.fromkeys(sample_keys))
            args += [group.idempotency_field, group.fingerprint, len(group.keys), group.x,
                     group.labels, group.holdout, len(distinct),
                     *distinct]  # fmt: skip
        out = await self._run_replicated(
            self._append,
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
        if self.wait_replicas:
            last = max((r.last_seq for r in results if isinstance(r, Appended)), default=0)
            if last:  # a replay's entries were logged before the WAIT's write: covered too
                await self._confirmed(name, (last, 1))
        return results

    async def append_metric(self, name: str, L: bytes) -> StreamId:
        keys = ModelKeys(name)
        channel = "" if self.wait_replicas else appended_channel(name)
        out = await self._run_replicated(
            self._append_metric, [keys.meta, keys.log], [L, channel, name]
        )
        if int(out[0]) == 0:
            raise NoSuchModel(name)
        entry = parse_id(out[1])
        if self.wait_replicas:
            await self._confirmed(name, entry)
        return entry

    async def read_tail(self, name: str, after: str, count: int, *, applied: int) -> Tail:
        """Up to ``count`` entries (one or more samples each) with ids >= ``after`` (with
        replicas awaited: up to the confirmed watermark), and the checkpoint's position, read
        atomically: if the checkpoint is past ``after`` the log before it is trimmed. Publishes
        the reader's ``applied`` seq too (see ``_READ_TAIL``)."""
        keys = ModelKeys(name)
        entries, (ckpt_applied, at), confirmed = await self._read_tail(
            keys=[keys.log, keys.checkpoint, keys.meta], args=[after, count, applied]
        )
        tail = [(parse_id(entry_id), _pairs(flat)) for entry_id, flat in entries]
        if self.wait_replicas:  # only what replicas confirmed (see the module docstring)
            limit = (0, 0) if confirmed is None else parse_id(confirmed)
            tail = [(entry_id, fields) for entry_id, fields in tail if entry_id <= limit]
        return Tail(
            entries=tail,
            checkpoint_applied=None if ckpt_applied is None else parse_id(ckpt_applied),
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
        max_records: int = 0,
        on_dropped: Callable[[int], object] | None = None,
    ) -> Enrolled:
        """Write gallery items (key -> :func:`~service.storage.codec.encode_gallery_item`)
        and the idempotency record, atomically; :class:`NoSuchModel`, :class:`GalleryFull`.
        ``ttl_ms``, ``max_records`` and ``on_dropped``: as :meth:`append_groups`."""
        keys = ModelKeys(name)
        args: list[Any] = [now_ms, ttl_ms, max_items, idempotency_field, fingerprint, max_records]
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
        dropped = int(out[4])
        if dropped and on_dropped is not None:
            on_dropped(dropped)
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
        """Announce on the model's channel (:func:`~service.storage.keys.appended_channel`) that
        model ``name`` needs its owner's attention (it was released: the process that should
        own it takes it now)."""
        await self.client.publish(appended_channel(name), name)

    def appends(self) -> PubSub:
        """A pub/sub object for the models' channels (:func:`~service.storage.keys.
        appended_channel`; each message: the name of a model whose log just grew)."""
        return self.client.pubsub()

    async def read_checkpoint(self, name: str) -> tuple[dict[str, bytes], dict[str, bytes]] | None:
        """The ``ckpt`` and ``buffer`` hash fields, read together (None: no checkpoint yet)."""
        keys = ModelKeys(name)
        ckpt, buffer = await self._read_checkpoint(keys=[keys.checkpoint, keys.buffer])
        if not ckpt:
            return None
        return (
            {k.decode(): v for k, v in _pairs(ckpt).items()},
            {k.decode(): v for k, v in _pairs(buffer).items()},
        )
