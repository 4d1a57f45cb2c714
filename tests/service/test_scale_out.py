"""Several service processes on one Redis: each model learned by exactly one of them (rendezvous
placement, leases with fencing), requests forwarded to the owner, hand-over when processes join,
leave or die, and nothing acknowledged lost or applied twice through any of it."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis as AsyncRedis
from websockets.sync.client import connect

from service.engine.membership import rendezvous
from service.storage.store import Fenced, Overtaken, Store
from tests.service.placement import FAST, eventually, lease_holder, member, placed
from tests.service.support import RedisServer, ServiceProcess, core_learner, make_model, stream

D = 3
PARAMS = {"gamma": 0.05, "seed": 1}


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    """Service processes a test starts; every one is stopped afterwards, failed test or not."""
    started: list[ServiceProcess] = []
    yield started
    for svc in started:
        svc.close()


def scrape(svc: ServiceProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{svc.url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def steps_of(metrics: dict[Any, float], name: str) -> float:
    return sum(
        v for (metric, labels), v in metrics.items()
        if metric == "opml_steps_total" and ("model", name) in labels
    )  # fmt: skip


def names_for(candidates: list[str], ids: list[str], newcomer: str, moving: int) -> list[str]:
    """Model names of which exactly ``moving`` go to ``newcomer`` when it joins ``ids``."""
    everyone = sorted([*ids, newcomer])
    to_new = [n for n in candidates if rendezvous(n, everyone) == newcomer]
    staying = [n for n in candidates if rendezvous(n, everyone) != newcomer]
    return sorted(to_new[:moving] + staying[: 6 - moving])


class Feeder:
    """Streams samples into models through several processes in turn (REST batches), keeping
    the acknowledged order of each model; retries a 503 (a hand-over) with its Idempotency-Key."""

    def __init__(self, names: list[str], n: int, seed: int) -> None:
        self.names = names
        self.X, self.y = stream(n, D, 4, seed=seed)
        self.order: dict[str, list[int]] = {name: [] for name in names}
        self.errors: list[str] = []

    def send(
        self, svc: ServiceProcess, name: str, lo: int, hi: int, *others: ServiceProcess
    ) -> None:
        """Send samples ``lo..hi`` through ``svc``, else (it died) through ``others``."""
        body = {"samples": [{"x": self.X[i].tolist(), "y": self.y[i]} for i in range(lo, hi)]}
        key = f"{name}-{lo}"
        deadline = time.monotonic() + 60
        candidates = [svc, *others]
        while True:
            svc = next((p for p in candidates if p.running), svc)
            try:
                answer = httpx.post(
                    f"{svc.url}/v1/models/{name}/samples",
                    json=body, headers={"Idempotency-Key": key}, timeout=30,
                )  # fmt: skip
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code == 202:
                # a retry may replay an append whose first answer was lost (its process died
                # after logging it): it is logged once, at its original seqs
                first = answer.json()["first_seq"]
                if first == len(self.order[name]) + 1:
                    self.order[name] += range(lo, hi)
                elif first > len(self.order[name]):
                    self.errors.append(f"{name}: seq {first} after {len(self.order[name])}")
                return
            if time.monotonic() > deadline:
                self.errors.append(f"{name}: {answer and answer.text}")
                return
            time.sleep(0.1)

    def check(self, via: ServiceProcess) -> None:
        """Every model's L, read through ``via``, equals the core learner on its acked order."""
        assert not self.errors, self.errors
        for name, order in self.order.items():
            ref = core_learner(self.X[order], [self.y[i] for i in order], dim=D, **PARAMS)
            got = httpx.get(
                f"{via.url}/v1/models/{name}/metric",
                params={"min_version": len(order)}, timeout=30,
            ).json()  # fmt: skip
            assert got["version"] == len(order), got
            np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)


