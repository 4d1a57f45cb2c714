"""A chaos run: service processes on a local Redis Cluster, clients that retry, seeded faults, a
checker at the end.

:func:`run` starts a Redis Cluster of redis-server processes (masters with one replica each,
:class:`tests.service.cluster.LocalCluster`), several ``python -m service`` processes on it
(:class:`devkit.launcher.ServiceProcess`; appends wait for a replica, ``WAIT 1``), and then at
once:

* **Workload**: one writer thread per model sends batches through the SDK
  (:class:`clients.OPMLClient`, its own bounded retries of 503s and dropped connections), each
  batch with an ``Idempotency-Key`` of its own; when the SDK gives up on one process the writer
  tries the next one with the same key, until the batch is acknowledged. A reader per model asks
  for its metric every 0.1 s, through the next process when one fails (any process appends to
  any model's log, so only a read shows whether the model is served). Every answer with status
  500 is recorded (endpoint, detail), with the unhandled errors in the services' logs.
* **Owner watch**: polls every model's lease holder and keeps each hand-over.
* **Recorder**: one thread per model follows the model's Redis stream (``XREAD BLOCK``) and
  keeps every entry it sees, because checkpoints trim the log behind them (the run sets the
  checkpoint thresholds out of reach, so trims happen only at hand-overs and graceful stops;
  a blocked ``XREAD`` is answered when the entry is appended, before anything can trim it).
* **Nemesis**: a seeded schedule of faults, one at a time, each followed by a wait until every
  model is acknowledged again and a seeded quiet gap: ``service_kill`` (kill -9 of one process,
  restarted once every model is served by the others), ``service_pause`` (SIGSTOP past the
  lease TTL, then SIGCONT), ``redis_master_kill`` (kill -9 of the master serving a model; its
  replica takes over by itself and the old node rejoins as a replica), ``rolling_restart``
  (SIGTERM one process at a time, each back and every model acknowledged before the next) and
  ``full_restart`` (kill -9 of every process, then all started again).

The **checker** (:func:`check`) then asks, per model: the log (recorded and what is left in
Redis) covers seqs 1..n; every acknowledged batch is in it once, at the seqs it was
acknowledged with, row for row; no sample is logged twice and none that was never sent; the
metric every process serves (``min_version`` = n) equals exactly the core learner
(:class:`service.core.Learner`) replaying the log (which also vouches for an entry the recorder
missed: :func:`check_model`); no answer was a 500; no process started by the run is still
running. The schedule and the data depend only on the seed; the timing does not, and the
checker's verdict must not either.

The **measurement** (:func:`measure`): per fault, per model, the unavailability of writes and
of reads (the longest stretch without an acknowledgement, or without a served read, that
overlaps the fault, counted from the fault's start at the earliest), the stretches over
:data:`INTERRUPTION_S`, the model's moves between processes, and the latency of the
acknowledgements in the fault's window (from a batch's first attempt to its acknowledgement,
retries included).

Command line (the short check, or a long measurement with the report on stdout)::

    python -m tests.chaos.engine --seed 7 --faults 5 --services 2 --models 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from clients import OPMLClient
from clients.errors import APIError, OPMLError
from clients.retry import RetryPolicy
from devkit.launcher import ServiceProcess
from service.core import Learner, LearnerConfig
from service.storage.codec import decode_entry, parse_id
from service.storage.keys import ModelKeys
from tests.service.cluster import LocalCluster

KINDS = ("service_kill", "service_pause", "redis_master_kill", "rolling_restart", "full_restart")

#: The clients' bound on one request: a process frozen by SIGSTOP holds a request until then,
#: and the writer tries the next process (a load balancer's health check would do the same).
CLIENT_TIMEOUT_S = 3.0

#: A model's reader asks for its metric this often (the resolution of the read measurement).
READ_EVERY_S = 0.1

#: Bound of every wait of the nemesis for the system to come back (a hang is a finding).
RECOVERY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Config:
    """What a run does; everything it checks follows from these and the seed."""

    seed: int = 1
    faults: int = 5
    services: int = 2
    masters: int = 3
    models: int = 4
    dim: int = 3
    batch: int = 4
    samples: int = 200_000  # per model: more than a run sends
    quiet_s: tuple[float, float] = (0.5, 2.0)
    lease_ttl_s: float = 3.0
    poll_interval_s: float = 0.2
    node_timeout_ms: int = 2000
    kinds: tuple[str, ...] = KINDS

    def schedule(self) -> list[tuple[str, int, float]]:
        """The faults: (kind, target, quiet seconds after it). Every kind comes once before
        any comes twice (each round shuffled by the seed); ``target`` picks the process (or
        the model whose Redis master is killed)."""
        rng = random.Random(self.seed)
        out: list[tuple[str, int, float]] = []
        while len(out) < self.faults:
            round_ = list(self.kinds)
            rng.shuffle(round_)
            for kind in round_:
                span = self.models if kind == "redis_master_kill" else self.services
                out.append((kind, rng.randrange(span), rng.uniform(*self.quiet_s)))
        return out[: self.faults]

    def env(self) -> dict[str, str]:
        return {
            "OPML_LEASE_TTL_S": str(self.lease_ttl_s),
            "OPML_POLL_INTERVAL_S": str(self.poll_interval_s),
            # out of reach: the log is trimmed only at hand-overs and graceful stops
            "OPML_CHECKPOINT_EVERY": "100000000",
            "OPML_CHECKPOINT_INTERVAL_S": "1000000",
            "OPML_REDIS_WAIT_REPLICAS": "1",
            # an AOF fsync on a loaded machine may stall past the 2 s default
            "OPML_REDIS_TIMEOUT_S": "5",
            "OPML_LOG_LEVEL": "warning",
        }


@dataclass
class Ack:
    """One acknowledged batch."""

    model: str
    lo: int  # sample indexes lo..hi-1 of the model's stream
    hi: int
    first_seq: int
    last_seq: int
    sent: float  # monotonic time of the first attempt
    acked: float


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float = 0.0  # every model acknowledged again (the next fault starts after the gap)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a run observed; :func:`check` and :func:`measure` read it."""

    config: Config
    names: list[str]
    streams: dict[str, tuple[np.ndarray, list[str]]]
    acks: list[Ack]
    faults: list[Fault]
    server_errors: list[tuple[float, str]]  # 500s: (when, "METHOD path (via process): detail")
    statuses: dict[str, int]  # answers other than 2xx seen by the clients, by status
    reads: dict[str, list[float]]  # model -> times of its served metric reads
    owners: OwnerWatch
    log: dict[str, dict[int, tuple[np.ndarray, list[str]]]]  # model -> last seq -> entry
    rewritten: int  # entries seen twice with different content (appended, lost in a failover)
    served: dict[str, list[tuple[str, int, np.ndarray | None]]]  # model -> (process, version, L)
    pids: list[int]
    log_excerpts: list[str]
    documents: dict[str, str]  # model -> its document at the end (see model_documents)
    started: float
    ended: float
    #: Per model: acknowledged entries the recorder never saw (set by :func:`check`).
    unrecorded: dict[str, int] = field(default_factory=dict)


