"""The connection to Redis that every store class of :mod:`service.storage` shares: the client
(a single server or a Redis Cluster, found out by :meth:`Connection.open`), its options, the
Lua scripts (``service/storage/lua/*.lua``, read once), and the appends that wait for replicas.

Redis Cluster. ``OPML_REDIS_URL`` may name any node of a cluster, or several of them separated
by commas (``redis://h1:7000,redis://h2:7000``): seed nodes, any one of which being up is enough
to start. With one URL, :meth:`Connection.open` asks that node ``INFO cluster`` and, on
``cluster_enabled:1``, switches to redis-py's cluster client (same timeouts; the retries of both
are in :func:`_client_options`); several URLs always name a cluster (credentials and options
come from the first). No script touches two slots, and the store uses no MULTI (its atomic
reads are scripts too): every script works on one model's keys, which share the hash tag
``{name}``; the model index ``opml:models`` (its own slot) is only read or written by single
commands and non-transactional pipelines, which the cluster client splits by node. MOVED / ASK
are followed by the client.

Replicas (``OPML_REDIS_WAIT_REPLICAS`` = n > 0). A sample or metric append is acknowledged only
after ``WAIT n`` on the same connection as its script (so WAIT measures that very write; on a
cluster, at the master of the model's slot) confirmed n replicas; else
:class:`~service.storage.errors.NotReplicated`.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, ConnectionError, NoScriptError, RedisClusterException
from redis.maint_notifications import MaintNotificationsConfig

from service.storage.errors import ClusterUnavailable, NotReplicated
from service.storage.lane import Lane, pack_command

log = logging.getLogger("service.store")

#: Either client: a single Redis server or a Redis Cluster.
Client = Redis | RedisCluster

#: The Lua scripts, by file name without ``.lua``: read once, when this module is imported.
SCRIPTS: dict[str, str] = {
    entry.name.removesuffix(".lua"): entry.read_text()
    for entry in resources.files("service.storage").joinpath("lua").iterdir()
    if entry.name.endswith(".lua")
}


def redacted_url(url: str) -> str:
    """``url`` (or each URL of a comma-separated list) with its password replaced by ``***``
    (for logs).

    >>> redacted_url("redis://:pw@localhost:6379/0")
    'redis://:***@localhost:6379/0'
    >>> redacted_url("redis://:pw@h1:7000,redis://u:pw@h2:7000")
    'redis://:***@h1:7000,redis://u:***@h2:7000'
    """
    if "," in url:
        return ",".join(redacted_url(part) for part in url.split(","))
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
    """Commands packed by hiredis's C packer (:func:`~service.storage.lane.pack_command`, which
    packs a command with a large argument beside it), as redis-py's synchronous client does
    when hiredis is installed; its asyncio connections pack every argument in Python, a cost
    the one-sample-per-frame path pays per append (docs/design/append-lane.md). The bytes are
    the same (numbers as ``repr``, strings as UTF-8); an argument hiredis does not take (a bool,
    None, a lone surrogate) goes to redis-py's own packer, which refuses it as it always did."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]  # a command name may hold its subcommand ("SCRIPT LOAD"): split it
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return cast(list[bytes], pack_command(args))
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


def seed_urls(url: str) -> list[str]:
    """The URLs of ``OPML_REDIS_URL`` (one, or several separated by commas).

    >>> seed_urls("redis://a:7000, redis://b:7001")
    ['redis://a:7000', 'redis://b:7001']
    """
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise ValueError("OPML_REDIS_URL: no URL given")
    return urls


def connect_seeds(urls: list[str], timeout_s: float) -> RedisCluster:
    """A client of the Redis Cluster that any of the nodes at ``urls`` belongs to (options
    and credentials from the first URL)."""
    nodes = []
    for url in urls[1:]:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"OPML_REDIS_URL: {redacted_url(url)!r} names no host")
        nodes.append(ClusterNode(parts.hostname, parts.port or 6379))
    try:
        client: RedisCluster = _Cluster.from_url(
            urls[0], startup_nodes=nodes, **_client_options(timeout_s, 1)
        )
    except RedisClusterException as exc:
        raise ClusterUnavailable(f"OPML_REDIS_URL names cluster nodes: {exc}") from exc
    return client


class Connection:
    """The client every store class of one process goes through, and what they share: the
    scripts, the replicas awaited (``wait_replicas`` > 0: appends are acknowledged only once
    that many replicas confirmed them, at most ``wait_timeout_ms``).

    >>> conn = Connection(connect("redis://127.0.0.1:1/0", 1.0), wait_replicas=1)
    >>> conn.cluster, conn.wait_replicas
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
        self.scripts: dict[str, AsyncScript] = {}
        self._register_scripts()

    @classmethod
    def connect(cls, url: str, timeout_s: float, *, wait_replicas: int = 0) -> Connection:
        """A connection for ``url`` (one URL, or a cluster's seed nodes separated by commas);
        :meth:`open` finds out whether one URL names a cluster node. Nothing is sent before
        (so the service starts, and says it is not ready, while Redis is down). The WAIT
        timeout is half of ``timeout_s``: the WAIT's answer is always read well within the
        socket timeout."""
        urls = seed_urls(url)
        wait_timeout_ms = max(1, int(timeout_s * 500))
        if len(urls) > 1:
            return cls(
                connect_seeds(urls, timeout_s),
                wait_replicas=wait_replicas,
                wait_timeout_ms=wait_timeout_ms,
            )
        conn = cls(
            connect(urls[0], timeout_s),
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )
        conn._pending = (urls[0], timeout_s)
        return conn

    def _register_scripts(self) -> None:
        self.scripts = {name: self.client.register_script(s) for name, s in SCRIPTS.items()}

    @property
    def cluster(self) -> bool:
        """Whether the client is the Redis Cluster client."""
        return isinstance(self.client, RedisCluster)

    async def open(self) -> None:
        """Find out whether the node the URL names is part of a cluster (``INFO cluster``)
        and, if so, switch to the cluster client; with seed nodes, find the cluster. Once; a
        RedisError while Redis is unreachable (the caller retries)."""
        async with self._opening:
            if self._pending is None:
                if isinstance(self.client, RedisCluster):
                    await self.client.initialize()
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

    async def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run the script ``script`` (its file name without ``.lua``)."""
        return await self.scripts[script](keys=keys, args=args)

    async def run_replicated(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run the script ``script``; with replicas awaited, send ``WAIT n timeout`` after it
        on the same connection (WAIT counts the replicas that have that connection's latest
        write; on a cluster both go to the master of the keys' slot). :class:`NotReplicated`
        if fewer."""
        runner = self.scripts[script]
        if not self.wait_replicas:
            if self._lane is not None:
                return await self._lane.script(runner, keys, args)
            return await runner(keys=keys, args=args)
        client = self.client
        for _ in range(3):
            evalsha = ("EVALSHA", runner.sha, len(keys), *keys, *args)
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
                await client.script_load(runner.script)
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
                    "acknowledged: retry it with the same idempotency key"
                )
            return out
        raise ClusterUnavailable(f"the slot of {keys[0]} is moving between masters; retry")