def test_fencing_refuses_a_checkpoint_with_an_older_token(own_redis: RedisServer) -> None:
    """The checkpoint script itself, on a real Redis: a stale token never writes."""

    async def scenario() -> None:
        client = AsyncRedis.from_url(own_redis.url)
        store = Store(client)
        assert await store.create_model("f", {"dim": 1}, 1.0)
        assert await store.claim_lease("f", "p1", 60_000, "1.0", None) == (True, 1)
        assert await store.claim_lease("f", "p2", 60_000, "1.0", None) == (False, 1)
        # a restarted p1 (same member id, no token yet) takes its dead incarnation's lease
        assert await store.claim_lease("f", "p1", 60_000, "1.0", None) == (True, 2)
        await client.delete("opml:{f}:lease")  # p1's lease expires (p1 is paused)
        assert await store.claim_lease("f", "p2", 60_000, "1.0", None) == (True, 3)
        args = ("f", {"meta": b"{}", "L": b"L"}, {})
        with pytest.raises(Fenced):  # p1 resumes and tries to save its older state
            await store.write_checkpoint(*args, applied=(0, 0), created_at="1.0",
                                         trim_min_id="0-1", fencing_token=2)  # fmt: skip
        assert await client.hget("opml:{f}:ckpt", "meta") is None
        assert await store.write_checkpoint(*args, applied=(0, 0), created_at="1.0",
                                            trim_min_id="0-1", fencing_token=3)  # fmt: skip
        assert await client.hget("opml:{f}:ckpt", "meta") == b"{}"
        assert await store.claim_lease("f", "p1", 60_000, "1.0", 2) == (False, 3)  # no renewal
        assert await store.claim_lease("f", "p2", 60_000, "2.0", 3) == (False, None)  # recreated
        await client.aclose()

    asyncio.run(scenario())


def test_a_checkpoint_behind_the_stored_one_is_refused_whatever_its_token(
    own_redis: RedisServer,
) -> None:
    """The checkpoint script refuses to move the checkpoint back to an earlier log position,
    even for the latest token: the stored checkpoint trimmed the log the older state would need
    to catch up. The same position may be written again, a later one replaces it."""

    async def scenario() -> None:
        client = AsyncRedis.from_url(own_redis.url)
        store = Store(client)
        assert await store.create_model("b", {"dim": 1}, 1.0)
        for seq in range(1, 11):
            await client.xadd("opml:{b}:log", {"n": b"1"}, id=f"{seq}-1")
        assert await store.claim_lease("b", "p1", 60_000, "1.0", None) == (True, 1)

        async def save(seq: int) -> bool:
            fields = {"meta": str(seq).encode(), "applied": f"{seq}-1".encode()}
            return await store.write_checkpoint(
                "b", fields, {"a": str(seq).encode()}, applied=(seq, 1), created_at="1.0",
                trim_min_id=f"{seq}-2", fencing_token=1,
            )  # fmt: skip

        assert await save(8)
        assert await client.xlen("opml:{b}:log") == 2  # 9-1 and 10-1 are left
        with pytest.raises(Overtaken):
            await save(7)
        with pytest.raises(Overtaken):  # the part of the position counts too
            await store.write_checkpoint(
                "b",
                {"meta": b"x"},
                {},
                applied=(8, 0),
                created_at="1.0",
                trim_min_id="8-1",
                fencing_token=1,
            )
        assert await client.hgetall("opml:{b}:ckpt") == {b"meta": b"8", b"applied": b"8-1"}
        assert await client.hgetall("opml:{b}:buffer") == {b"a": b"8"}
        assert await save(8)  # the same position again (a final checkpoint with nothing new)
        assert await save(10)
        assert await client.hget("opml:{b}:ckpt", "applied") == b"10-1"
        assert await client.xlen("opml:{b}:log") == 0
        await client.aclose()

    asyncio.run(scenario())


def test_a_deleted_incarnation_writes_nothing_into_the_new_model(own_redis: RedisServer) -> None:
    """A model deleted and created again counts its fencing tokens from 1 again, so a process
    paused through both could hold a token equal to the new incarnation's: its checkpoint is
    refused by the created stamp, not by the token; its log reads publish no applied seq into
    the new model's meta (other processes' admission control reads it)."""

    async def scenario() -> None:
        client = AsyncRedis.from_url(own_redis.url)
        store = Store(client)
        assert await store.create_model("i", {"dim": 1}, 1.0)
        assert await store.claim_lease("i", "p1", 60_000, "1.0", None) == (True, 1)
        await store.delete_model("i")
        assert await store.create_model("i", {"dim": 1}, 2.0)
        assert await store.claim_lease("i", "p2", 60_000, "2.0", None) == (True, 1)

        async def save(created_at: str) -> bool:
            return await store.write_checkpoint(
                "i", {"meta": created_at.encode(), "applied": b"5-1"}, {}, applied=(5, 1),
                created_at=created_at, trim_min_id="5-2", fencing_token=1,
            )  # fmt: skip

        assert not await save("1.0")  # p1, paused through the delete, wakes up
        assert await client.hget("opml:{i}:ckpt", "meta") is None
        await store.read_tail("i", "0-0", 10, applied=7, created_at="1.0")
        assert await client.hget("opml:{i}:meta", "applied") is None
        await store.read_tail("i", "0-0", 10, applied=3, created_at="2.0")
        assert await client.hget("opml:{i}:meta", "applied") == b"3"
        assert await save("2.0")
        assert await client.hget("opml:{i}:ckpt", "meta") == b"2.0"
        await client.aclose()

    asyncio.run(scenario())


