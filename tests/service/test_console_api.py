"""The console's server side: its static files under ``/ui/`` and the read endpoints its pages
use (``/recent``, ``/calibration``, ``/v1/key``), on the shared service and, for the scope
checks, on a service with keys, each a real process on a real Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from service.core import Learner, LearnerConfig
from service.core.curves import principal_components
from service.engine.writer import RECENT_SAMPLES
from service.security import entry_for
from tests.service.support import RedisServer, ServiceProcess, assert_problem, make_model, stream

KEYS = {"admin": "con-adm-key-1", "ingest": "con-ing-key-2", "query": "con-qry-key-3"}


def feed(client: httpx.Client, name: str, X: np.ndarray, y: list[str], **headers: str) -> int:
    answer = client.post(
        f"/v1/models/{name}/samples?wait=true",
        json={"samples": [{"x": x, "y": label} for x, label in zip(X.tolist(), y, strict=True)]},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    version: int = answer.json()["version"]
    return version


def test_recent_gives_the_latest_samples_and_their_principal_components(
    api: httpx.Client, name: str
) -> None:
    make_model(api, name, 4)
    empty = api.get(f"/v1/models/{name}/recent").json()
    assert (empty["count"], empty["samples"], empty["classes"]) == (0, [], [])
    X, y = stream(120, 4, 3, seed=5)
    version = feed(api, name, X, y)
    answer = api.get(f"/v1/models/{name}/recent", params={"limit": 50, "min_version": version})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["version"] == version == 120
    assert body["count"] == 50
    assert [s["x"] for s in body["samples"]] == X[-50:].tolist()  # the latest, oldest first
    assert [s["y"] for s in body["samples"]] == y[-50:]
    assert body["classes"] == list(dict.fromkeys(y[-50:]))
    # the picture of the metric: principal components of x L^T with the served L
    L = np.array(api.get(f"/v1/models/{name}/metric").json()["L"])
    expected, share = principal_components(X[-50:] @ L.T)
    assert np.allclose(body["projection"]["z"]["points"], expected, atol=1e-9)
    assert np.allclose(body["projection"]["z"]["explained"], share)
    plain, _ = principal_components(X[-50:])
    assert np.allclose(body["projection"]["x"]["points"], plain, atol=1e-9)
    assert not np.allclose(plain, expected)  # the metric has learned something


def test_recent_is_bounded_and_checks_its_arguments(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    before = api.get(f"/v1/models/{name}").json()
    too_many = assert_problem(
        api.get(f"/v1/models/{name}/recent", params={"limit": RECENT_SAMPLES + 1}), 422
    )
    assert "limit" in json.dumps(too_many["errors"])
    assert_problem(api.get(f"/v1/models/{name}/recent", params={"limit": 0}), 422)
    assert_problem(api.get("/v1/models/no-such-model/recent"), 404)
    assert api.get(f"/v1/models/{name}").json()["version"] == before["version"]


def test_recent_answers_samples_near_the_float_limit(api: httpx.Client, name: str) -> None:
    """Finite samples whose squares overflow still get a picture (not a 500): finite shares,
    the points that overflow shown at the edge of what JSON can carry."""
    make_model(api, name, 2)
    version = feed(
        api, name, np.array([[1.0, 0.0], [1e308, 1e308], [-1e308, 1e308]]), ["a", "b", "c"]
    )
    answer = api.get(f"/v1/models/{name}/recent", params={"min_version": version})
    assert answer.status_code == 200, answer.text
    projection = answer.json()["projection"]
    for side in ("x", "z"):
        share = projection[side]["explained"]
        assert np.isfinite(share).all() and sum(share) == pytest.approx(1.0)
        assert np.isfinite(projection[side]["points"]).all()


def test_recent_keeps_only_the_latest_window(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    X, y = stream(RECENT_SAMPLES + 100, 2, 3, seed=9)
    for start in range(0, len(y), 300):  # OPML_MAX_BATCH of the shared service is 500
        feed(api, name, X[start : start + 300], y[start : start + 300])
    body = api.get(f"/v1/models/{name}/recent", params={"limit": RECENT_SAMPLES}).json()
    assert body["count"] == RECENT_SAMPLES
    assert [s["x"] for s in body["samples"]] == X[-RECENT_SAMPLES:].tolist()


def test_calibration_curve_follows_the_verify_rule(api: httpx.Client, name: str) -> None:
    make_model(api, name, 4)
    no_pairs = api.get(f"/v1/models/{name}/calibration").json()
    assert no_pairs["points"] == [] and no_pairs["at_threshold"] is None
    X, y = stream(300, 4, 3, seed=2)
    version = feed(api, name, X, y)
    answer = api.get(f"/v1/models/{name}/calibration", params={"points": 40})
    assert answer.status_code == 200, answer.text
    curve = answer.json()
    model = api.get(f"/v1/models/{name}").json()
    assert curve["version"] == version
    assert curve["pairs"] == model["verification"]["pairs"] > 0
    assert curve["eer"] == model["verification"]["eer"]
    assert curve["threshold"] == model["verification"]["threshold"]
    points = curve["points"]
    assert len(points) == 40
    thresholds = [p["threshold"] for p in points]
    assert thresholds == sorted(thresholds)
    assert points[0]["far"] <= points[-1]["far"] == 1.0 and points[-1]["frr"] == 0.0
    far = [p["far"] for p in points]
    frr = [p["frr"] for p in points]
    assert far == sorted(far) and frr == sorted(frr, reverse=True)
    # the served threshold's point: the EER threshold of the window, where FAR ~ FRR ~ EER
    at = curve["at_threshold"]
    assert at["threshold"] == curve["threshold"]
    assert curve["threshold_source"] == verify_source(api, name, X)
    assert abs((at["far"] + at["frr"]) / 2 - curve["eer"]) < 0.5 / curve["pairs"] + 1e-9
    assert_problem(api.get(f"/v1/models/{name}/calibration", params={"points": 1}), 422)


def verify_source(api: httpx.Client, name: str, X: np.ndarray) -> str:
    answer = api.post(f"/v1/models/{name}/verify", json={"a": X[0].tolist(), "b": X[1].tolist()})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return str(body.get("threshold_source", "calibrated" if body["calibrated"] else "fallback"))


def test_calibration_window_matches_the_reference_learner(api: httpx.Client, name: str) -> None:
    """The curve's rates are those of the core learner's own window on the same stream."""
    make_model(api, name, 3, algorithm="opml")
    X, y = stream(200, 3, 3, seed=4)
    feed(api, name, X, y)
    doc = api.get(f"/v1/models/{name}").json()
    learner = Learner(LearnerConfig(dim=3, algorithm="opml", seed=doc["seed"]))
    learner.learn_many(X, y)
    window, _ = learner.calibrator.to_state()
    curve = api.get(f"/v1/models/{name}/calibration", params={"points": 7}).json()
    for point in curve["points"]:
        t = point["threshold"]
        assert point["far"] == pytest.approx(np.mean(window[:, 1] <= t))
        assert point["frr"] == pytest.approx(np.mean(window[:, 0] > t))


def test_ui_files_are_served_from_the_package_and_nothing_else(api: httpx.Client) -> None:
    page = api.get("/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "http" not in page.text.replace('href="../docs"', "")  # no other origin named
    assert api.get("/ui").headers["location"] == "/ui/"
    script = api.get("/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "import" in script.text
    uplot = api.get("/ui/vendor/uplot/uPlot.esm.js")
    assert uplot.status_code == 200 and "export { uPlot as default }" in uplot.text
    for path in ("/ui/../routes/console.py", "/ui/%2e%2e/console.py", "/ui/nothing.js",
                 "/ui/vendor/uplot/LICENSE"):  # fmt: skip
        assert_problem(api.get(path), 404)


def test_key_endpoint_without_keys_says_everything_is_open(api: httpx.Client) -> None:
    assert api.get("/v1/key").json() == {
        "keys_configured": False,
        "scopes": ["query", "ingest", "admin"],
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    server = RedisServer(tmp_path_factory.mktemp("console-redis")).start()
    entries = [entry_for(key, [scope]) for scope, key in KEYS.items()]
    try:
        with ServiceProcess(
            tmp_path_factory.mktemp("console-secured"),
            server.url,
            OPML_API_KEYS=json.dumps(entries),
        ) as proc:
            yield proc
    finally:
        server.stop()


def bearer(scope: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[scope]}"}


def test_new_read_endpoints_need_the_query_scope(secured: ServiceProcess) -> None:
    with secured.client() as client:
        assert client.post("/v1/models", json={"name": "con", "dim": 2}, headers=bearer("admin"))
        for path in ("/v1/models/con/recent", "/v1/models/con/calibration", "/v1/key"):
            assert_problem(client.get(path), 401)
            assert_problem(client.get(path, headers={"Authorization": "Bearer wrong"}), 401)
            weak = assert_problem(client.get(path, headers=bearer("ingest")), 403)
            assert weak["required_scope"] == "query"
            for scope in ("query", "admin"):
                assert client.get(path, headers=bearer(scope)).status_code == 200, path
        assert client.get("/v1/key", headers=bearer("query")).json() == {
            "keys_configured": True,
            "scopes": ["query"],
        }
        assert client.get("/v1/key", headers=bearer("admin")).json()["scopes"] == [
            "admin", "ingest", "query",
        ]  # fmt: skip
        assert client.get("/ui/").status_code == 200  # the files are open: they hold no data
        schema = client.get("/openapi.json").json()
    operations = {op["operationId"]: op for ops in schema["paths"].values() for op in ops.values()}
    for operation in ("recent_samples", "calibration_curve", "key_scopes"):
        assert operations[operation]["x-required-scope"] == "query"
        assert operations[operation]["description"]
    assert not any(path.startswith("/ui") for path in schema["paths"])
