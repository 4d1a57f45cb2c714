"""Redis stopped or killed (-9) and restarted from its AOF under traffic: quick 503s with
Retry-After while down, recovery without a service restart, nothing acknowledged lost."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.support import (
    Launch,
    RedisServer,
    assert_problem,
    core_learner,
    make_model,
    stream,
)

#: (how Redis goes down, samples acknowledged before): SIGTERM once, SIGKILL at seeded random
#: points (with appendfsync always, every acknowledged append is in the AOF).
OUTAGES = [("stop", 100)] + [
    ("kill", int(k)) for k in np.random.default_rng(7).choice(np.arange(5, 150), 2, replace=False)
]


@pytest.mark.parametrize(("how", "before"), OUTAGES)
def test_redis_outage_gives_503_and_the_service_recovers(
    tmp_path: Path, how: str, before: int, launch: Launch
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    svc = launch(tmp_path, server.url, OPML_REDIS_TIMEOUT_S="1").start()
    X, y = stream(300, 3, 3, seed=5)
    accepted: list[int] = []  # indexes of acknowledged samples, in seq order

    def send(api: httpx.Client, i: int) -> httpx.Response:
        response = api.post("/v1/models/m/samples", json={"x": X[i].tolist(), "y": y[i]})
        if response.status_code == 202:
            assert response.json()["first_seq"] == len(accepted) + 1
            accepted.append(i)
        return response

    try:
        with svc.client() as api:
            make_model(api, "m", 3, gamma=0.05)
            for i in range(before):
                assert send(api, i).status_code == 202
            api.get("/v1/models/m/metric", params={"min_version": before})  # all applied
            server.stop() if how == "stop" else server.kill()
            down = [send(api, i) for i in range(before, before + 10)]
            for response in down:
                assert_problem(response, 503)
                assert int(response.headers["Retry-After"]) >= 1
            assert_problem(api.get("/readyz"), 503)
            assert api.get("/livez").status_code == 200
            # queries read the in-memory snapshot: still answered while Redis is down
            assert api.get("/v1/models/m/metric").json()["version"] == before

            server.start()  # same port, same dir: the AOF brings the log back
            deadline = time.monotonic() + 30
            i = before + 10
            while len(accepted) < before + 50:
                assert time.monotonic() < deadline, "no recovery"
                status = send(api, i).status_code
                assert status in (202, 503)
                i += 1
            ready = api.get("/readyz")
            assert ready.status_code == 200, ready.text
            got = api.get("/v1/models/m/metric", params={"min_version": before + 50}).json()
        ref = core_learner(X[accepted], [y[i] for i in accepted], dim=3, gamma=0.05)
        assert got["version"] == before + 50
        np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
    finally:
        svc.stop()
        server.stop()
