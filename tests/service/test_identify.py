"""Identification against the server-side gallery, on the real service: every answer equals
the brute force with the answered version's ``L`` (ties by id), idle and while samples stream
in; enrols are durable (restart, kill -9 of the service and of Redis); deletes, limits,
idempotency, and bad input as problems that change nothing."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from service.core import Learner, LearnerConfig, normalize_rows
from tests.service.placement import eventually, placed
from tests.service.support import (
    SHARED_ENV,
    Launch,
    RedisServer,
    assert_problem,
    make_model,
    scrape,
    series,
    stream,
)

NPZ = "application/x-npz"
NPY = "application/x-npy"
MAX_GALLERY = int(SHARED_ENV["OPML_MAX_GALLERY"])


def enrol(api: httpx.Client, name: str, ids: list[Any], G: np.ndarray, ys: list[Any] | None = None,
          **headers: str) -> httpx.Response:  # fmt: skip
    items = []
    for i, (item_id, x) in enumerate(zip(ids, G, strict=True)):
        item: dict[str, Any] = {"id": item_id, "x": x.tolist()}
        if ys is not None:
            item["y"] = ys[i]
        items.append(item)
    return api.post(f"/v1/models/{name}/gallery", json={"items": items}, headers=headers)


def brute_force(
    Q: np.ndarray, G: np.ndarray, ids: list[Any], L: np.ndarray, k: int, normalize: str
) -> list[list[tuple[Any, float]]]:
    """The k nearest gallery items of each query by ``||L(q - g)||^2`` (Eq. 2), ties by the id's
    string form: numpy, once per distinct gallery vector (equal rows, equal values)."""
    Qn, Gn = normalize_rows(Q, normalize), normalize_rows(G, normalize)
    unique, inverse = np.unique(Gn, axis=0, return_inverse=True)
    out = []
    for q in Qn:
        diff = (q - unique) @ L.T
        sq = np.einsum("ij,ij->i", diff, diff)[inverse.ravel()]
        order = sorted(range(len(ids)), key=lambda i: (sq[i], str(ids[i])))[:k]
        out.append([(ids[i], float(sq[i])) for i in order])
    return out


def assert_brute_force(answer: list[dict[str, Any]], expected: list[tuple[Any, float]]) -> None:
    assert [m["id"] for m in answer] == [item_id for item_id, _ in expected]
    np.testing.assert_allclose([m["squared_distance"] for m in answer],
                               [sq for _, sq in expected], rtol=1e-9, atol=1e-12)  # fmt: skip


def metric_at(api: httpx.Client, name: str, version: int) -> np.ndarray:
    response = api.get(
        f"/v1/models/{name}/metric", params={"min_version": version}, headers={"accept": NPY}
    )
    assert response.headers["x-version"] == str(version)
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def gallery_of(n: int, d: int, seed: int) -> tuple[list[Any], np.ndarray]:
    """``n`` items with mixed id types and three exact duplicates (ties broken by id)."""
    rng = np.random.default_rng(seed)
    G = rng.normal(size=(n, d)) * 1.5
    G[5] = G[17] = G[2]  # ids 2, "17", 5: equal vectors
    ids: list[Any] = [i if i % 3 else f"{i}" for i in range(n)]
    ids[17] = "17"
    return ids, G


def test_identify_equals_the_brute_force_with_ties_by_id(
    query_api: httpx.Client, name: str
) -> None:
    api = query_api  # the lean path, then the routes alone (both must answer alike)
    d = 16
    X, y = stream(300, d, 5, seed=1)
    make_model(api, name, d, gamma=0.02, seed=3)
    samples = [{"x": r.tolist(), "y": lab} for r, lab in zip(X, y, strict=True)]
    assert api.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples}).is_success
    ids, G = gallery_of(120, d, seed=2)
    labels = [f"person-{i % 7}" for i in range(120)]
    done = enrol(api, name, ids, G, labels)
    assert done.status_code == 200 and done.json() == {"enrolled": 120, "replaced": 0, "size": 120}
    L = metric_at(api, name, 300)

    rng = np.random.default_rng(4)
    Q = np.vstack([rng.normal(size=(6, d)), G[[2, 40]]])  # two queries on enrolled vectors
    for k in (1, 4, 120):
        many = api.post(f"/v1/models/{name}/identify", json={"xs": Q.tolist(), "k": k}).json()
        assert many["version"] == 300 and len(many["results"]) == len(Q)
        for result, expected in zip(many["results"], brute_force(Q, G, ids, L, k, "none"),
                                    strict=True):  # fmt: skip
            assert_brute_force(result["matches"], expected)
    one = api.post(f"/v1/models/{name}/identify", json={"x": G[2].tolist(), "k": 3}).json()
    # distance 0 three times: ties by the id's string form, "17" < "2" < "5"
    assert [(m["id"], m["y"]) for m in one["matches"]] == [
        ("17", "person-3"), (2, "person-2"), (5, "person-5")
    ]  # fmt: skip
    assert all(m["squared_distance"] == 0.0 and m["same"] for m in one["matches"])
    assert one["version"] == 300
    model = api.get(f"/v1/models/{name}").json()
    assert (
        one["threshold_source"] != "caller"
        and one["calibrated"] == (model["verification"]["calibrated"])
    )

    # same: squared_distance <= threshold, the caller's threshold said so
    url = f"/v1/models/{name}/identify"
    plain = api.post(url, json={"x": Q[0].tolist(), "k": 120}).json()["matches"]
    threshold = float(np.median([m["squared_distance"] for m in plain]))
    far = api.post(url, json={"x": Q[0].tolist(), "k": 120, "threshold": threshold}).json()
    assert far["threshold"] == threshold and far["threshold_source"] == "caller"
    assert [m["same"] for m in far["matches"]] == [
        m["squared_distance"] <= threshold for m in far["matches"]
    ]
    assert sum(m["same"] for m in far["matches"]) == 60


def test_normalize_l2_applies_to_gallery_vectors(api: httpx.Client, name: str) -> None:
    d = 8
    make_model(api, name, d, normalize="l2")
    rng = np.random.default_rng(7)
    G = rng.normal(size=(20, d))
    G[3] = 4.0 * G[9]  # the same direction (a power of 2: bit for bit the same unit vector)
    ids = list(range(20))
    assert enrol(api, name, ids, G).status_code == 200
    got = api.post(f"/v1/models/{name}/identify", json={"x": (0.25 * G[9]).tolist(), "k": 2})
    assert [(m["id"], m["squared_distance"]) for m in got.json()["matches"]] == [(3, 0.0), (9, 0.0)]
    expected = brute_force(G[:1] * 3, G, ids, np.eye(d), 5, "l2")[0]
    assert_brute_force(api.post(f"/v1/models/{name}/identify",
                                json={"x": (3 * G[0]).tolist(), "k": 5}).json()["matches"],
                       expected)  # fmt: skip


def refreshes(api: httpx.Client, name: str) -> dict[str, float]:
    counts = series(scrape(api), "opml_gallery_refresh_seconds_count", model=name)
    return {dict(labels)["method"]: value for labels, value in counts.items()}


def test_answers_during_ingestion_are_exact_for_their_version(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    """Samples stream in (one per request, then batches) while identify runs: every answer is
    the brute force under the L of the version it names, rebuilt by the core learner from the
    same samples. Single steps are refreshed incrementally, batches fully: both are seen (at
    d = 128, past the shared service's OPML_MAX_DIM: one triplet step is incremental there)."""
    env = {**SHARED_ENV, "OPML_MAX_DIM": "128"}
    with launch(tmp_path / "svc", own_redis.url, **env).start().client() as api:
        check_answers_during_ingestion(api, "during")


def check_answers_during_ingestion(api: httpx.Client, name: str) -> None:
    d, n_single, n_batched = 128, 150, 400
    config: dict[str, Any] = {"gamma": 0.05, "seed": 11, "normalize": "l2"}
    rng = np.random.default_rng(12)
    X = rng.normal(size=(n_single + n_batched, d))  # no class structure: most steps update L
    y = [f"c{k}" for k in rng.integers(6, size=len(X))]
    make_model(api, name, d, **config)
    ids, G = gallery_of(150, d, seed=13)
    for part in (slice(i, i + 38) for i in range(0, 150, 38)):  # the body limit: 200 kB
        assert enrol(api, name, ids[part], G[part]).status_code == 200
    Q = np.vstack([X[rng.integers(len(X), size=3)] + 0.1, G[[2]]])
    done = threading.Event()
    failure: list[BaseException] = []

    def ingest() -> None:
        try:
            with httpx.Client(base_url=str(api.base_url), timeout=30) as feeder:
                for i in range(n_single):
                    body = {"x": X[i].tolist(), "y": y[i]}
                    assert feeder.post(f"/v1/models/{name}/samples", json=body).is_success
                    # one version per refresh (a min_version read cuts the refresher's pause
                    # short): each is the single step's rank-two change, refreshed incrementally
                    query = {"x": G[0].tolist()}
                    response = feeder.post(f"/v1/models/{name}/identify",
                                           params={"min_version": i + 1}, json=query)  # fmt: skip
                    assert response.status_code == 200, response.text
                for i in range(n_single, n_single + n_batched, 40):
                    samples = [{"x": X[j].tolist(), "y": y[j]} for j in range(i, i + 40)]
                    response = feeder.post(f"/v1/models/{name}/samples", json={"samples": samples})
                    assert response.is_success
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)
        finally:
            done.set()

    feeder = threading.Thread(target=ingest, daemon=True)
    feeder.start()
    answers = []
    while not done.is_set():
        response = api.post(f"/v1/models/{name}/identify", json={"xs": Q.tolist(), "k": 5})
        assert response.status_code == 200, response.text
        answers.append(response.json())
    feeder.join(30)
    assert not failure, failure
    total = n_single + n_batched
    last = api.post(f"/v1/models/{name}/identify", params={"min_version": total},
                    json={"xs": Q.tolist(), "k": 5})  # fmt: skip
    answers.append(last.json())
    assert last.json()["version"] == total

    versions = sorted({a["version"] for a in answers})
    assert len(versions) >= 5, versions  # the answers span the stream
    learner = Learner(LearnerConfig(dim=d, **config))
    at: dict[int, np.ndarray] = {}
    for v in versions:  # L at each answered version, from the same samples in order
        if v > learner.version:
            learner.learn_many(X[learner.version : v], y[learner.version : v])
        at[v] = learner.L.copy()
    for answer in answers:
        expected = brute_force(Q, G, ids, at[answer["version"]], 5, "l2")
        for result, exp in zip(answer["results"], expected, strict=True):
            assert_brute_force(result["matches"], exp)
    assert learner.counts["triplet_update"] + learner.counts["shrunk_update"] > total // 3
    methods = refreshes(api, name)
    assert methods.get("incremental", 0) > 0 and methods.get("full", 0) > 0, methods


