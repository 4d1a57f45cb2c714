"""Restart, crash (kill -9) and the embedded Redis: nothing acknowledged is lost or doubled."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.service.support import Launch, RedisServer, core_learner, make_model, stream


@pytest.fixture
def own_redis(tmp_path: Path):
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_restart_keeps_L_and_version(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    X, y = stream(500, 5, 4, seed=8)
    svc = launch(tmp_path, own_redis.url, OPML_CHECKPOINT_EVERY="200").start()
    with svc.client() as api:
        make_model(api, "m", 5, gamma=0.03, seed=1)
        for i in range(0, 500, 50):
            samples = [{"x": X[j].tolist(), "y": y[j]} for j in range(i, i + 50)]
            api.post("/v1/models/m/samples", json={"samples": samples})
        before = api.get("/v1/models/m/metric", params={"min_version": 500}).json()
    svc.stop()
    svc.start()
    with svc.client() as api:
        after = api.get("/v1/models/m/metric").json()
        model = api.get("/v1/models/m").json()
    svc.stop()
    assert after == before and after["version"] == 500
    assert model["checkpoint"]["seq"] == 500  # final checkpoint on shutdown
    np.testing.assert_allclose(
        np.array(after["L"]), core_learner(X, y, dim=5, gamma=0.03, seed=1).L, rtol=0, atol=1e-12
    )
    assert redis.Redis.from_url(own_redis.url).xlen("opml:{m}:log") == 0  # trimmed


#: Frames acknowledged before each kill -9 (20 samples a frame): drawn once, at random, from a
#: seeded generator, so a failure is reproducible. Checkpoints every 230 samples, so the kills
#: land at every phase between two checkpoints (and sometimes during one).
KILL_POINTS = sorted(np.random.default_rng(2024).choice(np.arange(3, 290), 6, replace=False))


def test_kill_9_while_streaming_loses_no_acknowledged_sample(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    n, frame = 6000, 20
    X, y = stream(n, 4, 5, seed=21)
    env = {"OPML_CHECKPOINT_EVERY": "230", "OPML_LEASE_TTL_S": "1"}
    svc = launch(tmp_path, own_redis.url, **env).start()
    with svc.client() as api:
        make_model(api, "m", 4, gamma=0.02, seed=4)
    acked: dict[int, int] = {}  # frame start -> last_seq of its ack

    def client(stop_after: int | None) -> None:
        """Send every frame not yet acknowledged (a resend after a crash reuses the frame id:
        logged at most once); stop reading acks after ``stop_after`` of them."""
        try:
            with connect(f"{svc.ws_url}/v1/models/m/stream") as ws:
                for k in range(0, n, frame):
                    if k in acked:
                        continue
                    samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + frame)]
                    ws.send(json.dumps({"id": k, "samples": samples}))
                    answer = json.loads(ws.recv(timeout=30))
                    assert "error" not in answer, answer
                    acked[k] = answer["last_seq"]
                    if stop_after is not None and len(acked) >= stop_after:
                        killed.wait(30)  # hold the connection until the kill
                        return
        except (ConnectionClosed, OSError):  # the connection dies with the service
            if stop_after is None:
                raise

    for point in KILL_POINTS:
        killed = threading.Event()
        thread = threading.Thread(target=client, args=(int(point),), daemon=True)
        thread.start()
        while len(acked) < point:
            time.sleep(0.005)
        svc.kill()
        killed.set()
        thread.join(30)
        svc.start()
        with svc.client() as api:
            logged = api.get("/v1/models/m").json()["logged_seq"]
            got = api.get("/v1/models/m/metric", params={"min_version": logged}).json()
        # every acknowledged sample is in, in order, once: state == core on the logged prefix
        assert sorted(acked.values()) == [frame * (i + 1) for i in range(len(acked))]
        assert got["version"] == logged and max(acked.values()) <= logged <= len(acked) * frame
        ref = core_learner(X[:logged], y[:logged], dim=4, gamma=0.02, seed=4)
        np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
    client(None)  # resend what was in flight at the last kill, then the rest
    with svc.client() as api:  # wait until applied (an ack means logged), then read the model
        got = api.get("/v1/models/m/metric", params={"min_version": n}).json()
        model = api.get("/v1/models/m").json()
    svc.stop()
    assert len(acked) == n // frame and model["logged_seq"] == got["version"] == n
    ref = core_learner(X, y, dim=4, gamma=0.02, seed=4)
    np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
    assert model["updates"]["triplet"] == ref.counts["triplet_update"] + ref.counts["shrunk_update"]


def _aof_config(port: int) -> tuple[str, int]:
    client = redis.Redis(port=port, decode_responses=True)
    try:
        config = client.config_get("appendfsync") | client.config_get("auto-aof-rewrite-min-size")
    finally:
        client.close()
    return config["appendfsync"], int(config["auto-aof-rewrite-min-size"])


def test_embedded_redis_survives_a_crash_and_is_adopted(tmp_path: Path, launch: Launch) -> None:
    svc = launch(tmp_path, None).start()  # no OPML_REDIS_URL: embedded redis-server
    with svc.client() as api:
        make_model(api, "m", 2)
        api.post("/v1/models/m/samples?wait=true", json={"samples": [{"x": [1, 0], "y": 1}] * 3})
    state = json.loads((svc.data_dir / "redis.json").read_text())
    assert (svc.data_dir / "appendonly.aof").exists()
    assert _aof_config(state["port"]) == ("always", 1024 * 2**20)  # the defaults
    svc.kill()
    os.kill(state["pid"], 0)  # the child outlived the killed service

    # adopts it instead of starting a second server on the same dir, with this start's settings
    svc.env |= {"OPML_REDIS_APPENDFSYNC": "everysec", "OPML_REDIS_AOF_REWRITE_MIN_MB": "96"}
    svc.start()
    assert json.loads((svc.data_dir / "redis.json").read_text())["pid"] == state["pid"]
    assert _aof_config(state["port"]) == ("everysec", 96 * 2**20)
    with svc.client() as api:
        assert api.get("/v1/models/m").json()["version"] == 3
    svc.stop()  # graceful (uvicorn re-raises SIGTERM after shutdown: exit status -15)
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)  # a clean stop stops the embedded server too

    svc.start()  # and a fresh embedded server reads the AOF back
    with svc.client() as api:
        assert api.get("/v1/models/m").json()["logged_seq"] == 3
    svc.stop()
    assert not (svc.data_dir / "redis.json").exists()


def test_a_second_service_on_the_same_data_dir_refuses_to_start(
    tmp_path: Path, launch: Launch
) -> None:
    first = launch(tmp_path, None).start()
    second = launch(tmp_path, None)
    with pytest.raises(RuntimeError, match="another opml-service"):
        second.start()
    with first.client() as api:
        assert api.get("/readyz").status_code == 200
    first.stop()
