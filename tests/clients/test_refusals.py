"""How the SDK reports refusals: API keys and scopes on HTTP and on WebSocket handshakes, a
refusal without a problem document, names that need quoting, a refused connection."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

from clients import (
    ConnectionFailed,
    Forbidden,
    FrameRejected,
    InvalidInput,
    OPMLClient,
    RetryPolicy,
    Unauthorized,
)
from service.security import entry_for
from tests.clients.support import FAST_RETRY, opml
from tests.service.support import RedisServer, ServiceProcess

KEYS = {"admin": "sdk-admin-key-0001", "ingest": "sdk-ingest-key-0002", "query": "sdk-query-key-03"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A service with one key per scope, on a Redis of its own, with model ``sec`` (dim 2)."""
    redis = RedisServer(tmp_path_factory.mktemp("redis-sdk-sec")).start()
    entries = [entry_for(key, [scope]) for scope, key in KEYS.items()]
    proc = ServiceProcess(
        tmp_path_factory.mktemp("sdk-sec"), redis.url, OPML_API_KEYS=json.dumps(entries)
    )
    try:
        proc.start()
        with OPMLClient(proc.url, api_key=KEYS["admin"]) as admin:
            admin.create_model("sec", 2)
        yield proc
    finally:
        proc.close()
        redis.stop()


def keyed(service: ServiceProcess, scope: str | None) -> OPMLClient:
    key = None if scope is None else KEYS[scope]
    return OPMLClient(service.url, api_key=key, retry=FAST_RETRY)


def test_handshake_refusals_raise_the_problem_with_its_text(secured: ServiceProcess) -> None:
    with keyed(secured, None) as anonymous, pytest.raises(Unauthorized) as no_key:
        next(anonymous.events("sec"))
    assert no_key.value.status == 401 and no_key.value.detail  # the service's own words
    assert no_key.value.type.endswith("/unauthorized")

    with keyed(secured, "ingest") as ingest, pytest.raises(Forbidden) as no_scope:
        next(ingest.events("sec"))
    assert no_scope.value.status == 403 and no_scope.value.extra["required_scope"] == "query"
    assert no_scope.value.detail in str(no_scope.value)

    with keyed(secured, "query") as query, pytest.raises(Forbidden) as stream_refused:
        query.stream("sec").open()  # may read the model, may not ingest
    assert stream_refused.value.extra["required_scope"] == "ingest"


def test_keys_go_on_the_handshake_and_an_ingest_key_streams(secured: ServiceProcess) -> None:
    """The client's key reaches the WebSocket; a key that may not read the model still streams
    (the width check is then the service's alone)."""
    with keyed(secured, "ingest") as ingest:
        with ingest.stream("sec") as s:
            s.send(np.eye(2), ["a", "b"])
        assert s.progress.acked_samples == 2
        with pytest.raises(FrameRejected) as wide, ingest.stream("sec") as s:
            s.send(np.ones((1, 3)), ["a"], frame_id="too-wide")
            s.flush()
        assert wide.value.status == 422 and wide.value.frame_id == "too-wide"
    with keyed(secured, "admin") as admin:
        # acknowledged is not yet learned: the first event may come before the writer's hold
        assert admin.distance("sec", [0, 0], [1, 1], min_version=2).version == 2
        event = next(admin.events("sec", interval_ms=20))
        assert event.samples_seen == 2
        with admin.stream("sec") as s, pytest.raises(ValueError, match=r"^X: has 3 columns"):
            s.send(np.ones((1, 3)), ["a"])  # the admin key reads the dim: refused before sending


def test_the_command_line_sends_opml_api_key(secured: ServiceProcess) -> None:
    """``$OPML_API_KEY`` authenticates every command; 401/403 exit with 7 and the reason."""
    anonymous = opml(secured, "models", "list", env={"OPML_API_KEY": ""})
    assert anonymous.returncode == 7 and anonymous.stderr.startswith("opml: 401 ")
    listed = opml(secured, "models", "list", "--json", env={"OPML_API_KEY": KEYS["query"]})
    assert listed.returncode == 0, listed.stderr
    assert [m["name"] for m in json.loads(listed.stdout)["models"]] == ["sec"]
    refused = opml(secured, "events", "sec", "--count", "1", env={"OPML_API_KEY": KEYS["ingest"]})
    assert refused.returncode == 7 and refused.stderr.startswith("opml: 403 Forbidden: ")


class _EmptyForbidden(BaseHTTPRequestHandler):
    """Every request answered 403 with no body, as some proxies do."""

    protocol_version = "HTTP/1.1"  # what a WebSocket client requires of the answer

    def do_GET(self) -> None:
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def bare_403() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyForbidden)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_a_refusal_without_a_body_names_status_and_path(bare_403: str) -> None:
    with OPMLClient(bare_403, retry=FAST_RETRY) as client:
        with pytest.raises(Forbidden) as ws:
            next(client.events("faces"))
        assert str(ws.value) == (
            "403 Forbidden: WebSocket /v1/models/faces/events answered 403 with an empty body"
        )
        with pytest.raises(Forbidden) as http:
            client.get_model("faces")
        assert str(http.value) == (
            "403 Forbidden: GET /v1/models/faces answered 403 with an empty body"
        )


def test_a_name_is_quoted_in_websocket_paths_as_in_http_paths(client: OPMLClient) -> None:
    """``x?y`` is a (bad) model name on both transports, never a path ``x`` and a query."""
    with pytest.raises(InvalidInput) as http:
        client.get_model("x?y")
    with pytest.raises(InvalidInput) as ws:
        next(client.events("x?y"))
    for refused in (http.value, ws.value):  # the service words the two differently
        assert "name" in refused.detail and "[a-z0-9]" in refused.detail


def test_a_refused_connection_fails_at_once_when_asked(service: ServiceProcess) -> None:
    """``retry_refused=False`` (the command line's policy) does not retry a refused connect;
    the default does. Both name the address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        for policy, tries in (
            (RetryPolicy(attempts=3, base_delay_s=0.01, retry_refused=False), 1),
            (RetryPolicy(attempts=3, base_delay_s=0.01), 4),
        ):
            sent: list[httpx.Request] = []
            with OPMLClient(url, retry=policy) as c:
                c._http.event_hooks["request"].append(sent.append)
                with pytest.raises(ConnectionFailed) as failed:
                    c.livez()
            assert len(sent) == tries
            assert str(failed.value).startswith(f"cannot connect to {url}/livez: ")
            assert "Connection refused" in str(failed.value)