class Harness:
    """The processes of a run; :meth:`close` ends every one of them, whatever happened."""

    def __init__(self, root: Path, config: Config) -> None:
        self.config = config
        self.root = root
        self.cluster = LocalCluster(
            root / "redis", masters=config.masters, replicas=1,
            node_timeout_ms=config.node_timeout_ms,
        )  # fmt: skip
        self.services: list[ServiceProcess] = []
        self.pids: list[int] = []

    def start(self) -> None:
        self.cluster.start()
        self._note_redis_pids()
        url = self.cluster.nodes[0].url
        for k in range(self.config.services):
            svc = ServiceProcess(self.root / f"svc{k}", url, **self.config.env())  # type: ignore[arg-type]
            self.services.append(svc)
        for svc in self.services:
            self.start_service(svc)

    def start_service(self, svc: ServiceProcess) -> None:
        svc.start(timeout=RECOVERY_TIMEOUT_S)
        self.pids.append(svc.pid)

    def restart_node(self, node: Any) -> None:
        self.cluster.restart(node)
        self._note_redis_pids()

    def _note_redis_pids(self) -> None:
        for node in self.cluster.nodes:
            if node.proc is not None and node.proc.pid not in self.pids:
                self.pids.append(node.proc.pid)

    def live(self) -> list[ServiceProcess]:
        return [s for s in self.services if s.running]

    def close(self) -> None:
        errors: list[BaseException] = []
        for svc in self.services:
            try:
                svc.close()
            except Exception as exc:  # a hung graceful stop: killed, reported after the rest
                errors.append(exc)
        self.cluster.stop()
        if errors:
            raise errors[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not count: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_until(what: str, check: Callable[[], bool], timeout: float = RECOVERY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.05)


def make_stream(seed: int, index: int, n: int, dim: int) -> tuple[np.ndarray, list[str]]:
    """Model ``index``'s samples: class blobs (so triplet updates happen), every row distinct."""
    rng = np.random.default_rng([seed, index])
    centers = rng.normal(size=(3, dim)) * 2
    labels = rng.integers(3, size=n)
    return centers[labels] + rng.normal(size=(n, dim)), [f"c{k}" for k in labels]


class Workload:
    """Writers (one per model) and a reader, through the SDK, rotating over the processes."""

    def __init__(self, harness: Harness, names: list[str], stream_len: int) -> None:
        self.harness = harness
        self.config = harness.config
        self.names = names
        self.streams = {
            name: make_stream(self.config.seed, k, stream_len, self.config.dim)
            for k, name in enumerate(names)
        }
        self.acks: list[Ack] = []
        self.last_ack: dict[str, float] = {}
        self.reads: dict[str, list[float]] = {name: [] for name in names}  # served metric reads
        self.server_errors: list[tuple[float, str]] = []
        self.statuses: dict[str, int] = {}
        self.failures: list[str] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # the SDK's own retries stay short: a dead process is left for the next one
        self._retry = RetryPolicy(attempts=2, base_delay_s=0.05, max_delay_s=0.3)

    def client(self, k: int) -> OPMLClient:
        svc = self.harness.services[k % len(self.harness.services)]
        return OPMLClient(svc.url, timeout=CLIENT_TIMEOUT_S, retry=self._retry)

    def start(self) -> None:
        for k, name in enumerate(self.names):
            self._threads.append(threading.Thread(target=self._writer, args=(k, name)))
            self._threads.append(threading.Thread(target=self._reader, args=(k, name)))
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float = RECOVERY_TIMEOUT_S) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            self.failures.append("a client thread did not finish within its bound")

    def acked_since(self, t: float) -> bool:
        """Every model has an acknowledgement and a served read after monotonic time ``t``."""
        with self._lock:
            return all(
                self.last_ack.get(n, -1.0) > t and self.reads[n] and self.reads[n][-1] > t
                for n in self.names
            )

    def _note(self, failure: Exception, method: str, path: str, via: str) -> None:
        status = str(failure.status) if isinstance(failure, APIError) else type(failure).__name__
        with self._lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if isinstance(failure, APIError) and failure.status == 500:
                self.server_errors.append(
                    (time.monotonic(), f"{method} {path} (via {via}): {failure.detail}")
                )

    def _writer(self, k: int, name: str) -> None:
        try:
            self._write(k, name)
        except Exception as exc:  # the nemesis stops waiting and the run fails with it
            self.failures.append(f"{name}: the writer failed: {exc!r}")
            raise

    def _write(self, k: int, name: str) -> None:
        X, y = self.streams[name]
        batch = self.config.batch
        clients = [self.client(j) for j in range(len(self.harness.services))]
        turn = k
        try:
            for lo in range(0, len(y), batch):
                if self.stop.is_set():
                    return
                key = f"{name}-{lo}"
                sent = time.monotonic()
                deadline = sent + RECOVERY_TIMEOUT_S
                while True:  # until acknowledged: the same key on every process
                    client = clients[turn % len(clients)]
                    try:
                        got = client.ingest(name, X[lo : lo + batch], y[lo : lo + batch],
                                            idempotency_key=key)  # fmt: skip
                    except OPMLError as exc:
                        self._note(exc, "POST", f"/v1/models/{name}/samples", client.base_url)
                        if time.monotonic() > deadline:
                            self.failures.append(f"{name}: batch {lo} not acknowledged: {exc}")
                            return
                        turn += 1
                        time.sleep(0.05)
                        continue
                    now = time.monotonic()
                    with self._lock:
                        self.acks.append(Ack(name, lo, lo + batch, got.first_seq, got.last_seq,
                                             sent, now))  # fmt: skip
                        self.last_ack[name] = now
                    break
            self.failures.append(f"{name}: its stream of {len(y)} samples ran out")
        finally:
            for client in clients:
                client.close()

    def _reader(self, k: int, name: str) -> None:
        """Reads the model's metric every :data:`READ_EVERY_S`; a failed read tries the next
        process at once (a read is served when any process answers it)."""
        clients = [self.client(j) for j in range(len(self.harness.services))]
        turn = k
        try:
            while not self.stop.is_set():
                client = clients[turn % len(clients)]
                try:
                    client.metric_snapshot(name)
                except OPMLError as exc:
                    self._note(exc, "GET", f"/v1/models/{name}/metric", client.base_url)
                    turn += 1
                    self.stop.wait(0.05)
                    continue
                with self._lock:
                    self.reads[name].append(time.monotonic())
                self.stop.wait(READ_EVERY_S)
        except Exception as exc:  # the nemesis stops waiting and the run fails with it
            self.failures.append(f"{name}: the reader failed: {exc!r}")
            raise
        finally:
            for client in clients:
                client.close()