def test_min_version_waits_for_the_transformed_gallery(query_api: httpx.Client, name: str) -> None:
    api = query_api  # the lean path, then the routes alone (both must answer alike)
    d = 4
    make_model(api, name, d)
    assert enrol(api, name, [1, 2], np.eye(d)[:2]).status_code == 200
    url = f"/v1/models/{name}/identify"
    body = {"x": [1, 0, 0, 0]}
    two = [{"x": [1, 0, 0, 0], "y": "a"}, {"x": [0, 1, 0, 0], "y": "b"}]
    assert api.post(f"/v1/models/{name}/samples", json={"samples": two}).is_success
    assert api.post(url, params={"min_version": 2}, json=body).json()["version"] == 2
    late = api.post(url, params={"min_version": 10**6}, json=body)
    assert assert_problem(late, 503)["version"] == 2 and late.headers["retry-after"] == "1"


def test_binary_forms_equal_the_json_answers(query_api: httpx.Client, name: str) -> None:
    api = query_api  # the lean path, then the routes alone (both must answer alike)
    d = 8
    make_model(api, name, d)
    ids, G = gallery_of(40, d, seed=21)
    assert enrol(api, name, ids, G, [i % 4 if i % 2 else None for i in range(40)]).is_success
    url = f"/v1/models/{name}/identify"
    Q = np.random.default_rng(22).normal(size=(5, d))
    by_json = api.post(url, json={"xs": Q.tolist(), "k": 3, "threshold": 20.0}).json()
    for save, rows in ((np.savez, Q), (np.savez_compressed, Q.astype("f4"))):
        buf = io.BytesIO()
        save(buf, xs=rows)
        raw = api.post(url, content=buf.getvalue(), params={"k": 3, "threshold": 20.0},
                       headers={"content-type": NPZ})  # fmt: skip
        as_json = api.post(url, json={"xs": rows.astype(np.float64).tolist(), "k": 3,
                                      "threshold": 20.0})  # fmt: skip
        assert raw.status_code == 200 and raw.json() == as_json.json()
    assert as_json.json() != by_json  # float32 rounding moved the distances: really float32
    one = io.BytesIO()
    np.savez(one, x=Q[0])
    single = api.post(url, content=one.getvalue(), headers={"content-type": NPZ}).json()
    assert single["version"] == 0 and "results" not in single
    assert [(m["id"], m["squared_distance"]) for m in single["matches"]] == [
        (m["id"], m["squared_distance"]) for m in by_json["results"][0]["matches"][:1]
    ]

    arrays = api.post(url, json={"xs": Q.tolist(), "k": 3, "threshold": 20.0},
                      headers={"accept": NPZ})  # fmt: skip
    assert arrays.headers["content-type"] == NPZ and arrays.headers["x-version"] == "0"
    got = np.load(io.BytesIO(arrays.content), allow_pickle=False)
    assert got["squared_distances"].shape == (5, 3) and int(got["version"]) == 0
    for row, result in zip(range(5), by_json["results"], strict=True):
        matches = result["matches"]
        assert got["ids"][row].tolist() == [str(m["id"]) for m in matches]
        assert got["y"][row].tolist() == ["" if m["y"] is None else str(m["y"]) for m in matches]
        assert got["squared_distances"][row].tolist() == [m["squared_distance"] for m in matches]
        assert got["same"][row].tolist() == [m["same"] for m in matches]
    assert float(got["threshold"]) == 20.0


