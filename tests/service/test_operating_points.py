"""Operating points through the real service: ``verify`` / ``identify`` with ``far`` / ``frr``,
the model's ``operating_point``, the answers equal to the core's on the same stream, 409 / 422
refusals, ``GET .../roc`` (JSON and CSV) and open-set identify (``unknown``)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import httpx
import numpy as np

from service.api.npy import npz_bytes
from service.core import Learner, LearnerConfig
from service.core.calibration import in_order
from service.core.operating_points import held_out_pairs, operating_point, roc
from tests.service.placement import eventually
from tests.service.support import assert_problem, make_model, scrape, series, stream

D = 4
CONFIG: dict[str, Any] = {"gamma": 0.02, "seed": 3, "holdout": 0.3, "holdout_window": 3000}
N = 3000


def feed(api: httpx.Client, name: str, X: np.ndarray, y: list[str]) -> None:
    rows = [{"x": X[i].tolist(), "y": y[i]} for i in range(len(y))]
    for lo in range(0, len(rows), 500):
        answer = api.post(f"/v1/models/{name}/samples", json={"samples": rows[lo : lo + 500]})
        assert answer.status_code == 202, answer.text


def core_pairs(X: np.ndarray, y: list[str], **config: Any):  # type: ignore[no-untyped-def]
    """The core's held-out pairs of a learner fed the same stream (the reference)."""
    learner = Learner(LearnerConfig(dim=D, **config))
    learner.learn_many(X, y)
    ring, count = learner.calibrator.ring()
    Xh, labels, _ = learner.holdout.reservoir.samples()
    return held_out_pairs(
        learner.L,
        Xh,
        labels,
        in_order(ring, count, learner.calibrator.window),
        algorithm=learner.config.algorithm,
        seed=learner.config.seed,
        stream=learner.holdout.reservoir.total,
        version=learner.version,
    )


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def test_verify_by_target_equals_the_core_and_roc(api: httpx.Client, name: str) -> None:
    X, y = stream(N, D, 4, seed=21)
    make_model(api, name, D, **CONFIG)
    feed(api, name, X, y)
    url = f"/v1/models/{name}/verify"
    a, b = X[0].tolist(), X[1].tolist()
    answer = api.post(url, params={"min_version": N}, json={"a": a, "b": b, "far": 0.05})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    pairs = core_pairs(X, y, **CONFIG)
    expected = operating_point(pairs, far=0.05)
    point = body["operating_point"]
    assert body["threshold_source"] == "far" and body["version"] == N == point["version"]
    for key in ("target", "threshold", "far_estimate", "far_bound", "frr_estimate",
                "frr_bound", "negatives", "positives", "delta", "grid"):  # fmt: skip
        assert point[key] == as_json(getattr(expected, key)), key
    assert body["threshold"] == expected.threshold and point["far_bound"] == 0.05
    assert body["same"] == (body["squared_distance"] <= expected.threshold)
    assert "exchangeable" in point["statement"]

    frr = api.post(url, json={"a": a, "b": b, "frr": 0.1}).json()
    assert frr["threshold_source"] == "frr" and frr["operating_point"]["frr_bound"] == 0.1
    assert frr["operating_point"]["version"] == N  # from the cache: no sample since
    plain = api.post(url, json={"a": a, "b": b}).json()
    assert plain["threshold_source"] == "calibrated" and "operating_point" not in plain

    curve = api.get(f"/v1/models/{name}/roc", params={"points": 7, "min_version": N})
    assert curve.status_code == 200, curve.text
    assert curve.json() == as_json(roc(pairs, points=7).to_dict())
    text = api.get(f"/v1/models/{name}/roc", params={"points": 7}, headers={"Accept": "text/csv"})
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(text.text)))
    assert len(rows) == len(curve.json()["points"])
    assert float(rows[-1]["threshold"]) == curve.json()["points"][-1]["threshold"]
    bad = assert_problem(api.get(f"/v1/models/{name}/roc", params={"points": 1}), 422)
    assert bad["errors"][0]["loc"] == ["query", "points"]


