"""The gradient learners through the service: create with each algorithm's own
hyperparameters (refusals name the field), checkpoint, restart and replay after kill -9 equal
to the core on the logged prefix, the model document's ``stability``, restricted distances,
``brm``'s verify on ``D_R^2`` and ``opml_model_info``."""

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
    core_learner,
    make_model,
    scrape,
    series,
    stream,
)

#: One configuration per new algorithm, each away from its defaults (so a hyperparameter lost
#: on the way to the core, or at a restart, changes L).
CONFIGS: dict[str, dict[str, Any]] = {
    "sgd": {
        "algorithm": "sgd",
        "eta": 0.004,
        "mu": 0.1,
        "lam": 0.01,
        "step": "descent",
        "kappa": 0.4,
        "gamma_pair": 0.02,
    },
    "sgd_psd": {"algorithm": "sgd_psd", "eta": 0.01, "mu": 0.2, "step": "invsqrt"},
    "brm": {"algorithm": "brm", "eta": 0.2, "margin": 0.2, "lam": 0.001, "step": "constant"},
}


def _post(api: httpx.Client, name: str, X: np.ndarray, y: list[str], lo: int, hi: int) -> None:
    for k in range(lo, hi, 50):
        samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, min(k + 50, hi))]
        response = api.post(f"/v1/models/{name}/samples", json={"samples": samples})
        assert response.status_code == 202, response.text  # acknowledged: in the log


def _assert_exact_with_stability(
    api: httpx.Client, X: np.ndarray, y: list[str], n: int, config: dict[str, Any]
) -> dict[str, Any]:
    model, ref = assert_equals_core(api, "m", X, y, n, seed=3, **config)
    assert model["stability"] == ref.stability().to_dict()
    assert model["updates"]["gradient"] == ref.counts["sgd_update"] > 0
    return model


@pytest.mark.parametrize("algorithm", list(CONFIGS))
def test_create_checkpoint_kill_9_replay_and_restart_are_exact(
    algorithm: str, tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    config = CONFIGS[algorithm]
    X, y = stream(600, 5, 4, seed=11)
    svc = launch(tmp_path, own_redis.url, OPML_CHECKPOINT_EVERY="130").start()
    with svc.client() as api:
        created = make_model(api, "m", 5, seed=3, **config)
        assert {k: created[k] for k in config} == config
        _post(api, "m", X, y, 0, 320)
    svc.kill()  # kill -9: 320 acknowledged, the last checkpoint at most at 260
    svc.start()
    with svc.client() as api:
        _assert_exact_with_stability(api, X, y, 320, config)
        _post(api, "m", X, y, 320, 600)
        _assert_exact_with_stability(api, X, y, 600, config)
    svc.stop()  # a clean stop writes a final checkpoint
    svc.start()
    with svc.client() as api:
        model = _assert_exact_with_stability(api, X, y, 600, config)
    svc.stop()
    assert model["checkpoint"]["seq"] == 600


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"algorithm": "sgd", "gamma": 0.01}, "gamma"),  # OPML's step: not sgd's
        ({"algorithm": "opml", "eta": 0.01}, "eta"),
        ({"algorithm": "brm", "margin": 1.0}, "margin"),  # tau < 1: D_R^2 is in [0, 1)
        ({"algorithm": "brm", "mu": 0.1}, "mu"),
        ({"algorithm": "sgd", "kappa": 0.7}, "kappa"),  # the cap's fraction is at most 0.5
        ({"algorithm": "sgd", "step": "constant", "kappa": 0.3}, "kappa"),  # descent only
        ({"algorithm": "sgd_psd", "eta": 0.5, "lam": 1.0}, "lam"),  # 2 eta lam < 1
        ({"algorithm": "sgd", "mu": -1.0}, "mu"),
        ({"algorithm": "brm", "step": "paperish"}, "step"),
        # one step field, its values by algorithm
        ({"algorithm": "copml", "step": "descent"}, "step"),
        ({"algorithm": "sgd", "step": "paper"}, "step"),
        ({"algorithm": "sgd", "gamma": "auto"}, "gamma"),  # the race is OPML's
        ({"algorithm": "brm", "auto_warmup": 100}, "auto_warmup"),
        ({"algorithm": "lsgd"}, "algorithm"),
    ],
)
def test_out_of_range_hyperparameters_are_422_naming_the_field(
    api: httpx.Client, name: str, params: dict[str, Any], field: str
) -> None:
    response = api.post("/v1/models", json={"name": name, "dim": 3, **params})
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["loc"] == ["body", field], problem
    assert api.get(f"/v1/models/{name}").status_code == 404  # nothing created