def test_reenrolling_an_id_replaces_it_and_deletes_remove(api: httpx.Client, name: str) -> None:
    d = 4
    make_model(api, name, d)
    G = np.eye(d) * np.arange(1, 5)[:, None]
    assert enrol(api, name, ["a", "b", "c/d", 7], G, ["x", "y", "z", "w"]).is_success
    url = f"/v1/models/{name}/identify"
    moved = enrol(api, name, ["a", "7"], np.array([[0, 0, 0, 9.0], [5.0, 0, 0, 0]]), ["new", 1])
    assert moved.json() == {"enrolled": 2, "replaced": 2, "size": 4}  # "7" is the item 7
    top = api.post(url, json={"x": [5, 0, 0, 0], "k": 4}).json()["matches"]
    assert (top[0]["id"], top[0]["y"], top[0]["squared_distance"]) == ("7", 1, 0.0)
    assert {m["id"] for m in top} == {"7", "a", "b", "c/d"}

    assert api.delete(f"/v1/models/{name}/gallery/c%2Fd").status_code == 204
    assert api.delete(f"/v1/models/{name}/gallery/b").status_code == 204
    assert api.get(f"/v1/models/{name}/gallery").json() == {
        "count": 2, "ids": ["7", "a"], "next_cursor": None
    }  # fmt: skip
    left = api.post(url, json={"x": [0, 0, 3, 0], "k": 2}).json()["matches"]
    assert [m["id"] for m in left] == ["7", "a"]
    before = api.get(f"/v1/models/{name}/gallery").json()
    assert_problem(api.delete(f"/v1/models/{name}/gallery/b"), 404)  # already gone
    assert_problem(api.delete(f"/v1/models/{name}/gallery/nobody"), 404)
    assert api.get(f"/v1/models/{name}/gallery").json() == before