#: What a cluster client raises while a node is down or a failover is under way.
CLUSTER_ERRORS = (redis.RedisError, RedisClusterException, OSError, IndexError, KeyError)


def cluster_client(cluster: LocalCluster, timeout: float = 5.0) -> RedisCluster:
    """A cluster client that knows every node as a seed (any one of them may be down)."""
    nodes = [ClusterNode("127.0.0.1", n.port) for n in cluster.nodes]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=nodes, socket_timeout=timeout)


class Recorder:
    """Keeps every entry of every model's log as it is appended (see the module docstring)."""

    def __init__(self, cluster: LocalCluster, names: list[str], dim: int) -> None:
        self.cluster = cluster
        self.names = names
        self.dim = dim
        self.log: dict[str, dict[int, tuple[np.ndarray, list[str]]]] = {n: {} for n in names}
        self.rewritten = 0
        self.errors: list[str] = []  # a thread that ended on an unexpected error
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._follow, args=(n,)) for n in names]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)

    def _keep(self, name: str, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        with self._lock:
            for entry_id, fields in entries:
                if b"x" not in fields:
                    continue  # not a sample entry (none in this run: no metric replacement)
                rows, labels = decode_entry(fields, self.dim)
                seq = parse_id(entry_id)[0]
                old = self.log[name].get(seq)
                if old is not None and (old[1] != labels or not np.array_equal(old[0], rows)):
                    self.rewritten += 1
                self.log[name][seq] = (rows, labels)

    def _follow(self, name: str) -> None:
        try:
            self._loop(name)
        except Exception as exc:  # surfaced by run(): the recording is incomplete
            self.errors.append(f"{name}: {exc!r}")
            raise

    def _loop(self, name: str) -> None:
        key = ModelKeys(name).log
        last = "0-0"
        client: RedisCluster | None = None
        while not self.stop.is_set():
            try:
                if client is None:
                    client = cluster_client(self.cluster)
                got: Any = client.xread({key: last}, count=1000, block=500)
            except CLUSTER_ERRORS:
                # a failover under way: a new client finds the new master
                with contextlib.suppress(Exception):
                    if client is not None:
                        client.close()
                client = None
                self.stop.wait(0.1)
                continue
            for _, entries in got or []:
                self._keep(name, entries)
                last = entries[-1][0].decode()
        if client is not None:
            client.close()

    def final(self) -> None:
        """What is left of each log in Redis now (the last word on every entry in it)."""
        client = cluster_client(self.cluster, 10.0)
        try:
            for name in self.names:
                self._keep(name, client.xrange(ModelKeys(name).log))  # type: ignore[arg-type]
        finally:
            client.close()


class OwnerWatch:
    """Polls every model's lease holder and keeps each change: (when, model, holder)."""

    def __init__(self, cluster: LocalCluster, names: list[str]) -> None:
        self.cluster = cluster
        self.names = names
        self.changes: list[tuple[float, str, str | None]] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._poll)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join(30)

    def _poll(self) -> None:
        last: dict[str, str | None] = {}
        client: RedisCluster | None = None
        while not self.stop.wait(0.1):
            try:
                if client is None:
                    client = cluster_client(self.cluster)
                for name in self.names:
                    raw: Any = client.get(ModelKeys(name).lease)
                    holder = None if raw is None else raw.decode().split(" ", 1)[1]
                    if name not in last or last[name] != holder:
                        self.changes.append((time.monotonic(), name, holder))
                        last[name] = holder
            except CLUSTER_ERRORS:
                with contextlib.suppress(Exception):
                    if client is not None:
                        client.close()
                client = None
        if client is not None:
            client.close()

    def moves(self, name: str, start: float, end: float) -> int:
        """Times ``name`` went to another process within [start, end] (a release in between,
        no holder for a moment, is not a move by itself)."""
        holder: str | None = None
        moved = 0
        for t, model, who in self.changes:
            if model != name or who is None:
                continue
            if start <= t <= end and holder is not None and who != holder:
                moved += 1
            holder = who
        return moved


