"""One-to-many distance with a binary body (.npz in, .npy out), and the lean query path:
its answers equal the routes', and every refusal is a problem that changes nothing.

Every test here runs twice: against the shared service (lean path on) and against its twin with
the lean path off (``OPML_LEAN_PATH=false``), so the two paths cannot drift apart."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from service.api.routes.queries import THREAD_VALUES
from tests.service.support import (
    Launch,
    RedisServer,
    ServiceProcess,
    assert_problem,
    core_learner,
    lean_count,
    make_model,
    settled,
    stream,
)

NPZ = {"content-type": "application/x-npz"}
JSON_TYPE = {"content-type": "application/json"}
NPY = "application/x-npy"
D = 16
PARAMS = {"dim": D, "gamma": 0.02, "seed": 3}


def npz(stored: bool = True, **arrays: Any) -> bytes:
    buf = io.BytesIO()
    (np.savez if stored else np.savez_compressed)(buf, **arrays)
    return buf.getvalue()


@pytest.fixture
def api(query_api: httpx.Client) -> httpx.Client:
    """The lean path, then the routes alone (see ``query_api``)."""
    return query_api


@pytest.fixture
def trained(api: httpx.Client, name: str) -> tuple[str, np.ndarray, list[str]]:
    X, y = stream(300, D, 5, seed=4)
    make_model(api, name, **PARAMS)
    samples = [{"x": row.tolist(), "y": label} for row, label in zip(X, y, strict=True)]
    assert api.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples}).is_success
    return name, X, y


@pytest.mark.parametrize("rows", [3, 10 * D])  # below and above 4d rows (the R factor)
def test_binary_one_to_many_equals_the_json_answer(
    api: httpx.Client, trained: tuple[str, np.ndarray, list[str]], rows: int
) -> None:
    name, X, y = trained
    url = f"/v1/models/{name}/distance"
    rng = np.random.default_rng(rows)
    a, B = X[0] + rng.normal(size=D), rng.normal(size=(rows, D))
    B[1] = a  # a zero distance stays exactly zero
    by_json = api.post(url, json={"a": a.tolist(), "b": B.tolist()})
    assert by_json.status_code == 200 and by_json.json()["version"] == 300
    by_npz = api.post(url, content=npz(a=a, b=B), headers=NPZ)
    assert by_npz.status_code == 200 and by_npz.headers["content-type"] == "application/json"
    assert by_npz.json() == by_json.json()  # the same float64 values, the same arithmetic
    raw = api.post(url, content=npz(a=a, b=B), headers={**NPZ, "accept": NPY})
    assert raw.headers["content-type"] == NPY and raw.headers["x-version"] == "300"
    sq = np.load(io.BytesIO(raw.content), allow_pickle=False)
    assert sq.dtype == np.float64 and sq.shape == (rows,) and sq[1] == 0.0
    np.testing.assert_array_equal(sq, by_json.json()["squared_distances"])
    np.testing.assert_array_equal(np.sqrt(sq), by_json.json()["distances"])
    json_npy = api.post(url, json={"a": a.tolist(), "b": B.tolist()}, headers={"accept": NPY})
    assert json_npy.content == raw.content  # Accept works for a JSON body too

    ref = core_learner(X, y, **PARAMS)
    np.testing.assert_allclose(sq, ref.squared_distances(a, B), rtol=1e-12)
    Z = (B - a) @ ref.L.T  # the plain formula (Eq. 2): the factored path agrees to rounding
    np.testing.assert_allclose(sq, np.einsum("ij,ij->i", Z, Z), rtol=1e-9, atol=1e-12)

    # float32 and Fortran-ordered arrays: the values they hold, computed in float64
    a32, B32 = a.astype(np.float32), np.asfortranarray(B.astype(">f4"))
    f32 = api.post(url, content=npz(stored=False, a=a32, b=B32), headers=NPZ)
    as_json = api.post(url, json={"a": a32.tolist(), "b": B32.astype(np.float64).tolist()})
    assert f32.json() == as_json.json()

    pair = api.post(url, json={"a": a.tolist(), "b": B[0].tolist()}, headers={"accept": NPY})
    assert pair.headers["content-type"] == "application/json"  # one pair: always JSON
    assert pair.json()["squared_distance"] == pytest.approx(by_json.json()["squared_distances"][0])


def test_many_candidate_rows_are_computed_off_the_event_loop_and_equals_json(
    tmp_path_factory: pytest.TempPathFactory, launch: Launch
) -> None:
    """Over ``THREAD_VALUES`` values the distances are computed in a worker thread, by the
    triangular factor: the same answer through JSON and .npz, equal to the plain formula."""
    d, rows = 128, 600
    assert rows * d >= THREAD_VALUES
    redis_server = RedisServer(tmp_path_factory.mktemp("redis-one-to-many")).start()
    proc = launch(
        tmp_path_factory.mktemp("one-to-many"), redis_server.url, OPML_MAX_BODY_BYTES=str(8 << 20)
    ).start()
    try:
        with proc.client() as api:
            X, y = stream(400, d, 6, seed=9)
            make_model(api, "big", d, normalize="l2", gamma=0.01)
            samples = [{"x": row.tolist(), "y": label} for row, label in zip(X, y, strict=True)]
            api.post("/v1/models/big/samples?wait=true", json={"samples": samples})
            rng = np.random.default_rng(5)
            a, B = rng.normal(size=d), rng.normal(size=(rows, d))
            url = "/v1/models/big/distance"
            by_json = api.post(url, json={"a": a.tolist(), "b": B.tolist()}).json()
            by_npz = api.post(url, content=npz(a=a, b=B), headers={**NPZ, "accept": NPY})
            sq = np.load(io.BytesIO(by_npz.content), allow_pickle=False)
            np.testing.assert_array_equal(sq, by_json["squared_distances"])
            ref = core_learner(X, y, dim=d, normalize="l2", gamma=0.01)
            an = a / np.linalg.norm(a)
            Bn = B / np.linalg.norm(B, axis=1, keepdims=True)
            Z = (Bn - an) @ ref.L.T
            np.testing.assert_allclose(sq, np.einsum("ij,ij->i", Z, Z), rtol=1e-9)
    finally:
        proc.stop()
        redis_server.stop()


def _pickled_object_array() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, a=np.array([{"x": 1}, "y"], dtype=object), b=np.zeros((2, D)))
    return buf.getvalue()


def _hand_made_pickle() -> bytes:
    """An .npy member whose header says object dtype and whose data is a pickle."""
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }"
    header += b" " * (63 - len(header) % 64) + b"\n"
    member = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("a.npy", member + pickle.dumps(["boom"]))
        b = io.BytesIO()
        np.save(b, np.zeros((2, D)))
        archive.writestr("b.npy", b.getvalue())
    return buf.getvalue()


def _truncated() -> bytes:
    body = npz(a=np.ones(D), b=np.ones((40, D)))
    return body[: len(body) // 2]


def _with_nan() -> bytes:
    B = np.ones((5, D))
    B[3, 2] = np.nan
    return npz(a=np.ones(D), b=B)


BAD: list[tuple[str, bytes, int, list[Any] | None]] = [
    # (case, body, status, errors[0].loc or None)
    ("garbage bytes", b"\x00not a zip archive\xff" * 10, 422, ["body"]),
    ("empty body", b"", 422, ["body"]),
    ("JSON sent as npz", b'{"a": [1], "b": [[1]]}', 422, ["body"]),
    ("pickled object array", _pickled_object_array(), 422, ["body", "a"]),
    ("hand-made pickle", _hand_made_pickle(), 422, ["body", "a"]),
    ("integer dtype", npz(a=np.arange(D), b=np.ones((2, D))), 422, ["body", "a"]),
    ("complex dtype", npz(a=np.ones(D, complex), b=np.ones((2, D))), 422, ["body", "a"]),
    ("a 2-D", npz(a=np.ones((1, D)), b=np.ones((2, D))), 422, ["body", "a"]),
    ("b 1-D", npz(a=np.ones(D), b=np.ones(D)), 422, ["body", "b"]),
    ("b without rows", npz(a=np.ones(D), b=np.ones((0, D))), 422, ["body", "b"]),
    ("b of the wrong dim", npz(a=np.ones(D), b=np.ones((2, D + 1))), 422, ["body", "b"]),
    ("a of the wrong dim", npz(a=np.ones(D - 1), b=np.ones((2, D))), 422, ["body", "a"]),
    ("NaN in b", _with_nan(), 422, ["body", "b"]),
    ("Inf in a", npz(a=np.full(D, np.inf), b=np.ones((2, D))), 422, ["body", "a"]),
    ("a missing", npz(b=np.ones((2, D))), 422, ["body", "a"]),
    ("b missing", npz(a=np.ones(D)), 422, ["body", "b"]),
    ("extra array", npz(a=np.ones(D), b=np.ones((2, D)), c=np.ones(2)), 422, ["body"]),
    ("truncated archive", _truncated(), 422, ["body"]),
    ("inflates past the body limit", npz(False, a=np.ones(D), b=np.zeros((2000, D))), 422,
     ["body", "b"]),
    ("over the body limit", npz(a=np.ones(D), b=np.ones((2000, D))), 413, None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "status", "loc"), BAD, ids=[c[0] for c in BAD])
def test_bad_npz_bodies_are_problems_and_change_nothing(
    api: httpx.Client,
    trained: tuple[str, np.ndarray, list[str]],
    case: str,
    body: bytes,
    status: int,
    loc: list[Any] | None,
) -> None:
    name = trained[0]
    before = settled(api, name)
    response = api.post(f"/v1/models/{name}/distance", content=body, headers=NPZ)
    problem = assert_problem(response, status)
    if loc is not None:
        assert problem["errors"][0]["loc"] == loc, problem
    assert "Traceback" not in response.text and "boom" not in response.text
    assert settled(api, name) == before


def test_a_chunked_npz_body_over_the_limit_is_cut_off(
    api: httpx.Client, trained: tuple[str, np.ndarray, list[str]]
) -> None:
    name = trained[0]
    body = npz(a=np.ones(D), b=np.ones((4000, D)))  # 512 KB, the limit is 200 KB

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    response = api.post(f"/v1/models/{name}/distance", content=chunks(), headers=NPZ)
    assert "OPML_MAX_BODY_BYTES" in assert_problem(response, 413)["detail"]


def test_npz_elsewhere_is_refused(
    api: httpx.Client, trained: tuple[str, np.ndarray, list[str]]
) -> None:
    name = trained[0]
    good = npz(a=np.ones(D), b=np.ones((2, D)))
    assert_problem(api.post("/v1/models/ghost/distance", content=good, headers=NPZ), 404)
    # verify reads JSON only: another media type is 415, naming what it accepts
    wrong = assert_problem(api.post(f"/v1/models/{name}/verify", content=good, headers=NPZ), 415)
    assert wrong["accepted"] == ["application/json"]
    late = api.post(f"/v1/models/{name}/distance?min_version=10000", content=good, headers=NPZ)
    assert int(assert_problem(late, 503)["version"]) == 300


# -- the lean path answers exactly like the routes ------------------------------------------

CASES: list[tuple[str, str, bytes]] = [
    ("distance", "", b'{"a": [1, 2], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1, 2], "b": [[0, 1], [3, 4]]}'),
    ("distance", "?min_version=0", b'{"a": [1, 2], "b": [0, 1]}'),
    ("distance", "?min_version=0&x=1", b'{"a": [1, 2], "b": [0, 1]}'),
    ("verify", "", b'{"a": [1, 2], "b": [0, 1]}'),
    ("verify", "", b'{"a": [1, 2], "b": [0, 1], "threshold": 0.5}'),
    ("distance", "", b'{"a": [NaN, 2], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1, 2], "b": [[0, 1], [Infinity, 1]]}'),
    ("verify", "", b'{"a": [1e400, 2], "b": [0, 1]}'),
    ("verify", "", b'{"a": [' + b"9" * 400 + b', 2], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1e300, 0], "b": [-1e300, 0]}'),
    ("distance", "", b'{"a": [1, "2"], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1, true], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1, 2, 3], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1, 2], "b": [[0, 1], [1]]}'),
    ("distance", "", b'{"a": [1, 2]}'),
    ("verify", "", b'{"a": [1, 2], "b": [0, 1], "extra": 1}'),
    ("verify", "", b'{"a": [1, 2], "b": [0, 1], "threshold": -1}'),
    ("verify", "", b'{"a": [1, 2], "b": [[0, 1]]}'),
    ("distance", "", b'{"a": [1, 2], "b": [0, 1],}'),
    ("distance", "", b"\xef\xbb\xbf" + b'{"a": [1, 2], "b": [0, 1]}'),
    ("distance", "", b'{"a": [1, 2], "b": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("distance", "", b"[1, 2]"),
    ("distance", "", b""),
    ("distance", "?min_version=-1", b'{"a": [1, 2], "b": [0, 1]}'),
    ("distance", "?min_version=x", b'{"a": [1, 2], "b": [0, 1]}'),
    ("distance", "?min_version=" + "9" * 19, b'{"a": [1, 2], "b": [0, 1]}'),
    ("distance", "?min_version=" + "9" * 21, b'{"a": [1, 2], "b": [0, 1]}'),
]


def _same_answers(
    service: ServiceProcess, routes_service: ServiceProcess, name: str, send: Any
) -> httpx.Response:
    """``send(client)`` to the lean service and to its routes-only twin: the same answer."""
    with service.client() as lean_client, routes_service.client() as route_client:
        make_model(lean_client, name, 2, normalize="l2")
        make_model(route_client, name, 2, normalize="l2")
        lean, route = send(lean_client), send(route_client)
    assert lean.status_code == route.status_code, (lean.text, route.text)
    assert lean.headers["content-type"] == route.headers["content-type"]
    assert lean.headers.get("retry-after") == route.headers.get("retry-after")
    assert lean.json() == route.json()
    if lean.status_code >= 400:
        assert_problem(lean, lean.status_code)
    return lean


@pytest.mark.parametrize(("what", "query", "body"), CASES)
def test_the_lean_path_answers_exactly_like_the_route(
    service: ServiceProcess,
    routes_service: ServiceProcess,
    name: str,
    what: str,
    query: str,
    body: bytes,
) -> None:
    url = f"/v1/models/{name}/{what}{query}"
    _same_answers(
        service, routes_service, name, lambda c: c.post(url, content=body, headers=JSON_TYPE)
    )


@pytest.mark.parametrize(
    "query", ["?min_version=0&x=1", "?min_version=" + "9" * 19, "?min_version=abc", ""]
)
def test_an_npz_query_answers_like_its_json_twin(
    service: ServiceProcess, routes_service: ServiceProcess, name: str, query: str
) -> None:
    url = f"/v1/models/{name}/distance{query}"
    body = npz(a=np.ones(2), b=np.ones((3, 2)))
    got = _same_answers(
        service, routes_service, name, lambda c: c.post(url, content=body, headers=NPZ)
    )
    with service.client() as client:
        twin = client.post(url, json={"a": [1.0, 1.0], "b": [[1.0, 1.0]] * 3})
    assert (got.status_code, got.json()) == (twin.status_code, twin.json())


def test_a_model_name_the_route_refuses_is_refused_alike(
    service: ServiceProcess, routes_service: ServiceProcess
) -> None:
    for path in ("/v1/models/Bad!/distance", "/v1/models/ghost/verify"):
        body = json.dumps({"a": [1], "b": [1]})
        with service.client() as lean_client, routes_service.client() as route_client:
            lean = lean_client.post(path, content=body, headers=JSON_TYPE)
            route = route_client.post(path, content=body, headers=JSON_TYPE)
        assert (lean.status_code, lean.json()) == (route.status_code, route.json())
        assert_problem(lean, lean.status_code)


def test_the_lean_path_is_taken_when_on_and_only_then(
    service: ServiceProcess, routes_service: ServiceProcess, name: str
) -> None:
    route = "/v1/models/{name}/distance"
    for proc, taken in ((service, 3.0), (routes_service, 0.0)):
        with proc.client() as client:
            make_model(client, name, 2)
            before = lean_count(client, route)
            for _ in range(3):
                client.post(f"/v1/models/{name}/distance", json={"a": [1, 2], "b": [0, 1]})
            assert lean_count(client, route) - before == taken


def test_lean_answers_are_counted_under_the_route_template(
    service: ServiceProcess, name: str
) -> None:
    with service.client() as api:
        make_model(api, name, 2)
        for _ in range(3):
            api.post(f"/v1/models/{name}/distance", json={"a": [1, 2], "b": [0, 1]})
        metrics = api.get("/metrics").text
    assert 'route="/v1/models/{name}/distance",status="200"' in metrics
    assert name not in "".join(line for line in metrics.splitlines() if "http_request" in line)
