"""Held-out routing and risk certificates through the real service: ``holdout`` in the model
config and on samples (REST, WebSocket JSON and binary frames), the ``held_out`` outcome,
``GET .../certificate`` equal to the core's certificate on the same data, its refusals,
restart / kill -9, forwarding to the owner, and the ``opml_certificate_*`` gauges."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
from websockets.sync.client import connect

from service.core import Learner, LearnerConfig
from tests.service.placement import FAST, eventually, lease_holder, member, placed
from tests.service.support import (
    Launch,
    RedisServer,
    ServiceProcess,
    assert_problem,
    make_model,
    scrape,
    series,
    stream,
)

D = 4
#: The model of most tests: 30 % of samples held out, a window of 600.
CONFIG = {"gamma": 0.02, "seed": 3, "holdout": 0.3, "holdout_window": 600}


def docs(X: np.ndarray, y: list[str], flags: Any = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"x": X[i].tolist(), "y": y[i]} for i in range(len(y))]
    if flags is not None:
        for i in np.flatnonzero(flags):
            out[i]["holdout"] = True
    return out


def core(X: np.ndarray, y: list[str], flags: Any = None, **config: Any) -> Learner:
    """The core learner fed the same stream (the reference the service must equal)."""
    learner = Learner(LearnerConfig(dim=D, **config))
    learner.learn_many(X, y, holdout=flags)
    return learner


def expected(learner: Learner, **kwargs: Any) -> dict[str, Any]:
    """The core's certificate as JSON would carry it."""
    out: dict[str, Any] = json.loads(json.dumps(learner.certificate(**kwargs).to_dict()))
    return out


def send(api: httpx.Client, name: str, X: np.ndarray, y: list[str], flags: Any = None) -> None:
    rows = docs(X, y, flags)
    for lo in range(0, len(rows), 100):
        answer = api.post(f"/v1/models/{name}/samples", json={"samples": rows[lo : lo + 100]})
        assert answer.status_code == 202, answer.text


def test_held_out_samples_are_reported_and_certified_exactly_as_by_the_core(
    api: httpx.Client, name: str
) -> None:
    n = 1200
    X, y = stream(n, D, 4, seed=11)
    flags = np.arange(n) % 17 == 0  # the caller's validation samples, besides the routed ones
    model = make_model(api, name, D, **CONFIG)
    assert (model["holdout"], model["holdout_window"], model["updates"]["held_out"]) == (
        0.3,
        600,
        0,
    )
    send(api, name, X[:1100], y[:1100], flags[:1100])
    rows = docs(X[1100:], y[1100:], flags[1100:])
    applied = api.post(f"/v1/models/{name}/samples?wait=true", json={"samples": rows}).json()
    learner = core(X, y, flags, **CONFIG)
    outcomes = [r["outcome"] for r in applied["results"]]
    assert all(outcomes[i] == "held_out" for i in np.flatnonzero(flags[1100:]))
    held = [i for i, r in enumerate(applied["results"]) if r["outcome"] == "held_out"]
    assert all(applied["results"][i]["d_pos"] is None for i in held)
    doc = api.get(f"/v1/models/{name}").json()
    assert doc["updates"]["held_out"] == learner.counts["held_out"] > flags.sum()
    assert sum(doc["updates"].values()) - doc["updates"]["shrunk"] == doc["version"] == n
    L = api.get(f"/v1/models/{name}/metric").json()["L"]
    assert np.array_equal(np.array(L), learner.L)  # bit for bit: held-out samples not learned

    url = f"/v1/models/{name}/certificate"
    answer = api.get(url, params={"min_version": n})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body == expected(learner, delta=0.05)
    assert body["version"] == n and body["certifies"] == "served"
    assert body["samples"] == doc["updates"]["held_out"] and body["window"] == 600
    assert body["classes"] == 4
    assert {"m", "errors", "empirical", "bound"} <= body["false_accept"].keys()
    assert "exchangeable" in body["statement"]
    at = api.get(url, params={"delta": 0.01, "method": "kl", "threshold": 7.5}).json()
    assert at == expected(learner, delta=0.01, method="kl", threshold=7.5)
    assert at["threshold_source"] == "caller"


def binary_frame(frame_id: int, X: np.ndarray, y: list[str], flags: list[bool]) -> bytes:
    header = json.dumps({"id": frame_id, "y": y, "holdout": flags}).encode()
    return struct.pack("<I", len(header)) + header + X.astype("<f8").tobytes()


