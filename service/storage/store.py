"""The service's view of Redis: :class:`Store`, one object over one shared
:class:`~service.storage.client.Connection` that joins the store class of each aggregate:

* :class:`~service.storage.models.ModelStore` -- the models' metas and their registry;
* :class:`~service.storage.logstore.LogStore` -- each model's log, seqs and checkpoint;
* :class:`~service.storage.gallery.GalleryStore` -- each model's identification gallery;
* :class:`~service.storage.leases.LeaseStore` -- writer leases and process membership;
* :class:`~service.storage.notices.Notices` -- the models' pub/sub channels.

The Lua scripts are ``service/storage/lua/*.lua``; the client, its options and cluster
detection are :mod:`service.storage.client`; the errors are :mod:`service.storage.errors`.
Every failure of the Redis client leaves this layer as :class:`~service.errors.Unavailable`.
"""

from __future__ import annotations

from redis.asyncio.cluster import RedisCluster

from service.storage.client import (
    MAX_CONNECTIONS,
    Client,
    Connection,
    connect,
    connect_cluster,
    redacted_url,
)
from service.storage.errors import (
    ClusterUnavailable,
    Fenced,
    GalleryFull,
    NoSuchItem,
    NoSuchModel,
    NotReplicated,
    Overtaken,
    TooManyClasses,
    guarded,
)
from service.storage.gallery import Enrolled, GalleryStore
from service.storage.leases import LeaseStore
from service.storage.logstore import Appended, Group, LogStore, Tail
from service.storage.models import ModelStore
from service.storage.notices import Listener, Notices

__all__ = [
    "MAX_CONNECTIONS",
    "Appended",
    "Client",
    "ClusterUnavailable",
    "Connection",
    "Enrolled",
    "Fenced",
    "GalleryFull",
    "Group",
    "Listener",
    "NoSuchItem",
    "NoSuchModel",
    "NotReplicated",
    "Overtaken",
    "Store",
    "Tail",
    "TooManyClasses",
    "connect",
    "connect_cluster",
    "redacted_url",
]


@guarded
class Store(ModelStore, LogStore, GalleryStore, LeaseStore, Notices):
    """Every aggregate's store over one connection (a single server or a Redis Cluster).

    ``wait_replicas`` > 0: appends are acknowledged only once that many replicas confirmed them
    (``WAIT``, at most ``wait_timeout_ms``), and the log is read only up to the confirmed
    watermark (see :mod:`service.storage.logstore`).

    >>> store = Store(connect("redis://127.0.0.1:1/0", 1.0), wait_replicas=1)
    >>> store.cluster, store.wait_replicas
    (False, 1)
    """

    def __init__(
        self, client: Client, *, wait_replicas: int = 0, wait_timeout_ms: int = 1000
    ) -> None:
        self.conn = Connection(client, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms)

    @classmethod
    def connect(cls, url: str, timeout_s: float, *, wait_replicas: int = 0) -> Store:
        """A store for ``url`` (see :meth:`Connection.connect`); nothing is sent before
        :meth:`open`."""
        store = cls.__new__(cls)
        store.conn = Connection.connect(url, timeout_s, wait_replicas=wait_replicas)
        return store

    @property
    def client(self) -> Client:
        return self.conn.client

    @property
    def wait_replicas(self) -> int:
        return self.conn.wait_replicas

    @property
    def cluster(self) -> bool:
        """Whether the client is the Redis Cluster client."""
        return isinstance(self.conn.client, RedisCluster)

    async def open(self) -> None:
        """:meth:`Connection.open`: a single server or a Redis Cluster (Unavailable while
        Redis is unreachable: the caller retries)."""
        await self.conn.open()

    async def aclose(self) -> None:
        await self.conn.aclose()

    async def ping(self) -> None:
        await self.conn.client.ping()

    async def server_version(self) -> tuple[int, ...]:
        info = await self.conn.client.info("server")
        return tuple(int(p) for p in str(info["redis_version"]).split(".")[:3])