class Nemesis:
    """Injects the scheduled faults one at a time (see the module docstring)."""

    def __init__(self, harness: Harness, workload: Workload) -> None:
        self.harness = harness
        self.workload = workload
        self.faults: list[Fault] = []

    def run(self) -> None:
        config = self.harness.config
        wait_until("every model acknowledged once", lambda: self.workload.acked_since(0.0))
        for kind, target, quiet in config.schedule():
            fault = getattr(self, kind)(target)
            self.faults.append(fault)
            self.acked_after(f"every model acknowledged after {kind}", fault.end)
            fault.end = time.monotonic()
            time.sleep(quiet)  # a seeded gap of normal operation between faults

    def acked_after(self, what: str, t: float) -> None:
        def acked() -> bool:
            if self.workload.failures:
                raise AssertionError(f"the clients failed: {self.workload.failures}")
            return self.workload.acked_since(t)

        wait_until(what, acked)

    def _fault(self, kind: str, target: str) -> Fault:
        fault = Fault(kind, target, time.monotonic())
        fault.detail["owners"] = self.owners()
        return fault

    def owners(self) -> dict[str, str | None]:
        """Each model's lease holder now (a process's URL), None if nobody holds it."""
        try:
            client = cluster_client(self.harness.cluster)
        except CLUSTER_ERRORS:
            return {}
        try:
            out: dict[str, str | None] = {}
            for name in self.workload.names:
                raw: Any = client.get(ModelKeys(name).lease)
                out[name] = None if raw is None else raw.decode().split(" ", 1)[1]
            return out
        except CLUSTER_ERRORS:
            return {}
        finally:
            client.close()

    def service_kill(self, target: int) -> Fault:
        svc = self.harness.services[target]
        fault = self._fault("service_kill", svc.url)
        svc.kill()
        # the other processes take its models over (lease TTL, then a placement round)
        self.acked_after("the models served without the killed process", fault.start)
        fault.detail["served_again_s"] = time.monotonic() - fault.start
        self.harness.start_service(svc)
        fault.end = time.monotonic()
        return fault

    def service_pause(self, target: int) -> Fault:
        svc = self.harness.services[target]
        fault = self._fault("service_pause", svc.url)
        svc.pause()
        paused_for = self.harness.config.lease_ttl_s + 1.5
        time.sleep(paused_for)  # the fault itself: frozen past its lease
        svc.resume()
        fault.detail["paused_s"] = paused_for
        svc.wait_ready(RECOVERY_TIMEOUT_S)
        fault.end = time.monotonic()
        return fault

    def redis_master_kill(self, target: int) -> Fault:
        cluster = self.harness.cluster
        name = self.workload.names[target]
        master = cluster.master_of(ModelKeys(name).meta)
        fault = self._fault("redis_master_kill", master.name)
        fault.detail["model"] = name
        replica = cluster.replica_of(master)
        master.kill()

        def promoted() -> bool:
            try:
                return replica.is_master()
            except redis.RedisError:
                return False

        wait_until(f"{replica.name} to take over by itself", promoted)
        fault.detail["failover_s"] = time.monotonic() - fault.start
        self.harness.restart_node(master)  # rejoins as the new master's replica
        cluster.wait_healthy(RECOVERY_TIMEOUT_S)
        fault.end = time.monotonic()
        return fault

    def rolling_restart(self, target: int) -> Fault:
        services = self.harness.services
        fault = self._fault("rolling_restart", "all")
        for k in range(len(services)):
            svc = services[(target + k) % len(services)]
            t0 = time.monotonic()
            owners = self.owners()
            svc.stop()
            self.harness.start_service(svc)
            self.acked_after("every model acknowledged after a process came back",
                             time.monotonic())  # fmt: skip
            fault.detail.setdefault("steps", []).append(
                {"process": svc.url, "owners": owners, "t0": t0, "t1": time.monotonic()}
            )
        fault.detail["owners_after"] = self.owners()
        fault.end = time.monotonic()
        return fault

    def full_restart(self, target: int) -> Fault:
        fault = self._fault("full_restart", "all")
        for svc in self.harness.services:
            svc.kill()
        for svc in self.harness.services:
            svc.spawn()
        for svc in self.harness.services:
            svc.wait_ready(RECOVERY_TIMEOUT_S)
            self.harness.pids.append(svc.pid)
        fault.end = time.monotonic()
        return fault


