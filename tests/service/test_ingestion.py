"""POST /v1/models/{name}/samples: seqs, idempotency, ?wait=true, and every rejection."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from websockets.sync.client import connect

from service.api.schemas import LABEL_MESSAGE
from tests.service.support import (
    Launch,
    RedisServer,
    ServiceProcess,
    assert_problem,
    binary,
    core_learner,
    make_model,
    scrape,
    series,
)


def post(api: httpx.Client, name: str, body: Any, **kw: Any) -> httpx.Response:
    return api.post(f"/v1/models/{name}/samples", json=body, **kw)


def test_seq_starts_at_1_and_grows_by_1_per_sample(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    one = post(api, name, {"x": [1, 2], "y": "a"})
    assert one.status_code == 202
    assert one.json() == {"accepted": 1, "first_seq": 1, "last_seq": 1}
    batch = post(api, name, {"samples": [{"x": [0, 1], "y": 3}, {"x": [2, 2], "y": "3"}]})
    assert batch.json() == {"accepted": 2, "first_seq": 2, "last_seq": 3}
    assert post(api, name, {"x": [5, 5], "y": "b"}).json()["first_seq"] == 4


def test_wait_returns_results_equal_to_the_core(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2, gamma=0.05, seed=3)
    X = [[0, 0], [0, 0.2], [1, 0], [0.1, 0.1], [1, 0.3], [0.5, 0.5]]
    y = ["a", "a", 7, "a", "7", "a"]  # 7 and "7" are the same class
    response = post(api, name, {"samples": [{"x": x, "y": v} for x, v in zip(X, y, strict=False)]},
                    params={"wait": "true"})  # fmt: skip
    assert response.status_code == 200
    body = response.json()
    assert body["version"] >= 6 and (body["first_seq"], body["last_seq"]) == (1, 6)
    expected = core_learner(np.zeros((0, 2)), [], dim=2, gamma=0.05, seed=3).learn_many(
        X, [str(v) for v in y]
    )
    assert [r["seq"] for r in body["results"]] == [1, 2, 3, 4, 5, 6]
    for got, want in zip(body["results"], expected, strict=True):
        keys = ("outcome", "hinge", "d_pos", "d_neg")  # JSON floats round-trip exactly
        assert {k: got[k] for k in keys} == {k: getattr(want, k) for k in keys}
    assert api.get(f"/v1/models/{name}").json()["classes"] == 2


def test_idempotency_key_replays_and_logs_nothing(
    api: httpx.Client, rdb: redis.Redis, name: str
) -> None:
    make_model(api, name, 2)
    body = {"samples": [{"x": [1, 1], "y": "a"}, {"x": [2, 1], "y": "b"}]}
    first = post(api, name, body, headers={"Idempotency-Key": "req-1"})
    again = post(api, name, body, headers={"Idempotency-Key": "req-1"})
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json() == {"accepted": 2, "first_seq": 1, "last_seq": 2}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 2
    other = post(api, name, {"x": [0, 0], "y": "a"}, headers={"Idempotency-Key": "req-1"})
    assert assert_problem(other, 409)["first_seq"] == 1
    assert post(api, name, body, headers={"Idempotency-Key": "req-2"}).json()["first_seq"] == 3


def test_a_model_keeps_its_latest_idempotency_records_up_to_the_cap(
    tmp_path: Path, own_redis: RedisServer, name: str, launch: Launch
) -> None:
    """OPML_IDEMPOTENCY_MAX_RECORDS = 3: REST keys and WS frame ids share the model's cap; past
    it the oldest record goes, and a retry of it is logged again, while a kept one replays.
    (On a Redis of its own: on the shared one the shared service could learn the model and
    take its appends, with its own cap.)"""
    svc = launch(tmp_path, own_redis.url, OPML_IDEMPOTENCY_MAX_RECORDS="3").start()
    rdb = redis.Redis.from_url(own_redis.url)
    with svc.client() as api, contextlib.closing(rdb):
        make_model(api, name, 2)

        def send(key: str) -> httpx.Response:
            return post(api, name, {"x": [1, 2], "y": "a"}, headers={"Idempotency-Key": key})

        assert [send(f"k{i}").json()["first_seq"] for i in range(4)] == [1, 2, 3, 4]
        assert rdb.hlen(f"opml:{{{name}}}:idem") == rdb.zcard(f"opml:{{{name}}}:idem-exp") == 3
        kept = send("k3")
        assert kept.headers.get("Idempotent-Replayed") == "true" and kept.json()["first_seq"] == 4
        evicted = send("k0")  # the oldest of four: forgotten, so logged again
        assert "Idempotent-Replayed" not in evicted.headers and evicted.json()["first_seq"] == 5
        with connect(f"{svc.ws_url}/v1/models/{name}/stream") as ws:
            for frame_id in ("f0", "f1", "f2", "f0"):
                ws.send(json.dumps({"id": frame_id, "x": [2, 1], "y": "b"}))
            acks = [json.loads(ws.recv(timeout=30)) for _ in range(4)]
        assert [(a["ack"], a["first_seq"], a.get("replayed", False)) for a in acks] == [
            ("f0", 6, False), ("f1", 7, False), ("f2", 8, False), ("f0", 6, True)
        ]  # fmt: skip
        # the three frames' records took the place of the keys'
        assert send("k0").json()["first_seq"] == 9
        assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 9
        # k0, then k0 again, the three frames' and the last k0's made room: 1 + 1 + 3 + 1
        dropped = series(scrape(api), "opml_idempotency_records_dropped_total", model=name)
        assert list(dropped.values()) == [6]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"x": [1, 2, 3], "y": "a"}, "body.x"),  # wrong length
        ({"x": [1, "two"], "y": "a"}, "body.x"),
        ({"x": [1, 2]}, "body"),
        ({"y": "a"}, "body"),
        ({"x": [1, 2], "y": ""}, "body.y"),
        ({"x": [1, 2], "y": "z" * 129}, "body.y"),
        ({"x": [1, 2], "y": int("9" * 129)}, "body.y"),
        ({"x": [1, 2], "y": True}, "body.y"),
        ({"x": [1, 2], "y": 1.5}, "body.y"),
        ({"samples": []}, "body.samples"),
        ({"samples": [{"x": [1, 2], "y": "a"}, {"x": [1], "y": "a"}]}, "body.samples.1.x"),
        ({"x": [1, 2], "y": "a", "samples": [{"x": [1, 2], "y": "a"}]}, "body"),
    ],
)
def test_invalid_samples_are_422_and_change_nothing(
    api: httpx.Client, name: str, body: dict[str, Any], where: str
) -> None:
    make_model(api, name, 2)
    problem = assert_problem(post(api, name, body), 422)
    locs = [".".join(str(p) for p in e["loc"]) for e in problem["errors"]]
    assert any(loc.startswith(where) for loc in locs), locs
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0


BAD_LABELS = [1.5, True, ["a"], "", None, "z" * 129, {"a": 1}]


@pytest.mark.parametrize("label", BAD_LABELS, ids=repr)
def test_a_bad_label_is_one_error_at_its_place_everywhere(
    service: ServiceProcess, api: httpx.Client, name: str, label: Any
) -> None:
    """Not an error per member of the label's type union (``y.int``, ``y.constrained-str``),
    nor a complaint about the body's form for ``null``: one error at the label, in a single
    sample, in a batch, in a JSON /stream frame and in a binary frame's header."""
    make_model(api, name, 2)
    expected = {"msg": LABEL_MESSAGE, "type": "label"}
    single = assert_problem(post(api, name, {"x": [1, 2], "y": label}), 422)
    assert single["errors"] == [{"loc": ["body", "y"], **expected}]
    assert single["detail"] == f"body.y: {LABEL_MESSAGE}"
    batch = {"samples": [{"x": [1, 2], "y": "ok"}, {"x": [1, 2], "y": label}]}
    problem = assert_problem(post(api, name, batch), 422)
    assert problem["errors"] == [{"loc": ["body", "samples", 1, "y"], **expected}]
    frames = [
        json.dumps({"id": "single", "x": [1, 2], "y": label}),
        json.dumps({"id": "batch", **batch}),
        binary("binary", [[1, 2], [3, 4]], ["ok", label]),
    ]
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for frame in frames:
            ws.send(frame)
        answers = [json.loads(ws.recv(timeout=10)) for _ in frames]
    assert [a["error"]["errors"] for a in answers] == [
        [{"loc": ["y"], **expected}],
        [{"loc": ["samples", 1, "y"], **expected}],
        [{"loc": ["y", 1], **expected}],
    ]
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0


