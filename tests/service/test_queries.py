"""Queries (distance, verify, transform, metric) against the core learner on the same stream."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from tests.service.support import assert_problem, core_learner, make_model, stream

PARAMS = {"dim": 6, "algorithm": "copml", "gamma": 0.02, "gamma_pair": 0.01, "margin": 1.5}


def feed(query_api: httpx.Client, name: str, X: np.ndarray, y: list[str], batch: int = 97) -> int:
    last = 0
    for i in range(0, len(y), batch):
        rows = zip(X[i : i + batch], y[i : i + batch], strict=True)
        samples = [{"x": row.tolist(), "y": label} for row, label in rows]
        last = query_api.post(f"/v1/models/{name}/samples", json={"samples": samples}).json()[
            "last_seq"
        ]
    return last


@pytest.mark.parametrize("normalize", ["none", "l2"])
def test_service_equals_the_core_on_a_recorded_stream(
    query_api: httpx.Client, name: str, normalize: str
) -> None:
    X, y = stream(600, 6, 4, seed=11)
    make_model(query_api, name, seed=5, normalize=normalize, **PARAMS)
    last = feed(query_api, name, X, y)
    ref = core_learner(X, y, seed=5, normalize=normalize, **PARAMS)

    got = query_api.get(f"/v1/models/{name}/metric", params={"min_version": last}).json()
    assert got["version"] == last == 600
    np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)

    model = query_api.get(f"/v1/models/{name}").json()
    counts = ref.counts
    assert model["updates"]["triplet"] == counts["triplet_update"] + counts["shrunk_update"]
    assert model["updates"]["pair"] == counts["pair_update"]
    assert model["updates"]["passive"] == counts["passive"] and model["classes"] == 4
    cal = ref.calibrator.calibration()
    assert model["verification"]["calibrated"] is cal.calibrated is True
    assert model["verification"]["threshold"] == pytest.approx(cal.threshold, rel=1e-9)
    assert model["verification"]["eer"] == pytest.approx(cal.eer)
    assert model["verification"]["accuracy"] == pytest.approx(cal.accuracy)

    a, b, B = X[0] * 3, X[1], X[2:7]
    one = query_api.post(
        f"/v1/models/{name}/distance", json={"a": a.tolist(), "b": b.tolist()}
    ).json()
    assert one["squared_distance"] == pytest.approx(ref.squared_distance(a, b), rel=1e-12)
    assert one["distance"] == pytest.approx(ref.distance(a, b), rel=1e-12)
    assert one["version"] == 600
    many = query_api.post(
        f"/v1/models/{name}/distance", json={"a": a.tolist(), "b": B.tolist()}
    ).json()
    np.testing.assert_allclose(many["squared_distances"], ref.squared_distances(a, B), rtol=1e-12)
    np.testing.assert_allclose(many["distances"], np.sqrt(ref.squared_distances(a, B)), rtol=1e-12)

    z = query_api.post(f"/v1/models/{name}/transform", json={"x": X[:5].tolist()}).json()
    np.testing.assert_allclose(np.array(z["z"]), ref.transform(X[:5]), rtol=1e-12, atol=1e-12)

    v = query_api.post(f"/v1/models/{name}/verify", json={"a": a.tolist(), "b": b.tolist()}).json()
    assert v["threshold_source"] == "calibrated" and v["calibrated"] is True
    assert v["threshold"] == pytest.approx(cal.threshold, rel=1e-9)
    assert v["same"] is (ref.squared_distance(a, b) <= cal.threshold)

    npy = query_api.get(f"/v1/models/{name}/metric", headers={"Accept": "application/x-npy"})
    assert npy.headers["content-type"] == "application/x-npy"
    np.testing.assert_allclose(np.load(io.BytesIO(npy.content)), ref.L, rtol=0, atol=1e-12)


def test_verify_threshold_sources(query_api: httpx.Client, name: str) -> None:
    make_model(query_api, name, 2, margin=2.5)
    pair = {"a": [0, 0], "b": [1, 1]}
    fresh = query_api.post(f"/v1/models/{name}/verify", json=pair).json()
    assert (fresh["threshold_source"], fresh["threshold"], fresh["calibrated"]) == (
        "fallback:margin", 2.5, False,
    )  # fmt: skip
    assert fresh["same"] is True and fresh["squared_distance"] == 2.0
    caller = query_api.post(f"/v1/models/{name}/verify", json={**pair, "threshold": 1.0}).json()
    assert (caller["threshold_source"], caller["same"]) == ("caller", False)
    assert_problem(query_api.post(f"/v1/models/{name}/verify", json={**pair, "threshold": -1}), 422)


def test_queries_carry_version_and_honour_min_version(query_api: httpx.Client, name: str) -> None:
    make_model(query_api, name, 2)
    pair = {"a": [0, 0], "b": [1, 1]}
    assert query_api.post(f"/v1/models/{name}/distance", json=pair).json()["version"] == 0
    last = query_api.post(f"/v1/models/{name}/samples", json={"x": [1, 1], "y": 1}).json()[
        "last_seq"
    ]
    got = query_api.post(f"/v1/models/{name}/distance", json=pair, params={"min_version": last})
    assert got.json()["version"] >= last
    late = query_api.post(
        f"/v1/models/{name}/distance", json=pair, params={"min_version": last + 5}
    )
    problem = assert_problem(late, 503)  # never reaches it within OPML_MIN_VERSION_WAIT_S
    assert int(late.headers["Retry-After"]) >= 1 and problem["version"] == last


def test_query_errors(query_api: httpx.Client, name: str) -> None:
    make_model(query_api, name, 2)
    url = f"/v1/models/{name}"
    assert_problem(query_api.post(url + "/distance", json={"a": [0, 0], "b": [1]}), 422)
    assert_problem(query_api.post(url + "/distance", json={"a": [0, 0], "b": [[1, 1], [1]]}), 422)
    assert_problem(query_api.post(url + "/distance", json={"a": [0, 0]}), 422)
    assert_problem(query_api.post(url + "/transform", json={"x": [[1, 2, 3]]}), 422)
    assert_problem(query_api.post(url + "/transform", json={"x": []}), 422)
    assert_problem(query_api.post("/v1/models/ghost/distance", json={"a": [0], "b": [1]}), 404)
    assert_problem(query_api.get("/v1/models/ghost/metric"), 404)
    huge = {"a": [1e300, 0], "b": [-1e300, 0]}  # finite inputs whose distance overflows
    assert (
        "overflows" in assert_problem(query_api.post(url + "/distance", json=huge), 422)["detail"]
    )
    assert_problem(query_api.post(url + "/verify", json=huge), 422)
    assert query_api.post(url + "/distance", json={"a": [1e150, 0], "b": [0, 0]}).json()[
        "distance"
    ] == pytest.approx(1e150)


def test_put_metric_is_ordered_in_the_log(query_api: httpx.Client, name: str) -> None:
    X, y = stream(120, 3, 3, seed=2)
    make_model(query_api, name, 3, gamma=0.05, seed=9)
    feed(query_api, name, X[:70], y[:70])
    L0 = np.array([[2.0, 0.1, 0], [0, 1.0, 0], [0.3, 0, 0.5]])
    put = query_api.put(f"/v1/models/{name}/metric", json={"L": L0.tolist()})
    assert put.status_code == 200
    assert (put.json()["version"], put.json()["metric_puts"]) == (70, 1)
    assert query_api.get(f"/v1/models/{name}/metric").json()["L"] == L0.tolist()
    last = feed(query_api, name, X[70:], y[70:])

    ref = core_learner(X[:70], y[:70], dim=3, gamma=0.05, seed=9)
    ref.set_metric(L0)
    ref.learn_many(X[70:], y[70:])
    got = query_api.get(f"/v1/models/{name}/metric", params={"min_version": last}).json()
    np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)

    assert_problem(query_api.put(f"/v1/models/{name}/metric", json={"L": [[1, 0], [0, 1]]}), 422)
    non_finite = b'{"L": [[1, 0, 0], [0, Infinity, 0], [0, 0, 1]]}'
    response = query_api.put(f"/v1/models/{name}/metric", content=non_finite,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert_problem(response, 422)
    assert_problem(query_api.put("/v1/models/ghost/metric", json={"L": [[1.0]]}), 404)
    assert query_api.get(f"/v1/models/{name}").json()["metric_puts"] == 1