def served_metrics(
    harness: Harness, names: list[str], versions: dict[str, int]
) -> dict[str, list[tuple[str, int, np.ndarray | None]]]:
    """Each model's metric as each process serves it, once it has applied the whole log."""
    out: dict[str, list[tuple[str, int, np.ndarray | None]]] = {n: [] for n in names}
    for svc in harness.services:
        with OPMLClient(svc.url, timeout=30.0) as client:
            for name in names:
                try:
                    snap = client.metric_snapshot(name, min_version=versions[name])
                except OPMLError:  # e.g. the log's length never reached: the checker says so
                    out[name].append((svc.url, -1, None))
                    continue
                out[name].append((svc.url, snap.version, np.asarray(snap.L)))
    return out


def model_documents(harness: Harness, names: list[str]) -> dict[str, str]:
    """Each model's document as the first process that answers gives it (version, logged seq,
    checkpoint, owner): what a checker's finding about the model is read against."""
    docs: dict[str, str] = {}
    for name in names:
        for svc in harness.services:
            try:
                answer = httpx.get(f"{svc.url}/v1/models/{name}", timeout=10)
            except httpx.HTTPError:
                continue
            doc = answer.json() if answer.status_code == 200 else {}
            keep = ("version", "logged_seq", "checkpoint", "owner", "staleness_s")
            docs[name] = json.dumps({k: doc.get(k) for k in keep} | {"via": svc.url})
            break
    return docs


