"""Two service processes on one Redis: one lease holder per model, fencing, failover, replicas."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from websockets.sync.client import connect

from service.storage.store import Fenced, Store
from tests.service.conftest import Launch
from tests.service.support import RedisServer, ServiceProcess, core_learner, make_model, stream

#: Checkpoints every 100 samples, or 1 s after the last change: the writer reads the log in
#: batches of whatever has arrived, so on a slow machine a checkpoint need not fall on a multiple
#: of 100, and only the interval makes sure the final state gets one.
FAST = {
    "OPML_LEASE_TTL_S": "1.5",
    "OPML_POLL_INTERVAL_S": "0.1",
    "OPML_CHECKPOINT_EVERY": "100",
    "OPML_CHECKPOINT_INTERVAL_S": "1",
}
#: For tests where nobody should take over: a lease a busy CI machine cannot lose by a stall.
STEADY = {**FAST, "OPML_LEASE_TTL_S": "15"}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def eventually(what: Callable[[], Any], timeout: float = 30) -> Any:
    """Poll ``what`` until it returns something truthy (a bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return value


def model(svc: ServiceProcess, name: str) -> dict[str, Any] | None:
    response = httpx.get(f"{svc.url}/v1/models/{name}", timeout=10)
    return response.json() if response.status_code == 200 else None


def test_fencing_refuses_a_checkpoint_with_an_older_token(own_redis: RedisServer) -> None:
    """The checkpoint script itself, on a real Redis: a stale token never writes."""

    async def scenario() -> None:
        client = AsyncRedis.from_url(own_redis.url)
        store = Store(client)
        assert await store.create_model("f", {"dim": 1}, 1.0)
        assert await store.claim_lease("f", "p1", 60_000, "1.0", None) == (True, 1)
        assert await store.claim_lease("f", "p2", 60_000, "1.0", None) == (False, 1)
        await client.delete("opml:{f}:lease")  # p1's lease expires (p1 is paused)
        assert await store.claim_lease("f", "p2", 60_000, "1.0", None) == (True, 2)
        args = ("f", {"seq": 0}, b"L", b"", [], "0-1")
        with pytest.raises(Fenced):  # p1 resumes and tries to save its older state
            await store.write_checkpoint(*args, fencing_token=1, applied="0-0", time=1.0)
        assert await client.hget("opml:{f}:ckpt", "meta") is None
        assert await store.write_checkpoint(*args, fencing_token=2, applied="0-0", time=1.0)
        assert await store.claim_lease("f", "p1", 60_000, "1.0", 1) == (False, 2)  # no renewal
        assert await store.claim_lease("f", "p2", 60_000, "2.0", 2) == (False, None)  # recreated
        await client.aclose()

    asyncio.run(scenario())


def test_one_owner_replica_follows_creates_and_deletes(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    a = launch(tmp_path / "a", own_redis.url, **STEADY).start()
    b = launch(tmp_path / "b", own_redis.url, **STEADY).start()
    try:
        X, y = stream(400, 3, 4, seed=3)
        with a.client() as api_a, b.client() as api_b:
            make_model(api_a, "m", 3, gamma=0.05, seed=1)
            seen_by_b = eventually(lambda: model(b, "m"))  # B follows the registry
            assert model(a, "m")["owner"] is True and seen_by_b["owner"] is False  # type: ignore[index]
            order: list[int] = []
            for k in range(0, 400, 20):  # alternate processes; both append to the one log
                api = api_a if (k // 20) % 2 == 0 else api_b
                body = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 20)]}
                answer = api.post("/v1/models/m/samples", json=body).json()
                assert answer["first_seq"] == len(order) + 1
                order += range(k, k + 20)
            ref = core_learner(X[order], [y[i] for i in order], dim=3, gamma=0.05, seed=1)
            for api in (api_a, api_b):  # the replica answers from the same state
                got = api.get("/v1/models/m/metric", params={"min_version": 400}).json()
                np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
            # only the owner checkpoints (every 100); the replica reports the owner's position
            eventually(lambda: model(a, "m")["checkpoint"]["seq"] == 400)  # type: ignore[index]
            replica = eventually(
                lambda: (m := model(b, "m")) and m["checkpoint"]["seq"] == 400 and m
            )
            assert replica["owner"] is False and replica["fencing_token"] is None
            assert replica["staleness_s"] is not None and replica["version"] == 400

            assert api_b.delete("/v1/models/m").status_code == 204  # delete through the replica
            eventually(lambda: model(a, "m") is None)
        assert redis.Redis.from_url(own_redis.url).keys("opml:{m}:*") == []
    finally:
        a.stop()
        b.stop()