def test_holdout_flags_of_websocket_frames_json_and_binary(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    n = 840
    X, y = stream(n, D, 3, seed=12)
    flags = np.random.default_rng(5).random(n) < 0.35
    make_model(api, name, D, gamma=0.02, seed=7)  # holdout = 0: only the flagged ones
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for k, lo in enumerate(range(0, n, 60)):
            hi = lo + 60
            if k % 2:
                ws.send(binary_frame(k, X[lo:hi], y[lo:hi], flags[lo:hi].tolist()))
            else:
                ws.send(json.dumps({"id": k, "samples": docs(X[lo:hi], y[lo:hi], flags[lo:hi])}))
            assert json.loads(ws.recv(timeout=30))["last_seq"] == hi
        ws.send(json.dumps({"id": "bad", "y": "a", "x": [1.0] * D, "holdout": "yes"}))
        assert json.loads(ws.recv(timeout=30))["error"]["status"] == 422
        ws.send(binary_frame(99, X[:2], y[:2], [True]))  # one flag for two labels
        assert json.loads(ws.recv(timeout=30))["error"]["status"] == 422
    learner = core(X, y, flags, gamma=0.02, seed=7)
    body = api.get(f"/v1/models/{name}/certificate", params={"min_version": n}).json()
    assert body == expected(learner)
    doc = api.get(f"/v1/models/{name}").json()
    assert doc["updates"]["held_out"] == flags.sum() and doc["version"] == n


def test_certificate_refusals_are_problems_and_change_nothing(api: httpx.Client, name: str) -> None:
    X, y = stream(60, D, 3, seed=13)
    make_model(api, name, D, gamma=0.02)
    send(api, name, X, y)
    url = f"/v1/models/{name}/certificate"
    none = assert_problem(api.get(url, params={"min_version": 60}), 409)
    assert none["type"] == "/problems/not-certifiable"
    # what a REST user can do: the fraction at creation, or flags on samples; not the library's
    assert '"holdout"' in none["detail"] and "created" in none["detail"]
    assert "learn_many" not in none["detail"]
    for params, loc in [
        ({"delta": 0}, "delta"),
        ({"delta": 1}, "delta"),
        ({"delta": "abc"}, "delta"),
        ({"delta": 0.5}, "delta"),  # the exact inversion needs delta <= 0.3: use kl
        ({"method": "hoeffding"}, "method"),
        ({"threshold": -1}, "threshold"),
    ]:
        problem = assert_problem(api.get(url, params=params), 422)
        assert problem["errors"][0]["loc"] == ["query", loc], params
    pac = assert_problem(api.get(url, params={"method": "pac-bayes"}), 409)
    assert "pac_bayes_window" in pac["detail"]

    held = f"{name}-h"
    make_model(api, held, D, holdout=0.5, seed=1)
    send(api, held, X, y)
    few = assert_problem(api.get(f"/v1/models/{held}/certificate?min_version=60"), 409)
    assert few["needed"] > 0 and few["have"] == core(X, y, holdout=0.5, seed=1).counts["held_out"]
    assert f"about {few['needed']} more" in few["detail"]
    assert api.get(f"/v1/models/{held}").json()["version"] == 60  # nothing changed

    bad_config = api.post("/v1/models", json={"name": f"{name}-x", "dim": D, "holdout": 0.7})
    assert assert_problem(bad_config, 422)["errors"][0]["loc"] == ["body", "holdout"]
    batch_flag = {"samples": docs(X[:2], y[:2]), "holdout": True}  # per sample, not per batch
    assert_problem(api.post(f"/v1/models/{name}/samples", json=batch_flag), 422)
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 60


def test_pac_bayes_certificate_equals_the_core(api: httpx.Client, name: str) -> None:
    n = 900
    X, y = stream(n, D, 3, seed=14)
    config = {"gamma": 0.02, "seed": 2, "pac_bayes_prefix": 200, "pac_bayes_window": 600}
    make_model(api, name, D, **config)
    send(api, name, X, y)
    answer = api.get(
        f"/v1/models/{name}/certificate", params={"method": "pac-bayes", "min_version": n}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body == expected(core(X, y, **config), method="pac-bayes")
    assert body["certifies"] == "gibbs" and "NOT of the served" in body["statement"]


def test_the_reservoir_survives_restart_and_kill_9(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    n = 1000
    X, y = stream(n, D, 4, seed=15)
    flags = np.arange(n) % 11 == 0
    svc = launch(tmp_path, own_redis.url, OPML_CHECKPOINT_EVERY="170").start()
    with svc.client() as api:
        make_model(api, "m", D, **CONFIG)
        send(api, "m", X[:700], y[:700], flags[:700])
        before = api.get("/v1/models/m/certificate", params={"min_version": 700}).json()
    assert before == expected(core(X[:700], y[:700], flags[:700], **CONFIG))
    svc.kill()  # kill -9: the state is the latest checkpoint plus the log tail
    svc.start()
    with svc.client() as api:
        assert api.get("/v1/models/m/certificate", params={"min_version": 700}).json() == before
        send(api, "m", X[700:], y[700:], flags[700:])
        after = api.get("/v1/models/m/certificate", params={"min_version": n}).json()
    svc.stop()  # a clean stop: a final checkpoint
    assert after == expected(core(X, y, flags, **CONFIG))
    svc.start()
    with svc.client() as api:
        assert api.get("/v1/models/m/certificate").json() == after
    assert redis.Redis.from_url(own_redis.url).xlen("opml:{m}:log") == 0  # all in a checkpoint


def test_a_certificate_asked_of_another_process_is_answered_by_the_owner(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    a = launch(tmp_path / "a", own_redis.url, **FAST).start()
    b = launch(tmp_path / "b", own_redis.url, **FAST).start()
    rdb = redis.Redis.from_url(own_redis.url)
    with a.client() as api:
        make_model(api, "m", D, **CONFIG)
    eventually(lambda: placed(rdb, [a, b], ["m"]))
    owner, other = (a, b) if lease_holder(rdb, "m") == member(a) else (b, a)
    X, y = stream(900, D, 3, seed=16)
    with other.client() as api:
        send(api, "m", X, y)  # ingestion: any process appends
        answer = api.get("/v1/models/m/certificate", params={"min_version": 900})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-opml-served-by"] == member(owner)
    assert answer.json() == expected(core(X, y, **CONFIG))


def test_certificate_gauges_follow_the_versions(
    api: httpx.Client, service: ServiceProcess, name: str
) -> None:
    """The shared service refreshes certificates every 100 versions (SHARED_ENV)."""
    n = 800
    X, y = stream(n, D, 3, seed=17)
    make_model(api, name, D, **CONFIG)
    send(api, name, X, y)

    def certified() -> dict[Any, float] | None:
        samples = scrape(api)
        done = series(samples, "opml_certificate_version", model=name)
        return samples if list(done.values()) == [float(n)] else None

    samples = eventually(certified, timeout=60)
    cert = expected(core(X, y, **CONFIG))
    for quantity in ("triplet_error", "false_accept", "false_reject"):
        (bound,) = series(samples, "opml_certificate_bound", model=name, quantity=quantity).values()
        (m,) = series(samples, "opml_certificate_tuples", model=name, quantity=quantity).values()
        assert (bound, m) == (cert[quantity]["bound"], cert[quantity]["m"])
    (target,) = series(samples, "opml_certificate_false_accept_target").values()
    assert target == 0.05


def test_the_margin_fallback_is_certified_in_input_units_as_verify_uses_it(
    api: httpx.Client, name: str
) -> None:
    """Before any triplet the served threshold is the margin in input units (under the default
    step="scaled": margin times the stream's scale, not the configured 1): the certificate
    certifies the threshold verify uses, as the core's does."""
    n = 900
    X, y = stream(n, D, 4, seed=21)
    X = 100.0 * X  # far from unit scale: the configured margin would be another threshold
    flags = np.array([label != y[0] for label in y])  # one class learned: pair steps only
    make_model(api, name, D, seed=3)
    send(api, name, X, y, flags)
    learner = core(X, y, flags, seed=3)
    assert learner.calibrator.calibration().pairs == 0 and learner.margin > 1.0
    body = api.get(f"/v1/models/{name}/certificate", params={"min_version": n}).json()
    assert body == expected(learner, delta=0.05)
    assert (body["threshold"], body["threshold_source"]) == (learner.margin, "fallback:margin")
    verify = api.post(f"/v1/models/{name}/verify", json={"a": X[0].tolist(), "b": X[1].tolist()})
    assert (verify.json()["threshold"], verify.json()["threshold_source"]) == (
        learner.margin,
        "fallback:margin",
    )