#: A traceback's exception line (``redis.exceptions.ConnectionError: ...``).
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*")


#: A traceback's frame in the service's own code.
SERVICE_FRAME = re.compile(r'File ".*?/(service/[\w/]+\.py)", line (\d+), in (\w+)')


def server_error_lines(harness: Harness) -> list[str]:
    """The unhandled errors in the services' logs (what a 500 came from): each one's log
    line and the exception lines of its traceback (chained ones included)."""
    found: list[str] = []
    for svc in harness.services:
        try:
            lines = svc.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            if "unhandled error" not in line:
                continue
            block = lines[i + 1 : i + 160]
            raised = [t for t in block if EXCEPTION_LINE.match(t)]
            where = [f"{m[1]}:{m[2]} {m[3]}" for t in block
                     if (m := SERVICE_FRAME.search(t))]  # fmt: skip
            chain = " <- ".join(t[:300] for t in reversed(raised[:6]))
            found.append(f"{svc.log_path.name}: {line.strip()[:200]} | {chain} | "
                         f"service frames: {where[-8:]}")  # fmt: skip
    return found[:50]


def run(config: Config, root: Path | None = None, harness: Harness | None = None) -> Outcome:
    """One chaos run (see the module docstring) in ``root`` (a temporary dir if None), or with
    ``harness``, not yet started (its owner closes it too, e.g. a test fixture); every process
    is ended before it returns, whatever happens."""
    names = [f"chaos-{k}" for k in range(config.models)]
    with contextlib.ExitStack() as stack:
        if harness is None:
            if root is None:
                root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opml-chaos-")))
            harness = Harness(root, config)
        stack.callback(harness.close)
        harness.start()
        with OPMLClient(harness.services[0].url, timeout=30.0) as client:
            for k, name in enumerate(names):
                client.create_model(name, config.dim, gamma=0.05, seed=k)
        workload = Workload(harness, names, stream_len=config.samples)
        recorder = Recorder(harness.cluster, names, config.dim)
        nemesis = Nemesis(harness, workload)
        owners = OwnerWatch(harness.cluster, names)
        started = time.monotonic()
        recorder.start()
        owners.start()
        workload.start()
        try:
            nemesis.run()
        finally:
            workload.join()
            recorder.join()
            owners.join()
        ended = time.monotonic()
        if workload.failures or recorder.errors:
            raise AssertionError(f"the clients or the recorder failed: {workload.failures} "
                                 f"{recorder.errors}")  # fmt: skip
        harness.cluster.wait_healthy(RECOVERY_TIMEOUT_S)
        recorder.final()
        versions = {n: max(recorder.log[n], default=0) for n in names}
        served = served_metrics(harness, names, versions)
        documents = model_documents(harness, names)
        excerpts = server_error_lines(harness)
        pids = list(harness.pids)
        harness.close()
    return Outcome(
        config, names, workload.streams, workload.acks, nemesis.faults, workload.server_errors,
        workload.statuses, workload.reads, owners, recorder.log, recorder.rewritten, served,
        pids, excerpts, documents, started, ended,
    )  # fmt: skip


def config_of(outcome: Outcome, index: int) -> LearnerConfig:
    return LearnerConfig(dim=outcome.config.dim, gamma=0.05, seed=index)


#: Problems listed per model (one lost entry puts every later batch out of place).
PROBLEMS_SHOWN = 8


