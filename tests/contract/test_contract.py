"""The HTTP contract of the main endpoints, in process (``api``: the app through httpx's ASGI
transport on a real redis-server): models, samples, distance, verify, transform and metric,
the binary bodies and answers, and refusals as problem+json that change nothing. Every figure
is compared with the core learner on the same samples."""

from __future__ import annotations

import io
from typing import Any

import httpx
import numpy as np
import pytest

from tests.service.support import assert_problem, core_learner, make_model, settled, stream

PARAMS: dict[str, Any] = {"gamma": 0.05, "seed": 4}


def feed(api: httpx.Client, name: str, X: np.ndarray, y: list[str]) -> dict[str, Any]:
    samples = [{"x": row.tolist(), "y": label} for row, label in zip(X, y, strict=True)]
    response = api.post(
        f"/v1/models/{name}/samples", json={"samples": samples}, params={"wait": "true"}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def learned(api: httpx.Client, name: str, n: int = 80) -> tuple[np.ndarray, list[str]]:
    """A model of dim 3 that learned ``n`` samples (answered once applied: ``wait``)."""
    X, y = stream(n, 3, 3, seed=7)
    make_model(api, name, 3, **PARAMS)
    assert feed(api, name, X, y)["last_seq"] == n
    return X, y


def test_create_get_list_delete(api: httpx.Client, name: str) -> None:
    created = make_model(api, name, 4, normalize="l2", **PARAMS)
    assert (created["name"], created["dim"], created["version"]) == (name, 4, 0)
    assert created["normalize"] == "l2" and created["samples_seen"] == 0
    assert api.get(f"/v1/models/{name}").json()["dim"] == 4
    assert name in [m["name"] for m in api.get("/v1/models").json()["models"]]
    assert_problem(api.post("/v1/models", json={"name": name, "dim": 4}), 409)
    assert api.delete(f"/v1/models/{name}").status_code == 204
    assert_problem(api.get(f"/v1/models/{name}"), 404)
    assert_problem(api.delete(f"/v1/models/{name}"), 404)


@pytest.mark.parametrize(
    "body",
    [
        {"name": "Upper-Case", "dim": 2},
        {"name": "ok-name", "dim": 0},
        {"name": "ok-name", "dim": 65},  # over OPML_MAX_DIM
        {"name": "ok-name", "dim": 2, "gamma": -1},
        {"name": "ok-name", "dim": 2, "algorithm": "nope"},
        {"dim": 2},
    ],
)
def test_create_refusals_name_the_field_and_create_nothing(
    api: httpx.Client, body: dict[str, Any]
) -> None:
    problem = assert_problem(api.post("/v1/models", json=body), 422)
    assert problem["type"].endswith("/validation") or "errors" in problem
    assert "ok-name" not in [m["name"] for m in api.get("/v1/models").json()["models"]]


def test_samples_learn_exactly_what_the_core_learns(api: httpx.Client, name: str) -> None:
    X, y = learned(api, name)
    ref = core_learner(X, y, dim=3, **PARAMS)
    metric = api.get(f"/v1/models/{name}/metric", params={"min_version": 80}).json()
    assert metric["version"] == 80
    np.testing.assert_allclose(np.array(metric["L"]), ref.L, rtol=0, atol=1e-12)
    model = api.get(f"/v1/models/{name}").json()
    assert (model["samples_seen"], model["classes"]) == (80, 3)


def test_an_idempotency_key_replays_and_logs_nothing_twice(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    url, body = f"/v1/models/{name}/samples", {"samples": [{"x": [1, 0], "y": "a"}] * 2}
    first = api.post(url, json=body, headers={"Idempotency-Key": "k1"})
    again = api.post(url, json=body, headers={"Idempotency-Key": "k1"})
    assert first.json() == again.json() == {"accepted": 2, "first_seq": 1, "last_seq": 2}
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert api.post(url, json={"x": [0, 1], "y": "b"}).json()["first_seq"] == 3


def test_distance_verify_transform_equal_the_core(api: httpx.Client, name: str) -> None:
    X, y = learned(api, name)
    ref = core_learner(X, y, dim=3, **PARAMS)
    a, b, B = X[0], X[1], X[2:9]
    url = f"/v1/models/{name}"
    one = api.post(url + "/distance", json={"a": a.tolist(), "b": b.tolist()}).json()
    assert one["squared_distance"] == pytest.approx(ref.squared_distance(a, b), rel=1e-12)
    assert one["distance"] == pytest.approx(ref.distance(a, b), rel=1e-12)
    assert one["version"] == 80
    many = api.post(url + "/distance", json={"a": a.tolist(), "b": B.tolist()}).json()
    np.testing.assert_allclose(many["squared_distances"], ref.squared_distances(a, B), rtol=1e-12)
    np.testing.assert_allclose(many["distances"], np.sqrt(many["squared_distances"]), rtol=1e-15)

    threshold = float(ref.squared_distance(a, b)) * 1.5
    v = api.post(url + "/verify", json={"a": a.tolist(), "b": b.tolist(), "threshold": threshold})
    assert v.status_code == 200
    assert (v.json()["same"], v.json()["threshold_source"]) == (True, "caller")
    v = api.post(url + "/verify", json={"a": a.tolist(), "b": b.tolist(), "threshold": 0.0})
    assert v.json()["same"] is (ref.squared_distance(a, b) <= 0.0)

    z = api.post(url + "/transform", json={"x": X[:4].tolist()}).json()
    np.testing.assert_allclose(np.array(z["z"]), ref.transform(X[:4]), rtol=1e-12, atol=1e-12)


def test_binary_bodies_and_answers(api: httpx.Client, name: str) -> None:
    """An ``.npz`` one-to-many body answered as ``.npy`` squared distances, and ``L`` as
    ``.npy``: bit for bit what the JSON answers carry."""
    X, _ = learned(api, name)
    url = f"/v1/models/{name}"
    buf = io.BytesIO()
    np.savez(buf, a=X[0], b=X[1:6].astype(np.float32))
    answer = api.post(
        url + "/distance",
        content=buf.getvalue(),
        headers={"Content-Type": "application/x-npz", "Accept": "application/x-npy"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-npy"
    assert int(answer.headers["x-version"]) == 80
    squared = np.load(io.BytesIO(answer.content), allow_pickle=False)
    B = X[1:6].astype(np.float32).astype(np.float64).tolist()
    as_json = api.post(url + "/distance", json={"a": X[0].tolist(), "b": B}).json()
    np.testing.assert_array_equal(squared, as_json["squared_distances"])

    npy = api.get(url + "/metric", headers={"Accept": "application/x-npy"})
    assert npy.headers["content-type"] == "application/x-npy"
    L = np.load(io.BytesIO(npy.content), allow_pickle=False)
    np.testing.assert_array_equal(L, api.get(url + "/metric").json()["L"])


def npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


BAD_NPZ = [
    ("not a zip", b"PK\x03\x04 not really"),
    ("no b", npz(a=np.zeros(3))),
    ("b of the wrong width", npz(a=np.zeros(3), b=np.zeros((2, 4)))),
    ("NaN in b", npz(a=np.zeros(3), b=np.array([[0.0, np.nan, 1.0]]))),
    ("integers", npz(a=np.zeros(3, dtype=np.int64), b=np.zeros((2, 3), dtype=np.int64))),
    ("pickled objects", npz(a=np.zeros(3), b=np.array([[object()] * 3], dtype=object))),
]


@pytest.mark.parametrize(("case", "body"), BAD_NPZ, ids=[c[0] for c in BAD_NPZ])
def test_malformed_binary_bodies_are_422_problems(
    api: httpx.Client, name: str, case: str, body: bytes
) -> None:
    make_model(api, name, 3)
    answer = api.post(
        f"/v1/models/{name}/distance",
        content=body,
        headers={"Content-Type": "application/x-npz", "Accept": "application/x-npy"},
    )
    problem = assert_problem(answer, 422)
    assert "body" in str(problem), case


NASTY_SAMPLES: list[tuple[str, bytes | None, Any, int]] = [
    ("NaN", b'{"x": [NaN, 1], "y": "a"}', None, 422),
    ("not JSON", b"{'x': [1, 2]}", None, 422),
    ("wrong dim", None, {"x": [1, 2, 3], "y": "a"}, 422),
    ("empty batch", None, {"samples": []}, 422),
    ("batch over OPML_MAX_BATCH", None, {"samples": [{"x": [1, 2], "y": 1}] * 501}, 422),
    ("body over OPML_MAX_BODY_BYTES", None, {"x": [1, 2], "y": "z" * 300_000}, 413),
    ("a boolean label", None, {"x": [1, 2], "y": True}, 422),
]


@pytest.mark.parametrize(
    ("case", "raw", "body", "status"), NASTY_SAMPLES, ids=[c[0] for c in NASTY_SAMPLES]
)
def test_refused_samples_are_problems_and_change_nothing(
    api: httpx.Client, name: str, case: str, raw: bytes | None, body: Any, status: int
) -> None:
    make_model(api, name, 2)
    api.post(f"/v1/models/{name}/samples", json={"x": [1, 0], "y": "seed"}, params={"wait": "1"})
    before = settled(api, name)
    url = f"/v1/models/{name}/samples"
    if raw is not None:
        response = api.post(url, content=raw, headers={"content-type": "application/json"})
    else:
        response = api.post(url, json=body)
    assert_problem(response, status)
    assert settled(api, name) == before


def test_query_refusals_are_problems(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    url = f"/v1/models/{name}"
    assert_problem(api.post(url + "/distance", json={"a": [0, 0], "b": [1]}), 422)
    assert_problem(api.post(url + "/verify", json={"a": [0, 0], "b": [1, 1], "threshold": -1}), 422)
    assert_problem(api.post(url + "/transform", json={"x": [[1, 2, 3]]}), 422)
    assert_problem(api.post("/v1/models/ghost-model/distance", json={"a": [0], "b": [1]}), 404)
    late = api.post(url + "/distance", json={"a": [0, 0], "b": [1, 1]}, params={"min_version": 5})
    assert_problem(late, 503)  # never reached within OPML_MIN_VERSION_WAIT_S
    assert int(late.headers["Retry-After"]) >= 1
    unknown = api.get("/v1/no-such-route")
    assert_problem(unknown, 404)
