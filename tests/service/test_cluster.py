"""Redis Cluster (the storage half), on a real local cluster of 3 masters with one
replica each (:mod:`tests.service.cluster`), shared by the tests of this module and emptied
before each: the service on any node, WAIT for replicas through a failover, the model index
repaired.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from redis.cluster import RedisCluster as SyncCluster
from redis.crc import key_slot
from websockets.sync.client import connect

from service.core import LearnerConfig
from service.storage.codec import decode_entry, parse_id
from service.storage.embedded import free_port
from service.storage.keys import MODEL_INDEX, ModelKeys
from service.storage.store import Appended, Group, NotReplicated, Store, connect_cluster
from tests.service.cluster import LocalCluster, Node, wait_for
from tests.service.support import ServiceProcess, assert_problem, core_learner, make_model, stream


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    yield local
    local.stop()


@pytest.fixture
def fresh(cluster: LocalCluster) -> LocalCluster:
    """The shared cluster with every node up, healthy, and no keys."""
    cluster.heal()
    cluster.flush()
    return cluster


@pytest.fixture
def rc(fresh: LocalCluster) -> Iterator[SyncCluster]:
    """A cluster client of the test's own, to look at what the service stored."""
    client = SyncCluster.from_url(fresh.masters()[0].url)
    yield client
    client.close()


def name_on(cluster: LocalCluster, avoid: set[str], prefix: str) -> str:
    """A model name whose slot is served by none of the masters named in ``avoid``."""
    return next(
        f"{prefix}{i}"
        for i in range(1000)
        if cluster.master_of(ModelKeys(f"{prefix}{i}").meta).name not in avoid
    )


def failover_placement(cluster: LocalCluster, prefix: str) -> tuple[Node, Node, str, Node, Node]:
    """For a failover test: the master holding the model index, the master the services are
    pointed at, a model name whose slot is served by neither (so killing its master leaves
    both up), that master and its replica."""
    index_master = cluster.master_of(MODEL_INDEX)
    url_node = next(m for m in cluster.masters() if m.name != index_master.name)
    name = name_on(cluster, {index_master.name, url_node.name}, prefix)
    master = cluster.master_of(ModelKeys(name).meta)
    return index_master, url_node, name, master, cluster.replica_of(master)


def logged_once(
    rc: SyncCluster,
    name: str,
    X: np.ndarray,
    y: list[str],
    acked: dict[int, int],
    gapless: bool = False,
) -> tuple[list[np.ndarray], list[str]]:
    """The model's log as rows and labels, asserting every acknowledged sample (index -> seq)
    is there at its seq (an entry's id is the seq of its last sample), none twice, and with
    ``gapless`` that the seqs have no gap. A hand-over checkpoints and trims the log's head:
    an acknowledged seq before the first one logged is covered by that checkpoint."""
    log: list[tuple[bytes, dict[bytes, bytes]]] = rc.xrange(ModelKeys(name).log)  # type: ignore[assignment]
    rows: list[np.ndarray] = []
    labels: list[str] = []
    at: dict[int, int] = {}  # seq -> position in rows
    for entry_id, fields in log:
        block, keys = decode_entry(fields, 3)
        last = parse_id(entry_id)[0]
        if gapless:
            assert last == len(labels) + len(keys)
        for k in range(len(keys)):
            at[last - len(keys) + 1 + k] = len(rows) + k
        rows.extend(block)
        labels.extend(keys)
    first = min(at, default=1)
    for i, seq in acked.items():
        if seq < first and not gapless:
            continue  # trimmed after a checkpoint that holds it
        assert seq in at, f"acknowledged seq {seq} is not in the log"
        np.testing.assert_array_equal(rows[at[seq]], X[i])
        assert labels[at[seq]] == y[i]
    index = {X[i].tobytes(): i for i in range(len(y))}
    logged = [index[row.tobytes()] for row in rows]
    assert len(set(logged)) == len(logged)
    return rows, labels


#: Replicas awaited, and the whole log kept to compare with.
FAILOVER_ENV = {
    "OPML_REDIS_WAIT_REPLICAS": "1",
    "OPML_CHECKPOINT_EVERY": "1000000",
    "OPML_CHECKPOINT_INTERVAL_S": "3600",
}


def model_keys_everywhere(cluster: LocalCluster, name: str) -> list[bytes]:
    return [k for keys in cluster.keys(f"opml:{{{name}}}:*").values() for k in keys]


# -- the store itself ---------------------------------------------------------------------------


