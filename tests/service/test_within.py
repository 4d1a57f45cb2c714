"""``algorithm: "lda"`` and ``precondition: "whiten"`` through a real service process: the
fields are accepted and shown, refusals name the field, and checkpoint, kill -9 replay and
restart give exactly the core's ``L`` on the same stream (refreshes at fixed sample counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.service.support import (
    Launch,
    RedisServer,
    assert_equals_core,
    assert_problem,
    make_model,
    stream,
)

CONFIGS: dict[str, dict[str, Any]] = {
    "lda": {"algorithm": "lda", "refresh": 90, "shrinkage": 0.05},
    "opml-whiten": {"algorithm": "opml", "precondition": "whiten", "refresh": 70},
    "sgd-whiten": {"algorithm": "sgd", "precondition": "whiten", "refresh": 100, "eta": 0.01},
    "copml-discriminant": {"algorithm": "copml", "precondition": "discriminant", "refresh": 80},
}


def _post(api: httpx.Client, X: np.ndarray, y: list[str], lo: int, hi: int) -> None:
    for k in range(lo, hi, 50):
        samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, min(k + 50, hi))]
        response = api.post("/v1/models/m/samples", json={"samples": samples})
        assert response.status_code == 202, response.text


def _assert_exact_and_refreshed(
    api: httpx.Client, X: np.ndarray, y: list[str], n: int, config: dict[str, Any]
) -> None:
    _, ref = assert_equals_core(api, "m", X, y, n, seed=3, **config)
    assert not np.allclose(ref.L, np.eye(X.shape[1]))  # refreshed: not the starting identity
    a, b = X[0].tolist(), X[1].tolist()
    distance = api.post("/v1/models/m/distance", json={"a": a, "b": b}).json()
    assert distance["distance"] == pytest.approx(ref.distance(a, b), rel=1e-12)


@pytest.mark.parametrize("which", list(CONFIGS))
def test_checkpoint_kill_9_replay_and_restart_are_exact(
    which: str, tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    config = CONFIGS[which]
    X, y = stream(500, 5, 4, seed=11)
    svc = launch(tmp_path, own_redis.url, OPML_CHECKPOINT_EVERY="130").start()
    with svc.client() as api:
        created = make_model(api, "m", 5, seed=3, **config)
        assert {k: created[k] for k in config} == config
        _post(api, X, y, 0, 320)
    svc.kill()  # kill -9: the last checkpoint at most at 260, the rest replayed from the log
    svc.start()
    with svc.client() as api:
        _assert_exact_and_refreshed(api, X, y, 320, config)
        _post(api, X, y, 320, 500)
        _assert_exact_and_refreshed(api, X, y, 500, config)
    svc.stop()
    svc.start()
    with svc.client() as api:
        _assert_exact_and_refreshed(api, X, y, 500, config)
    svc.stop()


def test_defaults_shown_in_the_model_document(api: httpx.Client, name: str) -> None:
    lda = make_model(api, f"{name}-lda", 3, algorithm="lda")
    assert (lda["refresh"], lda["shrinkage"], lda["precondition"]) == (1000, 0.0, "none")
    assert lda["gamma"] is None and lda["gamma_pair"] is None and lda["health"] is None
    plain = make_model(api, f"{name}-opml", 3, algorithm="opml")
    assert (plain["refresh"], plain["shrinkage"], plain["precondition"]) == (None, None, "none")
    white = make_model(api, f"{name}-w", 3, algorithm="copml", precondition="whiten")
    assert (white["refresh"], white["shrinkage"]) == (1000, 0.0)
    weighted = make_model(api, f"{name}-d", 3, precondition="discriminant")
    assert (weighted["precondition"], weighted["gamma"], weighted["refresh"]) == (
        "discriminant",
        0.01,
        250,
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"algorithm": "lda", "gamma": 0.01}, "gamma"),  # no steps
        ({"algorithm": "lda", "rehearsal": 1}, "rehearsal"),
        ({"algorithm": "lda", "shrinkage": 1.5}, "shrinkage"),
        ({"algorithm": "lda", "refresh": 0}, "refresh"),
        ({"algorithm": "brm", "precondition": "whiten"}, "precondition"),
        ({"algorithm": "opml", "precondition": "pca"}, "precondition"),
        ({"algorithm": "opml", "refresh": 10}, "refresh"),  # without whitening: unused
        ({"algorithm": "opml", "precondition": "whiten", "rehearsal": 2}, "rehearsal"),
        ({"algorithm": "lda", "precondition": "discriminant"}, "precondition"),
    ],
)
def test_out_of_range_fields_are_422_naming_the_field(
    api: httpx.Client, name: str, params: dict[str, Any], field: str
) -> None:
    response = api.post("/v1/models", json={"name": name, "dim": 3, **params})
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["loc"] == ["body", field], problem
    assert api.get(f"/v1/models/{name}").status_code == 404


def test_to_sklearn_of_lda_and_whitened_models_answers_as_the_service(
    api: httpx.Client, name: str, service: Any
) -> None:
    from clients import OPMLClient

    X, y = stream(300, 4, 3, seed=2)
    with OPMLClient(service.url) as client:
        for suffix, config in (
            ("l", {"algorithm": "lda", "refresh": 100}),
            ("w", {"algorithm": "opml", "precondition": "whiten"}),
            ("d", {"algorithm": "copml", "precondition": "discriminant"}),
        ):
            model = f"{name}-{suffix}"
            make_model(api, model, 4, seed=1, **config)
            client.ingest(model, X, y)
            L = client.metric(model, min_version=300)
            estimator = client.to_sklearn(model)
            np.testing.assert_array_equal(estimator.components_, L)
            if suffix == "l":
                assert type(estimator).__name__ == "OnlineLDA" and estimator.refresh == 100
            pairs = np.stack([X[:5], X[5:10]], axis=1)
            served = [
                api.post(
                    f"/v1/models/{model}/distance", json={"a": a.tolist(), "b": b.tolist()}
                ).json()["distance"]
                for a, b in pairs
            ]
            np.testing.assert_allclose(estimator.pair_distance(pairs), served, rtol=1e-12)
