"""Operations endpoints and error answers that are not about one resource."""

from __future__ import annotations

from importlib import metadata

import httpx
import pytest

from tests.service.support import assert_problem, make_model


def test_livez_and_readyz(api: httpx.Client) -> None:
    assert api.get("/livez").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ok"


def test_metrics_exposes_ingestion_and_learner_series(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    api.post(f"/v1/models/{name}/samples?wait=true", json={"x": [1, 2], "y": "a"})
    text = api.get("/metrics").text
    assert f'opml_samples_accepted_total{{model="{name}",transport="rest"}} 1.0' in text
    assert f'opml_steps_total{{model="{name}",outcome="new_class"}} 1.0' in text
    assert f'opml_model_version{{model="{name}"}} 1.0' in text
    assert f'opml_ingest_lag{{model="{name}"}} 0.0' in text
    assert f'opml_checkpoint_age_seconds{{model="{name}"}}' in text


def test_openapi_has_stable_operation_ids(api: httpx.Client) -> None:
    spec = api.get("/openapi.json").json()
    ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "create_model", "list_models", "get_model", "delete_model", "ingest_samples",
        "distance", "verify", "transform", "get_metric", "put_metric",
        "livez", "readyz", "metrics",
    } <= ids  # fmt: skip
    assert api.get("/docs").status_code == 200


def test_the_api_version_is_the_packages(api: httpx.Client) -> None:
    """One version number: the OpenAPI ``info.version`` is the installed package's."""
    spec = api.get("/openapi.json").json()
    assert spec["info"]["version"] == metadata.version("opml-service")


def test_unknown_route_and_wrong_method_are_problems(api: httpx.Client) -> None:
    assert_problem(api.get("/v2/nothing"), 404)
    assert_problem(api.put("/v1/models"), 405)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/v1/models", {"GET", "POST"}),
        ("POST", "/v1/models/m", {"GET", "DELETE"}),
        ("DELETE", "/v1/models/m/metric", {"GET", "PUT"}),
        ("GET", "/v1/models/m/samples", {"POST"}),
        ("GET", "/v1/models/m/distance", {"POST"}),
        ("GET", "/v1/models/m/verify", {"POST"}),
        ("POST", "/livez", {"GET"}),
    ],
)
def test_a_405_says_which_methods_are_allowed(
    query_api: httpx.Client, method: str, path: str, allowed: set[str]
) -> None:
    """RFC 9110 15.5.6: a 405 carries ``Allow`` (the lean path's routes too)."""
    response = query_api.request(method, path)
    assert_problem(response, 405)
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed


def test_body_over_the_limit_is_413_before_it_is_read(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    big = b'{"samples": [' + b'{"x": [1, 2], "y": 1},' * 20_000 + b'{"x": [1, 2], "y": 1}]}'
    assert_problem(
        api.post(f"/v1/models/{name}/samples", content=big,
                 headers={"content-type": "application/json"}),
        413,
    )  # fmt: skip

    def chunks():  # no Content-Length: counted while streaming
        yield b'{"samples": ['
        for _ in range(20_000):
            yield b'{"x": [1, 2], "y": 1},'
        yield b'{"x": [1, 2], "y": 1}]}'

    response = api.post(
        f"/v1/models/{name}/samples", content=chunks(),
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert_problem(response, 413)
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0