def test_bad_targets_are_422_naming_the_fields(api: httpx.Client, name: str) -> None:
    make_model(api, name, D, **CONFIG)
    url = f"/v1/models/{name}/verify"
    ab = {"a": [0.0] * D, "b": [1.0] * D}
    for extra, where in [
        ({"far": 0.5}, "far"),
        ({"far": 0}, "far"),
        ({"frr": -0.1}, "frr"),
        ({"far": "x"}, "far"),
    ]:
        problem = assert_problem(api.post(url, json={**ab, **extra}), 422)
        assert problem["errors"][0]["loc"][-1] == where, problem
    for extra in ({"far": 0.1, "frr": 0.1}, {"far": 0.1, "threshold": 2.0}):
        problem = assert_problem(api.post(url, json={**ab, **extra}), 422)
        text = json.dumps(problem)
        assert "threshold, far and frr" in text and all(k in text for k in extra), problem
    identify = f"/v1/models/{name}/identify"
    problem = assert_problem(api.post(identify, json={"x": ab["a"], "far": 0.1, "frr": 0.1}), 422)
    assert "threshold, far and frr" in json.dumps(problem)
    created = api.post("/v1/models", json={"name": name + "-x", "dim": 2,
                                           "operating_point": {"far": 0.9}})  # fmt: skip
    assert assert_problem(created, 422)["errors"][0]["loc"][:2] == ["body", "operating_point"]


def test_not_certifiable_is_409_with_needed_have_and_a_hint(api: httpx.Client, name: str) -> None:
    X, y = stream(400, D, 4, seed=22)
    make_model(api, name, D, gamma=0.02, seed=3)  # holds nothing out
    feed(api, name, X, y)
    url = f"/v1/models/{name}/verify"
    ab = {"a": X[0].tolist(), "b": X[1].tolist()}
    none = assert_problem(api.post(url, params={"min_version": 400}, json={**ab, "far": 0.01}), 409)
    assert none["type"] == "/problems/not-certifiable"
    assert '"holdout": true' in none["hint"] and '"holdout": 0.1' in none["hint"]

    few = name + "-few"
    make_model(api, few, D, **{**CONFIG, "holdout": 0.1})
    feed(api, few, X, y)
    url = f"/v1/models/{few}/verify"
    problem = assert_problem(
        api.post(url, params={"min_version": 400}, json={**ab, "far": 0.001}), 409
    )
    assert problem["type"] == "/problems/not-certifiable"
    assert problem["have"] > 0 and problem["needed"] > 10 * problem["have"]
    assert "holdout" in problem["hint"]
    roc_problem = assert_problem(api.get(f"/v1/models/{name}/roc"), 409)
    assert "holdout" in roc_problem["hint"]


def test_model_operating_point_and_open_set_identify(api: httpx.Client, name: str) -> None:
    X, y = stream(N, D, 4, seed=23)
    model = make_model(api, name, D, **CONFIG, operating_point={"far": 0.05})
    assert model["operating_point"] == {"far": 0.05}
    assert api.get(f"/v1/models/{name}").json()["operating_point"] == {"far": 0.05}
    feed(api, name, X, y)
    api.get(f"/v1/models/{name}/metric", params={"min_version": N})
    # the refusal cached when the model was empty (its document read started a refresh) is
    # not served once samples have come: no min_version needed
    plain = api.post(
        f"/v1/models/{name}/verify", json={"a": X[0].tolist(), "b": X[1].tolist()}
    ).json()
    assert plain["threshold_source"] == "far" and plain["operating_point"]["target"] == 0.05
    caller = api.post(
        f"/v1/models/{name}/verify", json={"a": X[0].tolist(), "b": X[1].tolist(), "threshold": 1}
    ).json()
    assert caller["threshold_source"] == "caller"

    items = [{"id": f"i{k}", "x": X[k].tolist(), "y": y[k]} for k in range(40)]
    assert api.post(f"/v1/models/{name}/gallery", json={"items": items}).status_code == 200
    url = f"/v1/models/{name}/identify"
    far_away = (np.full(D, 1e3)).tolist()
    known = api.post(url, json={"x": X[0].tolist(), "k": 3}).json()
    assert known["threshold_source"] == "far" and known["operating_point"]["far_bound"] <= 0.05
    assert known["matches"][0]["id"] == "i0" and known["matches"][0]["same"]
    assert known["unknown"] is False
    stranger = api.post(url, json={"x": far_away, "k": 3}).json()
    assert stranger["unknown"] is True and not any(m["same"] for m in stranger["matches"])
    many = api.post(url, json={"xs": [X[0].tolist(), far_away], "frr": 0.2}).json()
    assert many["threshold_source"] == "frr"
    assert [r["unknown"] for r in many["results"]] == [False, True]
    limit = many["threshold"]
    assert all(m["same"] == (m["squared_distance"] <= limit) for r in many["results"]
               for m in r["matches"])  # fmt: skip

    # the binary form: an .npz body with the target in the query string, an .npz answer
    body, npz = npz_bytes(xs=np.array([X[0], far_away])), {"Content-Type": "application/x-npz"}
    binary = api.post(url, params={"frr": 0.2}, content=body,
                      headers={**npz, "Accept": "application/x-npz"})  # fmt: skip
    assert binary.status_code == 200, binary.text
    arrays = np.load(io.BytesIO(binary.content), allow_pickle=False)
    assert str(arrays["threshold_source"]) == "frr" and float(arrays["threshold"]) == limit
    assert arrays["unknown"].tolist() == [False, True]
    assert json.loads(str(arrays["operating_point"])) == many["operating_point"]
    assert arrays["same"].tolist() == [[m["same"] for m in r["matches"]] for r in many["results"]]
    as_json = api.post(url, params={"far": 0.05}, content=body, headers=npz).json()
    assert as_json["threshold_source"] == "far" and as_json["operating_point"]["target"] == 0.05
    assert [r["unknown"] for r in as_json["results"]] == [False, True]
    plain = np.load(io.BytesIO(api.post(url, params={"threshold": 1e300}, content=body,
                    headers={**npz, "Accept": "application/x-npz"}).content))  # fmt: skip
    assert "operating_point" not in plain and plain["unknown"].tolist() == [False, False]
    for params, where in (({"far": 0.5}, "far"), ({"frr": "x"}, "frr"), ({"far": 0}, "far"),
                          ({"threshold": 1, "far": 0.1}, "far"),
                          ({"far": 0.1, "frr": 0.1}, "frr")):  # fmt: skip
        problem = assert_problem(api.post(url, params=params, content=body, headers=npz), 422)
        assert problem["errors"][0]["loc"] == ["query", where], problem
    both = assert_problem(api.post(url, params={"far": 0.1, "frr": 0.1}, content=body,
                                   headers=npz), 422)  # fmt: skip
    assert "threshold, far and frr" in json.dumps(both)
    in_query = assert_problem(api.post(url, params={"far": 0.1}, json={"x": X[0].tolist()}), 422)
    assert in_query["errors"][0]["loc"] == ["query", "far"]


