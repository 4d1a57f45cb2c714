"""The lean path of ingestion (``POST .../samples``) and of ``GET /livez`` answers exactly like
the FastAPI routes: every request here goes to the shared service (lean path on) and to its
twin with the lean path off (``OPML_LEAN_PATH=false``), each on a fresh model of the same name,
and the two answers (status, ``Content-Type``, the headers the contract names, body) must be
equal; a refusal must also change nothing. Last, the service's layers around FastAPI's stack
answer an error escaping them as FastAPI would."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.service.support import ServiceProcess, assert_problem, lean_count, make_model

JSON_TYPE = {"content-type": "application/json"}
ONE = b'{"x": [1, 2], "y": 1}'
BATCH = b'{"samples": [{"x": [1, 2], "y": "a"}, {"x": [0, 1], "y": "b"}, {"x": [2, 1], "y": "a"}]}'

#: (query string, extra headers, body): valid requests and every kind of refusal.
CASES: list[tuple[str, dict[str, str], bytes]] = [
    ("", {}, ONE),
    ("", {}, BATCH),
    ("?wait=true", {}, BATCH),
    ("?wait=1", {}, ONE),
    ("?wait=Yes", {}, ONE),
    ("?wait=false", {}, ONE),
    ("?wait=off&x=1", {}, ONE),
    ("?wait=true&wait=false", {}, ONE),
    ("?wait=maybe", {}, ONE),
    ("?wait=", {}, ONE),
    ("?wait=maybe", {}, b'{"x": [1, NaN], "y": 1}'),
    ("", {"idempotency-key": "k" * 257}, ONE),
    ("?wait=2", {"idempotency-key": "k" * 257}, ONE),
    ("", {}, b'{"x": [1, NaN], "y": 1}'),
    ("", {}, b'{"x": [1, Infinity], "y": 1}'),
    ("", {}, b'{"x": [1e400, 0], "y": 1}'),
    ("", {}, b'{"x": [1, 2, 3], "y": 1}'),
    ("", {}, b'{"x": [1, "2"], "y": 1}'),
    ("", {}, b'{"x": [1, 2]}'),
    ("", {}, b'{"x": [1, 2], "y": 1, "extra": 0}'),
    ("", {}, b'{"x": [1, 2], "y": ' + json.dumps("l" * 1000).encode() + b"}"),
    ("", {}, b'{"x": [1, 2], "y": 1.5}'),
    ("", {}, b'{"x": [1, 2], "y": true}'),
    ("", {}, b'{"samples": []}'),
    ("", {}, b'{"samples": [{"x": [1, 2], "y": 1}, {"x": [1], "y": 2}]}'),
    ("", {}, b'{"samples": [{"x": [1, 2], "y": 1}], "x": [1, 2], "y": 1}'),
    ("", {}, b'{"x": [1, 2], "y": 1,}'),
    ("", {}, b"\xef\xbb\xbf" + ONE),
    ("", {}, b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b', "y": 1}'),
    ("", {}, b"[1, 2]"),
    ("", {}, b""),
    ("", {"content-type": "text/plain"}, ONE),
    ("", {"content-type": "application/x-npz"}, ONE),
]


def _post(
    client: httpx.Client, name: str, query: str, headers: dict[str, str], body: bytes
) -> httpx.Response:
    return client.post(
        f"/v1/models/{name}/samples{query}", content=body, headers={**JSON_TYPE, **headers}
    )


def _logged(client: httpx.Client, name: str) -> int:
    logged: int = client.get(f"/v1/models/{name}").json()["logged_seq"]
    return logged


def _assert_same(lean: httpx.Response, route: httpx.Response) -> None:
    assert lean.status_code == route.status_code, (lean.text, route.text)
    for header in ("content-type", "retry-after", "idempotent-replayed"):
        assert lean.headers.get(header) == route.headers.get(header), header
    assert lean.json() == route.json()
    if lean.status_code >= 400:
        assert_problem(lean, lean.status_code)


@pytest.mark.parametrize(("query", "headers", "body"), CASES)
def test_ingestion_on_the_lean_path_answers_exactly_like_the_route(
    service: ServiceProcess,
    routes_service: ServiceProcess,
    name: str,
    query: str,
    headers: dict[str, str],
    body: bytes,
) -> None:
    with service.client() as lean_client, routes_service.client() as route_client:
        answers = []
        for client in (lean_client, route_client):
            make_model(client, name, 2)
            answers.append(_post(client, name, query, headers, body))
            if answers[-1].status_code >= 400:  # a refusal logs nothing
                assert _logged(client, name) == 0
        _assert_same(*answers)


def test_an_idempotent_retry_is_replayed_alike(
    service: ServiceProcess, routes_service: ServiceProcess, name: str
) -> None:
    key = {"idempotency-key": "retry-1"}
    with service.client() as lean_client, routes_service.client() as route_client:
        firsts, retries = [], []
        for client in (lean_client, route_client):
            make_model(client, name, 2)
            firsts.append(_post(client, name, "", key, BATCH))
            retries.append(_post(client, name, "", key, BATCH))
            assert _logged(client, name) == 3  # the retry logged nothing
        _assert_same(*firsts)
        _assert_same(*retries)
    assert retries[0].headers["idempotent-replayed"] == "true"
    assert retries[0].json() == firsts[0].json()


@pytest.mark.parametrize("path", ["/v1/models/ghost-model/samples", "/v1/models/Bad!/samples"])
def test_a_missing_or_bad_model_name_is_refused_alike(
    service: ServiceProcess, routes_service: ServiceProcess, path: str
) -> None:
    with service.client() as lean_client, routes_service.client() as route_client:
        lean = lean_client.post(path, content=ONE, headers=JSON_TYPE)
        route = route_client.post(path, content=ONE, headers=JSON_TYPE)
    _assert_same(lean, route)
    assert lean.status_code in (404, 422)


def test_livez_answers_alike(service: ServiceProcess, routes_service: ServiceProcess) -> None:
    with service.client() as lean_client, routes_service.client() as route_client:
        lean, route = lean_client.get("/livez"), route_client.get("/livez")
    assert lean.status_code == route.status_code == 200
    assert lean.headers["content-type"] == route.headers["content-type"]
    assert lean.json() == route.json()


def test_ingestion_takes_the_lean_path_when_on_and_only_then(
    service: ServiceProcess, routes_service: ServiceProcess, name: str
) -> None:
    route = "/v1/models/{name}/samples"
    for proc, taken in ((service, 3.0), (routes_service, 0.0)):
        with proc.client() as client:
            make_model(client, name, 2)
            before = lean_count(client, route)
            for _ in range(3):
                assert _post(client, name, "", {}, ONE).status_code == 202
            assert lean_count(client, route) - before == taken
            metrics = client.get("/metrics").text
            assert f'route="{route}",status="202"' in metrics


def test_an_error_escaping_the_service_layers_is_a_problem() -> None:
    """The service's ASGI layers wrap FastAPI's stack (``service.app.create_app``); what
    escapes them is still answered 500 as problem+json. Here, an application whose lifespan
    never ran has no registry: owner routing fails on a request for a model's metric."""
    from service.app import create_app
    from service.config import Settings

    app = create_app(Settings(redis_url="redis://127.0.0.1:1/0"))

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/v1/models/some-model/metric")

    response = asyncio.run(send())
    body = assert_problem(response, 500)
    assert "unexpected" in body["detail"]
