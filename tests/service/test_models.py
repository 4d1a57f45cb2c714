"""Models CRUD: POST/GET/DELETE /v1/models, and their error answers."""

from __future__ import annotations

import httpx
import redis

from service.core.steps import DEFAULTS
from tests.service.support import assert_problem, make_model


def test_create_returns_the_model_with_defaults(api: httpx.Client, name: str) -> None:
    body = make_model(api, name, 3, algorithm="opml", gamma=0.01, seed=7)
    assert body["name"] == name
    assert (body["dim"], body["algorithm"], body["gamma"], body["seed"]) == (3, "opml", 0.01, 7)
    default_pair = DEFAULTS["scaled"][1]  # omitted: the core's default (step="scaled")
    assert (body["gamma_pair"], body["margin"], body["normalize"]) == (default_pair, 1.0, "none")
    assert body["version"] == body["samples_seen"] == body["classes"] == 0
    assert body["updates"]["triplet"] == body["updates"]["pair"] == 0
    assert body["verification"]["calibrated"] is False


def test_create_twice_is_409(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    assert_problem(api.post("/v1/models", json={"name": name, "dim": 5}), 409)
    assert api.get(f"/v1/models/{name}").json()["dim"] == 2


def test_list_and_get(api: httpx.Client, name: str) -> None:
    make_model(api, name, 4)
    listed = {m["name"]: m for m in api.get("/v1/models").json()["models"]}
    assert listed[name]["dim"] == 4
    one = api.get(f"/v1/models/{name}").json()
    timing = ("checkpoint", "staleness_s")  # ages: they differ from one call to the next
    assert {k: v for k, v in one.items() if k not in timing} == {
        k: v for k, v in listed[name].items() if k not in timing
    }


def test_get_unknown_is_404(api: httpx.Client) -> None:
    body = assert_problem(api.get("/v1/models/no-such-model"), 404)
    assert "no-such-model" in body["detail"]


def test_delete_removes_every_key(api: httpx.Client, rdb: redis.Redis, name: str) -> None:
    make_model(api, name, 2)
    samples = [{"x": [i, 1.0], "y": i % 3} for i in range(80)]  # > checkpoint_every: ckpt + H
    assert api.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples}).is_success
    api.post(
        f"/v1/models/{name}/samples", json={"x": [1, 2], "y": 1}, headers={"Idempotency-Key": "k"}
    )
    assert rdb.keys(f"opml:{{{name}}}:*")
    assert api.delete(f"/v1/models/{name}").status_code == 204
    assert rdb.keys(f"opml:{{{name}}}:*") == []
    assert not rdb.sismember("opml:models", name)
    assert_problem(api.get(f"/v1/models/{name}"), 404)
    assert_problem(api.delete(f"/v1/models/{name}"), 404)
    assert make_model(api, name, 3)["version"] == 0  # the name is free again, state fresh


def test_invalid_create_bodies_are_422_and_create_nothing(api: httpx.Client) -> None:
    bad = [
        {"name": "Upper", "dim": 2},
        {"name": "-leading", "dim": 2},
        {"name": "x" * 65, "dim": 2},
        {"name": "ok-name", "dim": 0},
        {"name": "ok-name", "dim": 65},  # over OPML_MAX_DIM=64 of the shared service
        {"name": "ok-name", "dim": 2, "algorithm": "lmnn"},
        {"name": "ok-name", "dim": 2, "gamma": -1},
        {"name": "ok-name", "dim": 2, "normalize": "l1"},
        {"name": "ok-name", "dim": 2, "unknown": 1},
        {"dim": 2},
    ]
    for body in bad:
        problem = assert_problem(api.post("/v1/models", json=body), 422)
        assert problem["errors"], body
    assert_problem(api.get("/v1/models/ok-name"), 404)


def test_malformed_json_is_a_problem(api: httpx.Client) -> None:
    response = api.post(
        "/v1/models", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_problem(response, 422)