def test_the_store_works_through_any_node_even_a_replica(fresh: LocalCluster) -> None:
    replica = fresh.replica_of(fresh.master_of(MODEL_INDEX))

    async def scenario() -> None:
        store = Store.connect(replica.url, 2.0)
        await store.open()  # INFO cluster says cluster_enabled:1
        assert store.cluster
        assert await store.create_model("m", {"dim": 1}, 1.0)
        assert not await store.create_model("m", {"dim": 1}, 2.0)  # exists
        assert await store.model_exists("m") and not await store.model_exists("none")
        group = Group(np.float64(3.0).tobytes(), ["a"], "h:k", "fp")
        (appended,) = await store.append_groups("m", [group], now_ms=0, ttl_ms=60_000,
                                                max_classes=10)  # fmt: skip
        assert isinstance(appended, Appended)
        assert (appended.first_seq, appended.last_seq, appended.replayed) == (1, 1, False)
        # a script within the model's slot
        tail = await store.read_tail("m", "0-0", 10, applied=0, created_at="1.0")
        assert [entry for entry, _ in tail.entries] == [(1, 1)]
        ours, token = await store.claim_lease("m", "me", 60_000, "1.0", None)
        assert ours and token == 1
        assert await store.write_checkpoint("m", {"meta": b"{}", "applied": b"1-1"},
                                            {"a": b"x"}, applied=(1, 1), created_at="1.0",
                                            trim_min_id="1-2",
                                            fencing_token=1)  # fmt: skip
        assert await store.read_checkpoint("m") == ({"meta": b"{}", "applied": b"1-1"},
                                                    {"a": b"x"})  # fmt: skip
        tail = await store.read_tail("m", "1-2", 10, applied=0, created_at="1.0")
        assert tail.checkpoint_applied == (1, 1)
        # across slots: one non-transactional pipeline, split by the client
        names = ["m", *(f"other{i}" for i in range(8))]
        assert len({key_slot(ModelKeys(n).meta.encode()) for n in names}) == len(names)
        assert await store.created_stamps(names) == {"m": "1.0"} | dict.fromkeys(names[1:])
        assert await store.model_names() == ["m"]
        await store.delete_model("m")
        assert not await store.model_exists("m") and await store.model_names() == []
        await store.aclose()

    asyncio.run(scenario())
    wait_for("replicas to drop the deleted keys", lambda: not model_keys_everywhere(fresh, "m"))


def test_cluster_failures_are_redis_errors() -> None:
    async def scenario() -> None:
        client = connect_cluster("redis://127.0.0.1:1/0", 0.5)  # nothing listens there
        with pytest.raises(redis.RedisError, match="cannot be connected"):
            await client.ping()
        await client.aclose()

    asyncio.run(scenario())
    with pytest.raises(redis.RedisError, match=r"OPML_REDIS_URL names a cluster node: .* 'db'"):
        connect_cluster("redis://127.0.0.1:1/3", 0.5)  # a cluster has database 0 only


def test_wait_counts_the_replicas_that_have_this_very_append(fresh: LocalCluster) -> None:
    """WAIT runs on the append's own connection: with the replica paused (SIGSTOP) it cannot
    confirm it (a WAIT on another connection would count the replica at once), and the writers
    see nothing of the unconfirmed entry until a confirmed append covers it."""
    name = "w"
    master = fresh.master_of(ModelKeys(name).meta)
    replica = fresh.replica_of(master)
    group = Group(np.float64(1.0).tobytes(), ["a"], "h:key-1", "fp")

    async def scenario() -> None:
        store = Store.connect(master.url, 2.0, wait_replicas=1)
        await store.open()
        assert await store.create_model(name, {"dim": 1}, 1.0)
        assert replica.proc is not None
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated, match="0 of 1 confirmed"):
                await store.append_groups(name, [group], now_ms=0, ttl_ms=60_000, max_classes=9)
            assert master.client().xlen(ModelKeys(name).log) == 1  # in the master ...
            assert (
                await store.read_tail(name, "0-0", 10, applied=0, created_at="1.0")
            ).entries == []  # ... not readable
            assert await store.logged_seq(name) == 0
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        # the client retries with the same idempotency key: a replay, now confirmed
        (again,) = await store.append_groups(name, [group], now_ms=0, ttl_ms=60_000, max_classes=9)
        assert isinstance(again, Appended)
        assert (again.first_seq, again.last_seq, again.replayed) == (1, 1, True)
        assert [
            e
            for e, _ in (
                await store.read_tail(name, "0-0", 10, applied=0, created_at="1.0")
            ).entries
        ] == [(1, 1)]
        assert await store.logged_seq(name) == 1
        await store.aclose()

    asyncio.run(scenario())