def check_model(outcome: Outcome, k: int, name: str) -> list[str]:
    """The violations found in model ``name`` (the ``k``-th) of ``outcome``.

    An entry the recorder never saw (trimmed behind a checkpoint before its next read, which
    only a stall of the recorder allows) is taken from the acknowledgement that covers its seqs
    and marked unrecorded: the served L, which must equal the replay exactly, then vouches for
    it (a lost or different entry cannot give the same L). Seqs that no acknowledgement covers
    and the recorder never saw are a violation: nothing can vouch for them."""
    problems: list[str] = []
    X, y = outcome.streams[name]
    index = {X[i].tobytes(): i for i in range(len(y))}
    by_seq: dict[int, int] = {}  # seq -> sample index (-1: a sample never sent)
    for last, (block, keys) in outcome.log[name].items():
        for j, row in enumerate(block):
            by_seq[last - len(keys) + 1 + j] = index.get(row.tobytes(), -1)
    acks = [a for a in outcome.acks if a.model == name]
    logged_seq = max([*by_seq, *(a.last_seq for a in acks)], default=0)
    unrecorded = 0
    for ack in acks:
        if ack.last_seq - ack.first_seq + 1 != ack.hi - ack.lo:
            problems.append(f"{name}: batch {ack.lo} acknowledged with seqs "
                            f"{ack.first_seq}..{ack.last_seq}")  # fmt: skip
            continue
        seqs = range(ack.first_seq, ack.last_seq + 1)
        if all(s not in by_seq for s in seqs):
            unrecorded += 1  # vouched for by the replay below
            by_seq.update(zip(seqs, range(ack.lo, ack.hi), strict=True))
    missing = [s for s in range(1, logged_seq + 1) if s not in by_seq]
    if missing:
        problems.append(f"{name}: seqs {missing[:8]}{'...' if len(missing) > 8 else ''} "
                        f"({len(missing)}) are in no entry and no acknowledgement")  # fmt: skip
    logged = [by_seq.get(s, -1) for s in range(1, logged_seq + 1)]
    if -1 in logged:
        problems.append(f"{name}: seq {logged.index(-1) + 1} holds no sample that was sent")
    seen: dict[int, int] = {}
    for seq, i in enumerate(logged, start=1):
        if i >= 0 and i in seen:
            problems.append(f"{name}: sample {i} logged twice, seqs {seen[i]} and {seq}")
        seen[i] = seq
    for ack in acks:
        got = logged[ack.first_seq - 1 : ack.last_seq]
        if got != list(range(ack.lo, ack.hi)):
            problems.append(f"{name}: batch {ack.lo} acknowledged at seqs {ack.first_seq}.."
                            f"{ack.last_seq}, the log holds samples {got} there")  # fmt: skip
    labels = [y[i] for i in logged if i >= 0]
    rows = X[[i for i in logged if i >= 0]]
    learner = Learner(config_of(outcome, k))
    if len(rows):
        learner.learn_many(rows, labels)
    for via, version, L in outcome.served[name]:
        if version < 0:
            problems.append(f"{name}: {via} did not serve version {logged_seq} (the log's length)")
        elif version != logged_seq:
            problems.append(f"{name}: {via} serves version {version}, the log has {logged_seq} "
                            f"(last entries {sorted(outcome.log[name])[-3:]}, last acknowledged "
                            f"seqs {[(a.first_seq, a.last_seq) for a in acks[-2:]]}; the model: "
                            f"{outcome.documents.get(name)})")  # fmt: skip
        elif L is None or not np.array_equal(L, learner.L):
            diff = "no L" if L is None else f"max |diff| {np.abs(L - learner.L).max():.3g}"
            if unrecorded:  # the acknowledged entries nobody saw are not what it learned
                diff += f"; {unrecorded} acknowledged entries never seen in the log: lost"
            problems.append(f"{name}: {via} serves an L that is not the log's replay ({diff})")
    outcome.unrecorded[name] = unrecorded
    return problems


def check(outcome: Outcome) -> list[str]:
    """Every violation of the promises (none: the run kept them). See the module docstring."""
    problems: list[str] = []
    for k, name in enumerate(outcome.names):
        found = check_model(outcome, k, name)
        problems += found[:PROBLEMS_SHOWN]
        if len(found) > PROBLEMS_SHOWN:
            problems.append(f"{name}: and {len(found) - PROBLEMS_SHOWN} more")
    if outcome.server_errors:
        problems.append(f"{len(outcome.server_errors)} answers were 500: "
                        f"{[text for _, text in outcome.server_errors[:5]]}; the services' logs: "
                        f"{outcome.log_excerpts[:5]}")  # fmt: skip
    still = [pid for pid in outcome.pids if alive(pid)]
    if still:
        problems.append(f"processes still running after the run: {still}")
    return problems


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    arr = np.asarray(values)
    return {
        "n": len(values),
        "p50": round(float(np.quantile(arr, 0.5)), 3),
        "p99": round(float(np.quantile(arr, 0.99)), 3),
        "max": round(float(arr.max()), 3),
    }


def unavailability(acks: list[float], start: float, end: float) -> float:
    """The longest stretch without an acknowledgement overlapping [start, end], counted from
    ``start`` at the earliest (``acks``: sorted acknowledgement times)."""
    longest = 0.0
    before = start
    for t in acks:
        if t < start:
            continue
        longest = max(longest, t - before)
        before = t
        if t > end:
            break
    return longest