def test_non_finite_values_are_422(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    bodies = [
        b'{"x": [NaN, 1], "y": "a"}',
        b'{"x": [1e400, 1], "y": "a"}',
        b'{"samples": [{"x": [1, 1], "y": "a"}, {"x": [1, Infinity], "y": "a"}]}',
    ]
    for raw in bodies:
        response = api.post(
            f"/v1/models/{name}/samples", content=raw, headers={"content-type": "application/json"}
        )
        assert "NaN or Inf" in assert_problem(response, 422)["detail"]
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0


def test_a_single_sample_is_checked_value_by_value(api: httpx.Client, name: str) -> None:
    """Finite values whose sum overflows are accepted; infinities that cancel are not."""
    make_model(api, name, 2)
    for raw in (b'{"x": [Infinity, -Infinity], "y": "a"}', b'{"x": [1, NaN], "y": 1}'):
        response = api.post(
            f"/v1/models/{name}/samples", content=raw, headers={"content-type": "application/json"}
        )
        assert assert_problem(response, 422)["detail"] == "body.x: contains NaN or Inf"
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0
    assert post(api, name, {"x": [1e308, 1e308], "y": "a"}).json()["last_seq"] == 1


def test_batch_and_class_limits(api: httpx.Client, name: str) -> None:
    make_model(api, name, 1)
    too_long = {"samples": [{"x": [1], "y": "a"}] * 501}  # OPML_MAX_BATCH=500
    assert "OPML_MAX_BATCH" in assert_problem(post(api, name, too_long), 422)["detail"]
    nineteen = {"samples": [{"x": [k], "y": k} for k in range(19)]}
    assert post(api, name, nineteen).status_code == 202
    three_new = {"samples": [{"x": [0], "y": 0}, {"x": [1], "y": "new1"}, {"x": [2], "y": "new2"}]}
    problem = assert_problem(post(api, name, three_new), 422)  # OPML_MAX_CLASSES=20
    assert "OPML_MAX_CLASSES" in problem["detail"]
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 19
    assert (
        post(api, name, {"samples": [{"x": [3], "y": 3}, {"x": [4], "y": "new1"}]}).json()[
            "last_seq"
        ]
        == 21
    )


def test_unknown_model_is_404(api: httpx.Client) -> None:
    assert_problem(post(api, "ghost", {"x": [1], "y": 1}), 404)
    assert_problem(post(api, "Bad Name", {"x": [1], "y": 1}), 422)
