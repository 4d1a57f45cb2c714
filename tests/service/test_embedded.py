"""The embedded redis-server is supervised: killed (-9), it is restarted on its dir and port, and
the service recovers by itself with every acknowledged sample."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config import Settings
from service.storage.embedded import EmbeddedRedis
from tests.service.cluster import wait_for
from tests.service.support import ServiceProcess, make_model


def test_a_killed_embedded_redis_is_restarted_and_the_service_recovers(tmp_path: Path) -> None:
    svc = ServiceProcess(tmp_path, None).start()  # no OPML_REDIS_URL: the embedded server
    state_file = svc.data_dir / "redis.json"
    try:
        with svc.client() as api:
            make_model(api, "m", 2)
            sent = api.post("/v1/models/m/samples", json={"x": [1, 0], "y": "a"})
            assert sent.status_code == 202  # acknowledged: in the AOF (appendfsync always)
            first = json.loads(state_file.read_text())
            os.kill(first["pid"], signal.SIGKILL)

            def restarted() -> dict[str, int] | None:
                state: dict[str, int] = json.loads(state_file.read_text())
                return state if state["pid"] != first["pid"] else None

            again = wait_for("a new redis-server", restarted)
            assert again["port"] == first["port"]  # same port: the client reconnects
            wait_for("/readyz 200", lambda: api.get("/readyz").status_code == 200)

            def ingested() -> bool:  # 503 until the writer and the client are back
                sent = api.post("/v1/models/m/samples", json={"x": [0, 1], "y": "b"})
                return sent.status_code == 202

            wait_for("a new sample acknowledged", ingested)
            model = api.get("/v1/models/m/metric", params={"min_version": 2}).json()
            assert model["version"] == 2  # the sample acked before the kill is still there
            assert api.get("/v1/models/m").json()["logged_seq"] == 2
    finally:
        svc.stop()
    log = svc.log_path.read_text()
    assert f"redis-server (pid {first['pid']}) exited" in log and "is back" in log
    with pytest.raises(ProcessLookupError):  # a clean stop stops the restarted server too
        os.kill(again["pid"], 0)


def test_waiting_for_replicas_needs_a_redis_with_replicas() -> None:
    with pytest.raises(ValidationError, match="redis_wait_replicas: the embedded Redis has no"):
        Settings(redis_wait_replicas=1)  # no OPML_REDIS_URL: the embedded server
    assert Settings(redis_wait_replicas=1, redis_url="redis://r:6379/0").redis_wait_replicas == 1


def test_an_aof_rewrite_size_below_one_mb_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="redis_aof_rewrite_min_mb"):
        Settings(redis_aof_rewrite_min_mb=0)
    with pytest.raises(ValueError, match="aof_rewrite_min_mb: must be >= 1, got 0"):
        EmbeddedRedis(tmp_path, aof_rewrite_min_mb=0)
    assert not tmp_path.joinpath("service.lock").exists()  # refused before touching the dir