def test_defaults_by_algorithm_and_stability_null_where_the_spec_says(
    api: httpx.Client, name: str
) -> None:
    X, y = stream(200, 3, 3, seed=5)
    for algorithm in ("opml", "copml", "sgd", "sgd_psd", "brm"):
        model = make_model(api, f"{name}-{algorithm}", 3, algorithm=algorithm, normalize="l2")
        samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(200)]
        api.post(f"/v1/models/{name}-{algorithm}/samples", json={"samples": samples})
        api.get(f"/v1/models/{name}-{algorithm}/metric", params={"min_version": 200})
        model = api.get(f"/v1/models/{name}-{algorithm}").json()
        ref = core_learner(X, y, dim=3, algorithm=algorithm, normalize="l2")
        shown = {k: model[k] for k in ("gamma", "margin", "step", "eta", "mu", "kappa", "lam")}
        assert shown == {k: getattr(ref.config, k) for k in shown}
        assert model["stability"] == ref.stability().to_dict()
        # The divergence monitor and the step rules' figures are OPML/COPML's only.
        gradient = algorithm in ("sgd", "sgd_psd", "brm")
        assert (model["health"] is None, model["effective"] is None) == (gradient, gradient)
        assert model["health"] == ref.health and model["race"] is None
        # Lemma 2's gamma_hat only for sgd_psd with mu > 0 and every step capped
        assert (model["stability"]["gamma_hat"] is not None) == (
            algorithm == "sgd_psd" and model["stability"]["capped_fraction"] == 1.0
        )
    assert model["margin"] == 0.1 and model["gamma"] is None  # brm's own default tau


def test_restricted_distances_and_brm_verify(query_api: httpx.Client, name: str) -> None:
    X, y = stream(300, 4, 3, seed=9)
    samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(300)]
    refs = {}
    for algorithm in ("copml", "brm"):
        make_model(query_api, f"{name}-{algorithm}", 4, algorithm=algorithm)
        query_api.post(f"/v1/models/{name}-{algorithm}/samples", json={"samples": samples})
        refs[algorithm] = core_learner(X, y, dim=4, algorithm=algorithm)
    a, B = X[0], X[1:6]
    wait = {"min_version": 300}

    plain = query_api.post(
        f"/v1/models/{name}-copml/distance", params=wait, json={"a": a.tolist(), "b": B[0].tolist()}
    ).json()
    assert "restricted_distance" not in plain
    asked = query_api.post(
        f"/v1/models/{name}-copml/distance",
        params={**wait, "restricted": "true"},
        json={"a": a.tolist(), "b": B[0].tolist()},
    ).json()
    ref = refs["copml"]
    assert asked["restricted_squared_distance"] == ref.restricted_squared_distance(a, B[0])
    assert asked["restricted_distance"] == ref.restricted_distance(a, B[0])
    assert 0.0 <= asked["restricted_distance"] < 1.0
    bad = query_api.post(
        f"/v1/models/{name}-copml/distance",
        params={"restricted": "yes"},
        json={"a": a.tolist(), "b": B[0].tolist()},
    )
    assert assert_problem(bad, 422)["errors"][0]["loc"] == ["query", "restricted"]

    ref = refs["brm"]
    many = query_api.post(
        f"/v1/models/{name}-brm/distance", params=wait, json={"a": a.tolist(), "b": B.tolist()}
    ).json()
    assert many["restricted_squared_distances"] == ref.restricted_squared_distances(a, B).tolist()
    assert many["squared_distances"] == ref.squared_distances(a, B).tolist()
    # verify decides on D_R^2 (the units of the brm model's threshold), not on ||L(a - b)||^2
    sq = ref.restricted_squared_distance(a, B[0])
    plain_sq = ref.squared_distance(a, B[0])
    for threshold, same in ((sq, True), (float(np.nextafter(sq, 0.0)), False)):
        v = query_api.post(
            f"/v1/models/{name}-brm/verify",
            params=wait,
            json={"a": a.tolist(), "b": B[0].tolist(), "threshold": threshold},
        )
        body = v.json()
        assert body["same"] is same and body["restricted_squared_distance"] == sq
        assert body["squared_distance"] == plain_sq != sq


def test_model_info_metric_by_algorithm(api: httpx.Client, name: str) -> None:
    make_model(api, f"{name}-s", 3, algorithm="sgd", step="invsqrt")
    make_model(api, f"{name}-o", 3, algorithm="opml")
    info = series(scrape(api), "opml_model_info")
    assert (
        info[frozenset({("model", f"{name}-s"), ("algorithm", "sgd"), ("step", "invsqrt")})] == 1.0
    )
    info_o = frozenset({("model", f"{name}-o"), ("algorithm", "opml"), ("step", "scaled")})
    assert info[info_o] == 1.0


def test_a_brm_model_refuses_certificates_on_the_wire(api: httpx.Client, name: str) -> None:
    """Certificates bound ||L(a - b)||^2 decisions; a brm model decides on D_R^2: refused (409
    not-certifiable naming the algorithm), as by the core, however many samples are held out."""
    X, y = stream(400, 3, 3, seed=4)
    make_model(api, name, 3, algorithm="brm", holdout=0.3)
    samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(400)]
    api.post(f"/v1/models/{name}/samples", json={"samples": samples})
    answer = api.get(f"/v1/models/{name}/certificate", params={"min_version": 400})
    problem = assert_problem(answer, 409)
    assert "certificates are not available for 'brm'" in problem["detail"]