def test_appends_follow_a_slot_that_moved_to_another_master(fresh: LocalCluster) -> None:
    """Resharding: the model's slot moves to another master while a store holds the old slot
    map; its next appends get MOVED and follow it, with and without WAIT (and a script cache
    flushed meanwhile is reloaded)."""
    name = "moving"
    meta = ModelKeys(name).meta
    source = fresh.master_of(meta)
    target = next(m for m in fresh.masters() if m.name != source.name)

    def group(i: int) -> Group:
        return Group(np.float64(i).tobytes(), ["a"], f"h:{i}", "fp")

    async def scenario() -> None:
        plain = Store.connect(source.url, 2.0)
        waiting = Store.connect(source.url, 2.0, wait_replicas=1)
        for store in (plain, waiting):
            await store.open()
        assert await plain.create_model(name, {"dim": 1}, 1.0)
        for i, store in enumerate((plain, waiting)):
            await store.append_groups(name, [group(i)], now_ms=0, ttl_ms=60_000, max_classes=9)
        fresh.migrate(key_slot(meta.encode()), target)
        target.client().script_flush()
        for i, store in enumerate((waiting, plain), start=2):  # both still think: source
            (appended,) = await store.append_groups(name, [group(i)], now_ms=0, ttl_ms=60_000,
                                                    max_classes=9)  # fmt: skip
            assert isinstance(appended, Appended) and appended.first_seq == i + 1
        # the waiting store reads up to what WAIT confirmed: not the plain store's last append
        tail = await waiting.read_tail(name, "0-0", 10, applied=0, created_at="1.0")
        assert [entry for entry, _ in tail.entries] == [(1, 1), (2, 1), (3, 1)]
        for store in (plain, waiting):
            await store.aclose()

    asyncio.run(scenario())
    assert fresh.master_of(meta).name == target.name
    assert target.client().xlen(ModelKeys(name).log) == 4 and not source.client().keys("opml:*")


# -- the service ----------------------------------------------------------------------------------


def test_a_service_on_a_node_without_the_model_index_slot(
    fresh: LocalCluster, tmp_path: Path
) -> None:
    index_master = fresh.master_of(MODEL_INDEX)
    node = next(m for m in fresh.masters() if m.name != index_master.name)
    name = name_on(fresh, {node.name}, "m")  # its keys are on yet another master: MOVED
    X, y = stream(160, 4, 3, seed=13)
    acked: list[int] = []  # sample indexes in seq order
    svc = ServiceProcess(tmp_path, node.url, OPML_CHECKPOINT_EVERY="50").start()  # /readyz 200
    try:
        with svc.client() as api:
            make_model(api, name, 4, gamma=0.05, seed=2)
            for i in range(40):  # REST, one sample a request
                sent = api.post(f"/v1/models/{name}/samples", json={"x": X[i].tolist(), "y": y[i]})
                assert sent.status_code == 202 and sent.json()["first_seq"] == i + 1
                acked.append(i)
            with connect(f"{svc.ws_url}/v1/models/{name}/stream") as ws:  # WebSocket frames
                for k in range(40, 100, 10):
                    samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 10)]
                    ws.send(json.dumps({"id": k, "samples": samples}))
                for k in range(40, 100, 10):
                    assert json.loads(ws.recv(timeout=30)) == {
                        "ack": k, "first_seq": k + 1, "last_seq": k + 10,
                    }  # fmt: skip
                    acked.extend(range(k, k + 10))
            before = api.get(f"/v1/models/{name}/metric", params={"min_version": 100}).json()
            ref = core_learner(X[acked], [y[i] for i in acked], dim=4, gamma=0.05, seed=2)
            one = api.post(f"/v1/models/{name}/distance",
                           json={"a": X[0].tolist(), "b": X[1].tolist()}).json()  # fmt: skip
            assert one["squared_distance"] == pytest.approx(ref.squared_distance(X[0], X[1]),
                                                            rel=1e-12)  # fmt: skip
        svc.stop()  # graceful: final checkpoint into the model's master
        svc.start()
        with svc.client() as api:
            assert api.get(f"/v1/models/{name}/metric").json() == before
            for i in range(100, 130):
                api.post(f"/v1/models/{name}/samples", json={"x": X[i].tolist(), "y": y[i]})
                acked.append(i)
        svc.kill()  # crash: the checkpoint and the log tail in the cluster
        svc.start()
        with svc.client() as api:
            got = api.get(f"/v1/models/{name}/metric", params={"min_version": 130}).json()
            ref = core_learner(X[acked], [y[i] for i in acked], dim=4, gamma=0.05, seed=2)
            assert got["version"] == 130
            np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
            assert model_keys_everywhere(fresh, name)  # on its master and its replica
            assert api.delete(f"/v1/models/{name}").status_code == 204
            assert_problem(api.get(f"/v1/models/{name}"), 404)
        wait_for("no key of the model on any node", lambda: not model_keys_everywhere(fresh, name))
        assert not index_master.client().sismember(MODEL_INDEX, name)  # another slot
    finally:
        svc.close()