def test_failover_after_kill_9_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    a = launch(tmp_path / "a", own_redis.url, **FAST).start()
    b = launch(tmp_path / "b", own_redis.url, **FAST).start()
    X, y = stream(3000, 4, 5, seed=11)
    acked: list[int] = []
    try:
        with a.client() as api_a:
            make_model(api_a, "m", 4, gamma=0.02, seed=2)
        first_token = eventually(lambda: model(a, "m"))["fencing_token"]
        eventually(lambda: model(b, "m"))

        def client() -> None:  # streams through B, the replica, while A dies
            with connect(f"{b.ws_url}/v1/models/m/stream") as ws:
                for k in range(0, 3000, 20):
                    samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 20)]
                    ws.send(json.dumps({"id": k, "samples": samples}))
                    acked.append(json.loads(ws.recv(timeout=30))["last_seq"])

        thread = threading.Thread(target=client)
        thread.start()
        eventually(lambda: len(acked) >= 40)
        a.kill()  # the owner dies mid-stream, holding the lease
        thread.join(120)
        assert acked == [20 * (i + 1) for i in range(150)]  # every frame acknowledged
        taken = eventually(lambda: (m := model(b, "m")) and m["owner"] and m)
        assert taken["fencing_token"] > first_token
        got = httpx.get(f"{b.url}/v1/models/m/metric", params={"min_version": 3000}).json()
        ref = core_learner(X, y, dim=4, gamma=0.02, seed=2)
        assert got["version"] == 3000
        np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
        eventually(lambda: model(b, "m")["checkpoint"]["seq"] == 3000)  # type: ignore[index]

        a.start()  # A comes back as a replica, from B's checkpoint
        back = eventually(lambda: (m := model(a, "m")) and m["version"] == 3000 and m)
        assert back["owner"] is False
        L_a = httpx.get(f"{a.url}/v1/models/m/metric").json()["L"]
        np.testing.assert_allclose(np.array(L_a), ref.L, rtol=0, atol=1e-12)
    finally:
        for svc in (a, b):
            svc.stop()


def test_a_paused_owner_cannot_overwrite_the_new_owners_state(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    by_count = {**FAST, "OPML_CHECKPOINT_INTERVAL_S": "3600"}  # A keeps unsaved state when frozen
    a = launch(tmp_path / "a", own_redis.url, **by_count).start()
    b = launch(tmp_path / "b", own_redis.url, **FAST).start()
    rdb = redis.Redis.from_url(own_redis.url)
    X, y = stream(600, 3, 3, seed=5)

    def send(svc: ServiceProcess, lo: int, hi: int) -> None:
        body = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(lo, hi)]}
        assert httpx.post(f"{svc.url}/v1/models/m/samples", json=body).status_code == 202

    try:
        with a.client() as api_a:
            make_model(api_a, "m", 3, gamma=0.05)
        eventually(lambda: model(b, "m"))
        send(a, 0, 250)
        first = eventually(lambda: model(a, "m")["checkpoint"]["seq"])  # type: ignore[index]
        assert 100 <= first <= 250
        send(a, 250, 290)  # applied by A; A saves only when 100 are unsaved
        eventually(lambda: model(a, "m")["version"] == 290)  # type: ignore[index]
        a.pause()  # A freezes past its lease, with unsaved state
        try:
            eventually(lambda: (m := model(b, "m")) and m["owner"])
            send(b, 290, 600)
            eventually(lambda: model(b, "m")["checkpoint"]["seq"] == 600)  # type: ignore[index]
        finally:
            a.resume()
        # A wakes up thinking it owns the model; Redis refuses its stale token
        resumed = eventually(lambda: (m := model(a, "m")) and m["version"] == 600 and m)
        eventually(lambda: model(a, "m")["owner"] is False)  # type: ignore[index]
        assert model(b, "m")["owner"] is True  # type: ignore[index]
        meta = json.loads(rdb.hget("opml:{m}:ckpt", "meta"))  # type: ignore[arg-type]
        assert meta["seq"] == 600 and resumed["checkpoint"]["seq"] == 600
        ref = core_learner(X, y, dim=3, gamma=0.05)
        for svc in (a, b):
            L = httpx.get(f"{svc.url}/v1/models/m/metric").json()["L"]
            np.testing.assert_allclose(np.array(L), ref.L, rtol=0, atol=1e-12)
    finally:
        a.stop()
        b.stop()
