"""Redis stopped and restarted under traffic: quick 503s while down, recovery without restart."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np

from tests.service.support import (
    RedisServer,
    ServiceProcess,
    assert_problem,
    core_learner,
    make_model,
    stream,
)


def test_redis_outage_gives_503_and_the_service_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    svc = ServiceProcess(tmp_path, server.url, OPML_REDIS_TIMEOUT_S="1").start()
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
            for i in range(100):
                assert send(api, i).status_code == 202
            server.stop()
            down = [send(api, i) for i in range(100, 110)]
            for response in down:
                assert_problem(response, 503)
                assert int(response.headers["Retry-After"]) >= 1
            assert_problem(api.get("/readyz"), 503)
            assert api.get("/livez").status_code == 200
            # queries read the in-memory snapshot: still answered while Redis is down
            assert api.get("/v1/models/m/metric").json()["version"] == 100

            server.start()  # same port, same dir: the AOF brings the log back
            deadline = time.monotonic() + 30
            i = 110
            while len(accepted) < 100 + 50:
                assert time.monotonic() < deadline, "no recovery"
                status = send(api, i).status_code
                assert status in (202, 503)
                i += 1
            assert api.get("/readyz").status_code == 200
            got = api.get("/v1/models/m/metric", params={"min_version": 150}).json()
        ref = core_learner(X[accepted], [y[i] for i in accepted], dim=3, gamma=0.05)
        assert got["version"] == 150
        np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
    finally:
        if svc.proc is not None:
            svc.stop()
        server.stop()
