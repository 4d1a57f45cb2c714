"""Backpressure from the learner: appends wait while too many logged samples are unapplied."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from clients._wire import binary_frame
from tests.service.support import (
    Launch,
    RedisServer,
    ServiceProcess,
    core_learner,
    make_model,
    scrape,
    series,
    stream,
)

#: The learner of both floods: with three rehearsed steps per sample it learns ~4x slower than
#: plain OPML at the same ingestion cost, so the flood outruns it by far even on a loaded
#: machine (with plain OPML at d = 1024 a loaded machine's ingestion had slowed so much that
#: the unbounded log ran only 125-575 samples ahead).
LEARNER = {"gamma": 0.01, "seed": 2, "rehearsal": 3}


def flood(
    svc: ServiceProcess, api: httpx.Client, model: str, X: np.ndarray, y: np.ndarray, frame: int
) -> tuple[int, int]:
    """Send every frame of ``X, y`` at once over one WebSocket (the service's window bounds
    them), then read every answer; meanwhile watch the model: the frames acknowledged and the
    most samples seen logged but not yet applied (watched all along, from another thread, so
    the figure does not depend on when the sender gets to read its acks)."""
    acked: list[int] = []

    def send() -> None:
        with connect(f"{svc.ws_url}/v1/models/{model}/stream", max_size=None) as ws:
            for k in range(0, len(y), frame):
                ws.send(binary_frame(k, X[k : k + frame], y[k : k + frame]))
            for _ in range(0, len(y), frame):
                answer = ws.recv(timeout=120)
                assert isinstance(answer, str) and '"ack"' in answer, answer
                acked.append(1)

    sender = threading.Thread(target=send)
    sender.start()
    worst = 0
    while sender.is_alive():
        body = api.get(f"/v1/models/{model}").json()
        worst = max(worst, body["logged_seq"] - body["version"])
        time.sleep(0.01)
    sender.join()
    return len(acked), worst


@pytest.mark.parametrize(("setting", "limit"), [("100", 100), ("0", 64)])
def test_unapplied_samples_stay_bounded_under_a_flood(
    tmp_path: Path, own_redis: RedisServer, setting: str, limit: int, launch: Launch
) -> None:
    """At d = 1024 the learner (~4 ms a sample here) is far slower than binary ingestion, so a
    flood without backpressure would pile thousands of logged samples ahead of it. With
    OPML_MAX_UNAPPLIED = 100 (or 0: automatic, two batches of 32 at d = 1024), no observation
    of the model may show more than the bound + one frame unapplied, and every acknowledged
    sample is still applied, once, in order."""
    frame, n, d = 25, 1500, 1024
    model = f"bp{setting}"
    svc = launch(tmp_path, own_redis.url, OPML_MAX_UNAPPLIED=setting).start()
    X, y = stream(n, d, 3, seed=4)
    try:
        with svc.client() as api:
            make_model(api, model, d, **LEARNER)
            acked, worst = flood(svc, api, model, X, y, frame)
            assert acked == n // frame
            assert 0 < worst <= limit + frame, worst
            waits = series(scrape(api), "opml_ingest_backpressure_wait_seconds_count", model=model)
            assert sum(waits.values()) >= 1  # frames did wait, and the operator can see it
            got = api.get(f"/v1/models/{model}/metric", params={"min_version": n}).json()
        ref = core_learner(X, y, dim=d, **LEARNER)
        assert got["version"] == n
        np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
    finally:
        svc.stop()


def test_without_the_bound_the_same_flood_runs_ahead_of_the_learner(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    """The control for the test above: a limit too high to bind lets the log run far ahead of
    the learner on the same flood (so the bound above is what kept it small)."""
    frame, n, d = 25, 1500, 1024
    svc = launch(tmp_path, own_redis.url, OPML_MAX_UNAPPLIED="1000000").start()
    X, y = stream(n, d, 3, seed=4)
    try:
        with svc.client() as api:
            make_model(api, "nb", d, **LEARNER)
            acked, worst = flood(svc, api, "nb", X, y, frame)
            assert acked == n // frame
            assert worst > 2 * (100 + frame), worst
            waits = series(scrape(api), "opml_ingest_backpressure_wait_seconds_count", model="nb")
            assert sum(waits.values()) == 0
    finally:
        svc.stop()