def test_acknowledged_samples_survive_a_failover(
    fresh: LocalCluster, rc: SyncCluster, tmp_path: Path
) -> None:
    """OPML_REDIS_WAIT_REPLICAS=1: a client streams samples (retrying 503s with the same
    Idempotency-Key) while the master of the model's slot is killed (-9); its replica takes
    over and the old master comes back as a replica. Every acknowledged sample is in the log,
    once, and the model equals the core learner on the log."""
    _, url_node, name, master, replica = failover_placement(fresh, "w")
    X, y = stream(5000, 3, 3, seed=17)
    svc = ServiceProcess(tmp_path, url_node.url, **FAILOVER_ENV).start()
    acked: dict[int, int] = {}  # sample index -> its seq
    refusals: list[httpx.Response] = []
    stop = threading.Event()

    def sender() -> None:
        with svc.client() as api:
            for i in range(len(y)):
                while not stop.is_set():
                    sent = api.post(
                        f"/v1/models/{name}/samples",
                        json={"x": X[i].tolist(), "y": y[i]},
                        headers={"Idempotency-Key": f"s{i}"},
                    )
                    if sent.status_code == 202:
                        acked[i] = sent.json()["first_seq"]
                        break
                    refusals.append(sent)
                    stop.wait(0.1)  # pacing of the retries, as Retry-After asks
                if stop.is_set():
                    return

    thread = threading.Thread(target=sender, daemon=True)
    try:
        with svc.client() as api:
            make_model(api, name, 3, gamma=0.05)
        thread.start()
        wait_for("40 acknowledged samples", lambda: len(acked) >= 40)
        master.kill()
        wait_for("503s while the master is down", lambda: refusals)
        fresh.failover(replica)
        # the new master has no replica yet: WAIT cannot confirm, appends are refused
        wait_for("a 503 for want of a replica", lambda: any(
            "OPML_REDIS_WAIT_REPLICAS" in r.json()["detail"] for r in refusals
        ))  # fmt: skip
        fresh.restart(master)  # comes back as the new master's replica
        fresh.wait_healthy()
        recovered = len(acked)
        wait_for("ingestion to resume by itself", lambda: len(acked) >= recovered + 40)
    finally:
        stop.set()
        thread.join(60)
    try:
        for refusal in refusals:
            assert_problem(refusal, 503)
            assert int(refusal.headers["Retry-After"]) >= 1
        rows, labels = logged_once(rc, name, X, y, acked, gapless=True)
        with svc.client() as api:
            got = api.get(f"/v1/models/{name}/metric", params={"min_version": len(rows)}).json()
        ref = core_learner(np.array(rows), labels, dim=3, gamma=0.05)
        assert got["version"] == len(rows)
        np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
    finally:
        svc.stop()


def test_start_up_repairs_the_model_index(
    fresh: LocalCluster, rc: SyncCluster, tmp_path: Path
) -> None:
    """A model index name without a meta (a create that died after the index, or a delete before
    it) is not a model and is removed; a meta whose name is missing (a create that died between
    its two steps) is a model and is indexed again."""
    rc.sadd(MODEL_INDEX, "ghost")
    config: dict[str, Any] = asdict(LearnerConfig(dim=2))
    meta = {"config": json.dumps(config), "seq": "0", "puts": "0", "created_at": "1.0"}
    rc.hset(ModelKeys("orphan").meta, mapping=meta)
    svc = ServiceProcess(tmp_path, fresh.masters()[-1].url).start()
    try:
        with svc.client() as api:
            assert [m["name"] for m in api.get("/v1/models").json()["models"]] == ["orphan"]
            assert_problem(api.get("/v1/models/ghost"), 404)
            sent = api.post("/v1/models/orphan/samples?wait=true", json={"x": [1, 2], "y": "a"})
            assert sent.status_code == 200
        assert rc.smembers(MODEL_INDEX) == {b"orphan"}
    finally:
        svc.stop()
    text = svc.log_path.read_text()
    assert "'orphan' was missing from the model index" in text
    assert "model index name 'ghost' has no model" in text