def gaps_longer(acks: list[float], start: float, end: float, floor: float) -> list[float]:
    """Stretches without an acknowledgement longer than ``floor`` within [start, end]."""
    out: list[float] = []
    before = start
    for t in acks:
        if t < start:
            continue
        if t - before > floor:
            out.append(t - before)
        before = t
        if t > end:
            break
    return out


#: A stretch without an acknowledgement longer than this is an interruption (the writers'
#: ordinary gap is one acknowledgement's latency, tens of milliseconds).
INTERRUPTION_S = 0.5


def measure(outcome: Outcome) -> dict[str, Any]:
    """Per fault kind, per (fault, model): how long ingestion (acknowledgements) and queries
    (served metric reads) were unavailable, for every model and for the models the faulted
    process held; their interruptions; the model's moves between processes; the latency of the
    acknowledgements in the faults' windows; 500s."""
    config = outcome.config
    acks = {n: sorted(a.acked for a in outcome.acks if a.model == n) for n in outcome.names}
    reads = {n: sorted(outcome.reads[n]) for n in outcome.names}
    by_kind: dict[str, dict[str, Any]] = {}
    for fault in outcome.faults:
        e = by_kind.setdefault(fault.kind, {"faults": 0, "details": [], "server_errors": 0,
                                            "latency": []})  # fmt: skip
        e["faults"] += 1
        owners = fault.detail.get("owners", {})
        detail = {k: v for k, v in fault.detail.items() if k not in ("owners", "owners_after")}
        detail |= {"target": fault.target, "duration_s": round(fault.end - fault.start, 3)}
        if "steps" in detail:
            detail["steps"] = [
                {"process": st["process"], "start_s": round(st["t0"] - fault.start, 3),
                 "back_s": round(st["t1"] - st["t0"], 3)} for st in detail["steps"]
            ]  # fmt: skip
        e["details"].append(detail)
        for name in outcome.names:
            held = owners.get(name) == fault.target
            for what, times in (("ingest", acks[name]), ("query", reads[name])):
                gap = unavailability(times, fault.start, fault.end)
                cuts = gaps_longer(times, fault.start, fault.end, INTERRUPTION_S)
                e.setdefault(f"{what}_unavailable", []).append(gap)
                e.setdefault(f"{what}_interruptions", []).append(float(len(cuts)))
                e.setdefault(f"{what}_interruption_s", []).extend(cuts)
                if held:
                    e.setdefault(f"{what}_unavailable_held", []).append(gap)
            e.setdefault("moves", []).append(
                float(outcome.owners.moves(name, fault.start, fault.end))
            )
        e["latency"] += [a.acked - a.sent for a in outcome.acks
                         if fault.start <= a.acked <= fault.end]  # fmt: skip
        e["server_errors"] += sum(fault.start <= t <= fault.end
                                  for t, _ in outcome.server_errors)  # fmt: skip
    quiet = [
        a.acked - a.sent
        for a in outcome.acks
        if not any(f.start <= a.acked <= f.end for f in outcome.faults)
    ]
    kinds: dict[str, Any] = {}
    for kind, e in by_kind.items():
        kinds[kind] = {"faults": e["faults"], "server_errors": e["server_errors"],
                       "ack_latency_s": quantiles(e["latency"])}  # fmt: skip
        for key in ("ingest_unavailable", "query_unavailable", "ingest_unavailable_held",
                    "query_unavailable_held", "ingest_interruptions", "query_interruptions",
                    "ingest_interruption_s", "query_interruption_s", "moves"):  # fmt: skip
            kinds[kind][key] = quantiles(e.get(key, []))
        kinds[kind]["details"] = e["details"]
    return {
        "kinds": kinds,
        # a dead owner's leases and heartbeat expire within the TTL; the survivors' next
        # placement round (every third of the TTL) takes its models
        "lease_ttl_plus_round_s": round(config.lease_ttl_s * 4 / 3, 3),
        "ack_latency_without_fault_s": quantiles(quiet),
        "acknowledged_batches": len(outcome.acks),
        "acknowledged_samples": sum(a.hi - a.lo for a in outcome.acks),
        "served_reads": sum(len(r) for r in outcome.reads.values()),
        "statuses": outcome.statuses,
        "server_errors": len(outcome.server_errors),
        "rewritten_entries": outcome.rewritten,
        "unrecorded_entries": sum(outcome.unrecorded.values()),
        "duration_s": round(outcome.ended - outcome.started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.engine", description=__doc__)
    defaults = Config()
    for name in ("seed", "faults", "services", "masters", "models"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    args = parser.parse_args(argv)
    config = Config(**{k: v for k, v in vars(args).items()})
    outcome = run(config)
    problems = check(outcome)
    print(json.dumps({"config": asdict(config), "measured": measure(outcome),
                      "problems": problems}, indent=1))  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
