"""The service launcher (devkit/launcher.py): bounded stops, signals, nothing left running."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from devkit.launcher import ServiceProcess
from tests.service.support import Launch, assert_problem


def gone(pid: int) -> bool:
    """The process has exited (an exited child of a dead service is a zombie until init reaps
    it: that counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_stop_past_its_bound_kills_the_group_and_the_embedded_redis(tmp_path: Path) -> None:
    """A graceful shutdown cannot finish within 1 ms: the launcher must kill the service's
    process group and its embedded redis-server (its own session), and say so."""
    svc = ServiceProcess(tmp_path, None).start()
    embedded = svc.embedded_redis()
    assert embedded is not None and not gone(embedded[0])
    with pytest.raises(TimeoutError, match=r"did not exit within 0\.001 s of SIGTERM"):
        svc.stop(timeout=0.001)
    assert svc.returncode == -9 and not svc.running
    assert group_gone(svc.pid) and gone(embedded[0])
    svc.close()  # idempotent once everything is gone
    assert svc.returncode == -9


def test_a_graceful_stop_ends_the_embedded_redis_and_reports_sigterm(tmp_path: Path) -> None:
    with ServiceProcess(tmp_path, None) as svc:
        embedded = svc.embedded_redis()
        assert embedded is not None
        assert svc.stop() == -15  # uvicorn re-raises the SIGTERM after its shutdown
    assert gone(embedded[0]) and svc.embedded_redis() is None  # redis.json removed


def test_kill_leaves_the_embedded_redis_as_a_crash_would_and_close_ends_it(
    tmp_path: Path,
) -> None:
    svc = ServiceProcess(tmp_path, None).start()
    embedded = svc.embedded_redis()
    assert embedded is not None
    assert svc.kill() == -9
    assert not gone(embedded[0])  # the crash case: the service's redis-server survives
    svc.close()
    assert gone(embedded[0])


def test_pause_freezes_the_service_and_stop_still_ends_a_paused_one(
    tmp_path: Path, redis_url: str, launch: Launch
) -> None:
    svc = launch(tmp_path / "a", redis_url).start()
    with svc.client(timeout=1.0) as api:
        svc.pause()
        with pytest.raises(httpx.TimeoutException):
            api.get("/livez")
        svc.resume()
        assert api.get("/livez").status_code == 200
        svc.pause()
    assert svc.stop() == -15  # SIGTERM is handled once the stop resumes it


def test_a_service_that_cannot_start_raises_with_its_log_and_leaves_nothing(
    tmp_path: Path, redis_url: str
) -> None:
    svc = ServiceProcess(tmp_path, redis_url, OPML_REDIS_TIMEOUT_S="0")  # must be > 0
    refused = r"status 2 before it was ready(.|\n)*OPML_REDIS_TIMEOUT_S"
    with pytest.raises(RuntimeError, match=refused):
        svc.start()
    assert svc.returncode == 2 and group_gone(svc.pid)  # 2: a usage error (service.__main__)


def test_the_callers_opml_variables_do_not_reach_the_service(
    tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPML_MAX_DIM", "2")
    monkeypatch.setenv("OPML_API_KEYS", '["0000:admin"]')  # would refuse to start
    svc = launch(tmp_path, None, OPML_MAX_BATCH="3").start()
    assert svc.env["OPML_MAX_BATCH"] == "3" and "OPML_MAX_DIM" not in svc.env
    with svc.client() as api:
        made = api.post("/v1/models", json={"name": "m", "dim": 5})
        assert made.status_code == 201  # the default OPML_MAX_DIM (1024), not the caller's 2
        four = {"samples": [{"x": [0.0] * 5, "y": i} for i in range(4)]}
        assert_problem(api.post("/v1/models/m/samples", json=four), 422)  # the given limit