def test_a_service_starts_while_one_seed_node_is_up(fresh: LocalCluster, tmp_path: Path) -> None:
    """``OPML_REDIS_URL`` as several seed nodes: the first is down (nothing listens on it), the
    service starts through the next one and serves (a model created, samples learned)."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    seeds = ",".join([dead, *(m.url for m in fresh.masters()[1:])])
    svc = ServiceProcess(tmp_path, seeds, OPML_CHECKPOINT_EVERY="50").start()  # /readyz 200
    try:
        X, y = stream(60, 3, 3, seed=5)
        with svc.client() as api:
            make_model(api, "seeded", 3)
            sent = api.post(
                "/v1/models/seeded/samples",
                json={"samples": [{"x": x.tolist(), "y": c} for x, c in zip(X, y, strict=True)]},
            )
            assert sent.status_code == 202, sent.text
            got = api.get("/v1/models/seeded/metric", params={"min_version": 60})
            assert got.status_code == 200 and got.json()["version"] == 60
    finally:
        svc.stop()


def test_killing_the_models_master_never_answers_500(
    fresh: LocalCluster, rc: SyncCluster, tmp_path: Path
) -> None:
    """Two service processes (so requests go through the model's owner and through a process
    that forwards them), REST ingestion through both and queries through both, while the master
    of the model's slot is killed (-9) and its replica takes over: no answer is a 500 (a 503 with
    Retry-After is fine), ingestion and queries recover by themselves, and every acknowledged
    sample is in the log exactly once."""
    index_master, url_node, name, master, replica = failover_placement(fresh, "k")
    X, y = stream(8000, 3, 3, seed=23)
    env = {**FAILOVER_ENV, "OPML_LEASE_TTL_S": "3"}
    services = [
        ServiceProcess(tmp_path / "a", url_node.url, **env).start(),
        ServiceProcess(tmp_path / "b", index_master.url, **env).start(),
    ]
    answers: list[httpx.Response] = []
    acked: dict[int, int] = {}  # sample index -> its seq
    stop = threading.Event()
    lock = threading.Lock()

    def note(response: httpx.Response) -> None:
        with lock:
            answers.append(response)

    def ingest(svc: ServiceProcess, indices: range) -> None:
        with svc.client(timeout=60) as api:
            for i in indices:
                while not stop.is_set():
                    sent = api.post(
                        f"/v1/models/{name}/samples",
                        json={"x": X[i].tolist(), "y": y[i]},
                        headers={"Idempotency-Key": f"s{i}"},
                    )
                    note(sent)
                    if sent.status_code == 202:
                        with lock:
                            acked[i] = sent.json()["first_seq"]
                        break
                    stop.wait(0.05)
                if stop.is_set():
                    return

    def query(svc: ServiceProcess) -> None:
        with svc.client(timeout=60) as api:
            while not stop.is_set():
                note(api.get(f"/v1/models/{name}/metric"))
                note(api.post(
                    f"/v1/models/{name}/distance", json={"a": [0.0, 1.0, 2.0], "b": [1.0, 0, 0]}
                ))  # fmt: skip
                note(api.get(f"/v1/models/{name}"))
                stop.wait(0.02)

    half = len(y) // 2
    threads = [
        threading.Thread(target=ingest, args=(services[0], range(half)), daemon=True),
        threading.Thread(target=ingest, args=(services[1], range(half, len(y))), daemon=True),
        threading.Thread(target=query, args=(services[0],), daemon=True),
        threading.Thread(target=query, args=(services[1],), daemon=True),
    ]
    try:
        with services[0].client() as api:
            make_model(api, name, 3, gamma=0.05)
        for thread in threads:
            thread.start()
        wait_for("80 acknowledged samples", lambda: len(acked) >= 80)
        master.kill()
        wait_for("503s while the master is down", lambda: any(
            a.status_code == 503 for a in list(answers)
        ))  # fmt: skip
        fresh.failover(replica)
        fresh.restart(master)  # comes back as the new master's replica
        fresh.wait_healthy()
        recovered = len(acked)
        wait_for("ingestion to resume by itself", lambda: len(acked) >= recovered + 80, 120)
        seen = len(answers)
        wait_for("queries to answer 200 again", lambda: any(
            a.status_code == 200 and a.request.method == "GET" for a in list(answers)[seen:]
        ))  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    try:
        statuses = sorted({a.status_code for a in answers})
        assert 500 not in statuses, [a.text for a in answers if a.status_code == 500][:3]
        assert 503 in statuses and 200 in statuses and 202 in statuses
        for answer in answers:
            if answer.status_code == 503:
                assert_problem(answer, 503)
                assert int(answer.headers["Retry-After"]) >= 1
            else:
                assert answer.status_code in (200, 202), answer.text
        logged_once(rc, name, X, y, acked)
    finally:
        for svc in services:
            svc.stop()