def test_brm_verify_is_certified_on_its_restricted_distance(api: httpx.Client, name: str) -> None:
    X, y = stream(N, D, 4, seed=24)
    make_model(api, name, D, algorithm="brm", holdout=0.3, holdout_window=3000, seed=1)
    feed(api, name, X, y)
    answer = api.post(
        f"/v1/models/{name}/verify",
        params={"min_version": N},
        json={"a": X[0].tolist(), "b": X[1].tolist(), "far": 0.1},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["operating_point"]["distance"] == "restricted" and body["threshold"] < 1.0
    assert body["same"] == (body["restricted_squared_distance"] <= body["threshold"])
    items = [{"id": "a", "x": X[0].tolist()}]
    assert api.post(f"/v1/models/{name}/gallery", json={"items": items}).status_code == 200
    refused = api.post(f"/v1/models/{name}/identify", json={"x": X[1].tolist(), "far": 0.1})
    problem = assert_problem(refused, 422)
    assert "algorithm" in json.dumps(problem)


def test_gauges_of_the_configured_operating_point(api: httpx.Client, name: str) -> None:
    """The gauges follow the cache without any verify: the status read of a scrape starts the
    background refresh; a target the held-out samples cannot certify shows certified 0."""
    X, y = stream(N, D, 4, seed=25)
    make_model(api, name, D, **CONFIG, operating_point={"far": 0.05})
    strict = name + "-strict"
    make_model(api, strict, D, **CONFIG, operating_point={"far": 0.0001})
    for model in (name, strict):
        feed(api, model, X, y)
        api.get(f"/v1/models/{model}/metric", params={"min_version": N})

    def current() -> Any:
        samples = scrape(api)
        version = series(samples, "opml_operating_point_version", model=name)
        certified = series(samples, "opml_operating_point_certified", model=strict)
        done = version and max(version.values()) == N and certified
        return samples if done else None

    samples = eventually(current)
    expected = operating_point(core_pairs(X, y, **CONFIG), far=0.05)
    for gauge, value in (
        ("opml_operating_point_threshold", expected.threshold),
        ("opml_operating_point_far_bound", expected.far_bound),
        ("opml_operating_point_frr_estimate", expected.frr_estimate),
        ("opml_operating_point_certified", 1.0),
    ):
        assert list(series(samples, gauge, model=name).values()) == [value], gauge
    assert list(
        series(samples, "opml_operating_point_target", model=name, rate="far").values()
    ) == [0.05]
    assert list(series(samples, "opml_operating_point_certified", model=strict).values()) == [0.0]
    assert not series(samples, "opml_operating_point_threshold", model=strict)