def test_two_processes_each_model_learned_once_requests_forwarded(
    tmp_path: Path, own_redis: RedisServer, services: list[ServiceProcess]
) -> None:
    a = ServiceProcess(tmp_path / "a", own_redis.url, **FAST)
    b = ServiceProcess(tmp_path / "b", own_redis.url, **FAST)
    services += [a, b]
    a.start()
    b.start()
    rdb = redis.Redis.from_url(own_redis.url)
    names = [f"m{k}" for k in range(6)]
    for k, name in enumerate(names):  # created through either process
        with (a if k % 2 else b).client() as api:
            make_model(api, name, D, **PARAMS)
        # usable through the other one at once (a registry miss looks in Redis)
        other = b if k % 2 else a
        assert httpx.get(f"{other.url}/v1/models/{name}", timeout=10).status_code == 200
    eventually(lambda: placed(rdb, [a, b], names))

    feeder = Feeder(names, 600, seed=3)
    for k in range(0, 600, 50):  # every model through both processes, in turn
        for j, name in enumerate(names):
            feeder.send(a if (k // 50 + j) % 2 else b, name, k, k + 50)
    with connect(f"{b.ws_url}/v1/models/m0/stream") as ws:  # WebSocket ingestion, any process
        more = [{"x": [0.5, 0.1, 0.2], "y": "c1"}] * 3
        ws.send(json.dumps({"id": "extra", "samples": more}))
        assert json.loads(ws.recv(timeout=30))["last_seq"] == 603
    feeder.X = np.vstack([feeder.X, [[0.5, 0.1, 0.2]] * 3])
    feeder.y = [*feeder.y, "c1", "c1", "c1"]
    feeder.order["m0"] += [600, 601, 602]
    feeder.check(via=a)
    feeder.check(via=b)

    ma, mb = scrape(a), scrape(b)
    for name in names:
        owner = a if lease_holder(rdb, name) == member(a) else b
        other = b if owner is a else a
        mine, theirs = (ma, mb) if owner is a else (mb, ma)
        assert mine[("opml_model_owner", (("model", name),))] == 1.0
        assert ("opml_model_owner", (("model", name),)) not in theirs
        assert steps_of(mine, name) == len(feeder.order[name])
        assert steps_of(theirs, name) == 0  # the other process applied no step of it
        via = httpx.get(f"{other.url}/v1/models/{name}", timeout=10)
        assert via.headers["x-opml-served-by"] == member(owner) and via.json()["owner"] is True
        # a forwarded request that reaches a process not learning the model is never forwarded
        # again: 503, no loop
        looped = httpx.get(
            f"{other.url}/v1/models/{name}", headers={"x-opml-forwarded-by": "x"}, timeout=10
        )
        assert looped.status_code == 503 and looped.headers["retry-after"]
    with connect(f"{a.ws_url}/v1/models/m1/events?interval_ms=50") as ws:  # relayed if need be
        assert json.loads(ws.recv(timeout=30))["version"] == len(feeder.order["m1"])

    assert httpx.delete(f"{a.url}/v1/models/m2", timeout=30).status_code == 204
    eventually(lambda: httpx.get(f"{b.url}/v1/models/m2", timeout=10).status_code == 404)
    assert rdb.keys("opml:{m2}:*") == []
    listed = httpx.get(f"{b.url}/v1/models", timeout=30).json()["models"]
    assert sorted(m["name"] for m in listed) == [n for n in names if n != "m2"]


def test_a_joining_process_takes_a_share_and_a_dead_one_gives_its_models_away(
    tmp_path: Path, own_redis: RedisServer, services: list[ServiceProcess]
) -> None:
    a = ServiceProcess(tmp_path / "a", own_redis.url, **FAST)
    b = ServiceProcess(tmp_path / "b", own_redis.url, **FAST)
    c = ServiceProcess(tmp_path / "c", own_redis.url, **FAST)  # joins later
    services += [a, b, c]
    a.start()
    b.start()
    rdb = redis.Redis.from_url(own_redis.url)
    candidates = [f"j{k}" for k in range(200)]
    names = names_for(candidates, [member(a), member(b)], member(c), moving=2)
    for name in names:
        with a.client() as api:
            make_model(api, name, D, **PARAMS)
    eventually(lambda: placed(rdb, [a, b], names))

    feeder = Feeder(names, 3000, seed=7)
    stop = threading.Event()
    done: list[int] = [0]

    def feed() -> None:  # through A and B while C joins and then A dies
        k = 0
        try:
            while not stop.is_set() and k < 3000:
                for j, name in enumerate(names):
                    via = (b, a) if (k // 25 + j) % 2 else (a, b)
                    feeder.send(via[0], name, k, k + 25, via[1])
                k += 25
                done[0] = k
        except Exception as exc:  # surfaced by feeder.check
            feeder.errors.append(repr(exc))
            raise

    thread = threading.Thread(target=feed)
    thread.start()
    try:
        eventually(lambda: done[0] >= 200)
        c.start()  # joins: exactly the two models rendezvous gives it move there
        eventually(lambda: placed(rdb, [a, b, c], names))
        moved = [n for n in names if lease_holder(rdb, n) == member(c)]
        assert len(moved) == 2
        eventually(lambda: done[0] >= 800)
        a.kill()  # dies holding its models: they move within the lease TTL
        eventually(lambda: placed(rdb, [b, c], names))
        eventually(lambda: done[0] >= 1400)
    finally:
        stop.set()
        thread.join(120)
    feeder.check(via=b)
    feeder.check(via=c)


def test_a_paused_owner_cannot_overwrite_the_new_owners_state_and_stops_when_asked(
    tmp_path: Path, own_redis: RedisServer, services: list[ServiceProcess]
) -> None:
    by_count = {**FAST, "OPML_CHECKPOINT_INTERVAL_S": "3600"}  # A keeps unsaved state when frozen
    a = ServiceProcess(tmp_path / "a", own_redis.url, **by_count)
    b = ServiceProcess(tmp_path / "b", own_redis.url, **FAST)
    services += [a, b]
    # a model that stays with B once both run (so B keeps it after A comes back)
    name = next(
        n
        for n in (f"p{k}" for k in range(100))
        if rendezvous(n, sorted([member(a), member(b)])) == member(b)
    )
    a.start()
    rdb = redis.Redis.from_url(own_redis.url)
    feeder = Feeder([name], 600, seed=5)
    with a.client() as api:
        make_model(api, name, D, **PARAMS)
    url = f"{a.url}/v1/models/{name}"
    feeder.send(a, name, 0, 250)
    eventually(lambda: httpx.get(url).json()["checkpoint"]["seq"] >= 100)
    feeder.send(a, name, 250, 290)  # applied by A; A saves only when 100 are unsaved
    eventually(lambda: httpx.get(url).json()["version"] == 290)
    a.pause()  # A freezes past its lease, with unsaved state
    b.start()
    eventually(lambda: lease_holder(rdb, name) == member(b))
    feeder.send(b, name, 290, 600)
    eventually(lambda: httpx.get(f"{b.url}/v1/models/{name}").json()["checkpoint"]["seq"] == 600)
    a.resume()
    # A wakes up thinking it owns the model: it finds B's checkpoint past its own state, stops
    # learning, and from then on forwards to B; its older state is never saved
    eventually(lambda: httpx.get(url).headers.get("x-opml-served-by") == member(b))
    assert lease_holder(rdb, name) == member(b)
    meta = json.loads(rdb.hget(f"opml:{{{name}}}:ckpt", "meta"))  # type: ignore[arg-type]
    assert meta["seq"] == 600
    feeder.check(via=a)
    assert a.stop() == -signal.SIGTERM  # and it stops when asked (bounded: else TimeoutError)