def test_listing_pages_through_every_id(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    ids = [f"id-{i:03d}" for i in range(57)]
    assert enrol(api, name, ids, np.ones((57, 2))).is_success
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 10}
        if cursor is not None:
            params["cursor"] = cursor
        page = api.get(f"/v1/models/{name}/gallery", params=params).json()
        assert page["count"] == 57 and len(page["ids"]) <= 10
        seen += page["ids"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids)
    assert_problem(api.get(f"/v1/models/{name}/gallery", params={"limit": 0}), 422)


def test_idempotent_enrol(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    G = np.array([[1.0, 0.0], [0.0, 1.0]])
    first = enrol(api, name, ["p", "q"], G, None, **{"Idempotency-Key": "enrol-1"})
    again = enrol(api, name, ["p", "q"], G, None, **{"Idempotency-Key": "enrol-1"})
    assert first.json() == again.json() == {"enrolled": 2, "replaced": 0, "size": 2}
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    other = enrol(api, name, ["p", "q"], 2 * G, None, **{"Idempotency-Key": "enrol-1"})
    assert_problem(other, 409)
    top = api.post(f"/v1/models/{name}/identify", json={"x": [1, 0], "k": 1}).json()
    assert top["matches"][0]["squared_distance"] == 0.0  # the conflicting items were not written
    assert api.get(f"/v1/models/{name}/gallery").json()["count"] == 2


def test_limits_refuse_the_whole_request(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    rng = np.random.default_rng(31)
    full = rng.normal(size=(MAX_GALLERY, 2))
    for start in range(0, MAX_GALLERY, 100):
        assert enrol(
            api, name, list(range(start, start + 100)), full[start : start + 100]
        ).is_success
    before = api.post(f"/v1/models/{name}/identify", json={"x": [0, 0], "k": 3}).json()
    over = enrol(api, name, [0, "new"], rng.normal(size=(2, 2)))  # one replace, one new: over
    assert assert_problem(over, 422)["type"] == "/problems/limit-exceeded"
    batch = int(SHARED_ENV["OPML_MAX_BATCH"]) + 1
    too_many = enrol(api, name, list(range(batch)), np.zeros((batch, 2)))
    assert assert_problem(too_many, 422)["type"] == "/problems/limit-exceeded"
    assert api.post(f"/v1/models/{name}/identify", json={"x": [0, 0], "k": 3}).json() == before
    assert api.get(f"/v1/models/{name}/gallery").json()["count"] == MAX_GALLERY


BAD_ENROLS = {
    "wrong dimension": ({"items": [{"id": 1, "x": [1, 2, 3]}]}, ["body", "items", 0, "x"]),
    "NaN": (b'{"items": [{"id": 1, "x": [1, 2]}, {"id": 2, "x": [NaN, 1]}]}',
            ["body", "items", 1, "x"]),
    "overflow": (b'{"items": [{"id": 1, "x": [1e400, 1]}]}', ["body", "items", 0, "x"]),
    "duplicate id": ({"items": [{"id": 3, "x": [1, 2]}, {"id": "3", "x": [1, 2]}]},
                     ["body", "items", 1, "id"]),
    "empty id": ({"items": [{"id": "", "x": [1, 2]}]}, ["body", "items", 0, "id"]),
    "long id": ({"items": [{"id": "i" * 257, "x": [1, 2]}]}, ["body", "items", 0, "id"]),
    "bool id": ({"items": [{"id": True, "x": [1, 2]}]}, None),
    "bad label": ({"items": [{"id": 1, "x": [1, 2], "y": ""}]}, None),
    "no items": ({"items": []}, ["body", "items"]),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_ENROLS)
def test_bad_enrols_change_nothing(api: httpx.Client, name: str, case: str) -> None:
    make_model(api, name, 2)
    assert enrol(api, name, ["kept"], np.array([[0.5, 0.5]])).is_success
    body, loc = BAD_ENROLS[case]
    url = f"/v1/models/{name}/gallery"
    if isinstance(body, bytes):
        response = api.post(url, content=body, headers={"content-type": "application/json"})
    else:
        response = api.post(url, json=body)
    problem = assert_problem(response, 422)
    if loc is not None:
        assert problem["errors"][0]["loc"][: len(loc)] == loc, problem
    assert api.get(url).json() == {"count": 1, "ids": ["kept"], "next_cursor": None}


BAD_QUERIES = {
    "wrong dimension": ({"x": [1, 2, 3]}, ["body", "x"], 422),
    "NaN": (b'{"x": [NaN, 1]}', ["body", "x"], 422),
    "k = 0": ({"x": [1, 2], "k": 0}, ["body", "k"], 422),
    "k beyond the gallery": ({"x": [1, 2], "k": 3}, ["body", "k"], 422),
    "x and xs": ({"x": [1, 2], "xs": [[1, 2]]}, ["body"], 422),
    "ragged xs": ({"xs": [[1, 2], [1]]}, ["body", "xs", 1], 422),
    "negative threshold": ({"x": [1, 2], "threshold": -1}, ["body", "threshold"], 422),
    "k in the query with JSON": ({"x": [1, 2]}, ["query", "k"], 422),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_QUERIES)
def test_bad_identify_is_a_problem(query_api: httpx.Client, name: str, case: str) -> None:
    api = query_api  # the lean path, then the routes alone (both must answer alike)
    make_model(api, name, 2)
    assert enrol(api, name, ["a", "b"], np.eye(2)).is_success
    body, loc, status = BAD_QUERIES[case]
    url = f"/v1/models/{name}/identify"
    params = {"k": 2} if "query" in case else {}
    if isinstance(body, bytes):
        response = api.post(url, content=body, headers={"content-type": "application/json"})
    else:
        response = api.post(url, json=body, params=params)
    problem = assert_problem(response, status)
    assert problem["errors"][0]["loc"][: len(loc)] == loc, problem


def test_unknown_model_and_empty_gallery(api: httpx.Client, name: str) -> None:
    assert_problem(api.post("/v1/models/no-such-model/identify", json={"x": [1]}), 404)
    assert_problem(api.post("/v1/models/no-such-model/gallery",
                            json={"items": [{"id": 1, "x": [1]}]}), 404)  # fmt: skip
    assert_problem(api.get("/v1/models/no-such-model/gallery"), 404)
    assert_problem(api.delete("/v1/models/no-such-model/gallery/1"), 404)
    make_model(api, name, 2)
    empty = api.post(f"/v1/models/{name}/identify", json={"x": [1, 2]})
    assert "empty" in assert_problem(empty, 422)["detail"]


def test_deleting_the_model_removes_its_gallery(
    api: httpx.Client, rdb: redis.Redis, name: str
) -> None:
    make_model(api, name, 2)
    assert enrol(api, name, [1], np.ones((1, 2))).is_success
    key = f"opml:{{{name}}}:gallery"
    assert rdb.hlen(key) == 1
    assert api.delete(f"/v1/models/{name}").status_code == 204
    assert not rdb.exists(key)
    make_model(api, name, 2)  # a new model of the same name starts with an empty gallery
    assert api.get(f"/v1/models/{name}/gallery").json()["count"] == 0


def test_enrols_survive_restart_and_kill_9(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    """Acknowledged enrols and deletes come back after a graceful restart, and after the
    service and Redis are both killed -9 right after an acknowledgement (AOF, appendfsync
    always): identify answers as before, exactly."""
    server = own_redis
    svc = launch(tmp_path / "svc", server.url).start()
    d = 6
    ids, G = gallery_of(60, d, seed=41)
    Q = np.random.default_rng(42).normal(size=(4, d))
    X, y = stream(80, d, 4, seed=43)
    with svc.client() as api:
        make_model(api, "faces", d, gamma=0.05)
        samples = [{"x": r.tolist(), "y": lab} for r, lab in zip(X, y, strict=True)]
        api.post("/v1/models/faces/samples?wait=true", json={"samples": samples})
        assert enrol(api, "faces", ids[:40], G[:40]).is_success
        assert api.delete("/v1/models/faces/gallery/2").status_code == 204
        before = api.post("/v1/models/faces/identify", json={"xs": Q.tolist(), "k": 5}).json()
    svc.stop()
    svc.start()
    with svc.client() as api:
        assert api.post("/v1/models/faces/identify", json={"xs": Q.tolist(), "k": 5}).json() == (
            before
        )
        assert enrol(api, "faces", ids[40:], G[40:]).is_success  # acknowledged: durable
        assert api.delete("/v1/models/faces/gallery/9").status_code == 204
        after = api.post("/v1/models/faces/identify", json={"xs": Q.tolist(), "k": 5}).json()
        listed = api.get("/v1/models/faces/gallery", params={"limit": 1000}).json()
    svc.kill()
    server.kill()
    server.start()
    svc.start()
    with svc.client() as api:
        again = api.post("/v1/models/faces/identify", json={"xs": Q.tolist(), "k": 5}).json()
        assert api.get("/v1/models/faces/gallery", params={"limit": 1000}).json() == listed
    assert again == after and listed["count"] == 58
    alive = [i for i, item_id in enumerate(ids) if item_id not in (2, 9)]
    reference = Learner(LearnerConfig(dim=d, gamma=0.05))
    reference.learn_many(X, y)
    expected = brute_force(Q, G[alive], [ids[i] for i in alive], reference.L, 5, "none")
    for result, exp in zip(again["results"], expected, strict=True):
        assert_brute_force(result["matches"], exp)


def test_a_change_through_one_process_is_seen_through_the_other(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    """Two services on one Redis: the gallery is held by the process that learns the model,
    and the other forwards to it, so an enrol and a delete through either are seen through
    both. The model is created through ``one`` and may then move to ``two`` (placement; a
    request meanwhile is answered 503 "changing hands"): the test starts once it is placed."""
    env = {"OPML_LEASE_TTL_S": "1.5"}
    one = launch(tmp_path / "one", own_redis.url, **env).start()
    two = launch(tmp_path / "two", own_redis.url, **env).start()
    rdb = redis.Redis.from_url(own_redis.url)
    with one.client() as a, two.client() as b:
        make_model(a, "shared", 2)
        eventually(lambda: placed(rdb, [one, two], ["shared"]))
        eventually(lambda: b.get("/v1/models/shared").status_code == 200)
        assert enrol(a, "shared", ["p", "q"], np.eye(2)).is_success
        eventually(lambda: b.get("/v1/models/shared/gallery").json()["count"] == 2)
        top = b.post("/v1/models/shared/identify", json={"x": [0, 1]}).json()["matches"]
        assert top[0]["id"] == "q"
        assert a.delete("/v1/models/shared/gallery/q").status_code == 204
        eventually(lambda: b.get("/v1/models/shared/gallery").json()["ids"] == ["p"])
        assert (
            b.post("/v1/models/shared/identify", json={"x": [0, 1]}).json()["matches"][0]["id"]
            == "p"
        )
