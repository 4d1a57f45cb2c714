"""Hostile input: oversized bodies, named nasty cases, Schemathesis on the live OpenAPI schema,
Hypothesis-generated WebSocket frames. Always: no 5xx, every 4xx is problem+json, and a rejected
request changes nothing (model body and metric compared before and after)."""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from starlette.datastructures import QueryParams
from websockets.sync.client import connect

from tests.service.support import (
    ServiceProcess,
    assert_problem,
    make_model,
    raw_request,
    rss_bytes,
    settled,
)

# -- bodies larger than the limit are never read into memory ----------------------------------


def test_a_lying_content_length_of_1_gb_is_refused_unread(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    status, headers, body = raw_request(
        service.port,
        f"POST /v1/models/{name}/samples HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {2**30}",
        b'{"x": [1, 2], "y": "a"}',
    )
    assert status == 413 and headers["content-type"] == "application/problem+json"
    assert "OPML_MAX_BODY_BYTES" in json.loads(body)["detail"]
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0


@pytest.mark.parametrize(
    "head",
    [
        "POST /v1/models/{name}/samples HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ",
        "POST /v1/models/{name}/samples HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "\r\nzz",
        "GET /livez HTTP/1.1 extra\r\nHost: x",
    ],
    ids=["empty-transfer-encoding", "bad-chunk-size", "bad-request-line"],
)
def test_a_request_the_http_parser_refuses_gets_a_problem_and_changes_nothing(
    service: ServiceProcess, api: httpx.Client, name: str, head: str
) -> None:
    """Refused before any ASGI layer (uvicorn's parser), still problem+json (Schemathesis
    found the first case)."""
    make_model(api, name, 2)
    status, headers, body = raw_request(service.port, head.format(name=name))
    assert status == 400 and headers["content-type"] == "application/problem+json"
    assert json.loads(body)["status"] == 400
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0


def test_a_chunked_body_of_300_mb_is_cut_off_with_bounded_memory(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    before = rss_bytes(service.pid)
    sent = 0

    def body() -> Iterator[bytes]:  # produced lazily: the test holds 1 MiB at a time
        nonlocal sent
        yield b'{"samples": ['
        chunk = b'{"x": [1, 2], "y": "a"},' * (2**20 // 24)
        for _ in range(300):
            sent += len(chunk)
            yield chunk

    response = api.post(
        f"/v1/models/{name}/samples", content=body(), headers={"content-type": "application/json"}
    )
    assert_problem(response, 413)  # the rest of the body was read and dropped, never kept
    assert sent >= 299 * 2**20
    grown = rss_bytes(service.pid) - before
    assert grown < 50 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB after {sent / 2**20:.0f} MiB"
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 0
    assert api.get("/livez").status_code == 200


# -- named cases --------------------------------------------------------------------------------

NASTY: list[tuple[str, bytes | None, Any, int]] = [
    # (case, raw body or None, JSON body, expected status)
    ("NaN", b'{"x": [NaN, 1], "y": "a"}', None, 422),
    ("Infinity", b'{"x": [1, -Infinity], "y": "a"}', None, 422),
    ("overflow 1e400", b'{"x": [1e400, 1], "y": "a"}', None, 422),
    ("string in a vector", None, {"x": [1, "2"], "y": "a"}, 422),
    ("null in a vector", None, {"x": [1, None], "y": "a"}, 422),
    ("nested vector", None, {"x": [[1], [2]], "y": "a"}, 422),
    ("wrong dim", None, {"x": [1, 2, 3], "y": "a"}, 422),
    ("empty vector", None, {"x": [], "y": "a"}, 422),
    ("empty batch", None, {"samples": []}, 422),
    ("batch over OPML_MAX_BATCH", None, {"samples": [{"x": [1, 2], "y": 1}] * 501}, 422),
    ("100k-sample batch", None, {"samples": [{"x": [1, 2], "y": 1}] * 100_000}, 413),
    ("10 MB label", None, {"x": [1, 2], "y": "z" * 10_000_000}, 413),
    ("129-char label", None, {"x": [1, 2], "y": "z" * 129}, 422),
    # one JSON parser for every body: what it cannot parse, however deep, is 422 json_invalid
    ("deeply nested JSON", b'{"x": ' + b"[" * 50_000 + b"]" * 50_000 + b', "y": 1}', None, 422),
    ("not JSON", b"{'x': [1, 2]}", None, 422),
    ("JSON but not an object", None, [1, 2], 422),
    ("unknown field", None, {"x": [1, 2], "y": "a", "z": 1}, 422),
]


@pytest.mark.parametrize(("case", "raw", "body", "status"), NASTY, ids=[c[0] for c in NASTY])
def test_named_nasty_samples_are_refused_and_change_nothing(
    api: httpx.Client, name: str, case: str, raw: bytes | None, body: Any, status: int
) -> None:
    make_model(api, name, 2)
    api.post(f"/v1/models/{name}/samples?wait=true", json={"x": [1, 0], "y": "seed"})
    before = settled(api, name)
    url = f"/v1/models/{name}/samples"
    if raw is not None:
        response = api.post(url, content=raw, headers={"content-type": "application/json"})
    else:
        response = api.post(url, json=body)
    assert_problem(response, status)
    assert settled(api, name) == before


def test_1e308_is_finite_so_accepted_and_nothing_overflows_to_infinity(
    api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    samples = [{"x": [1e308, -1e308], "y": "a"}, {"x": [-1e308, 1e308], "y": "b"}] * 3
    answer = api.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples})
    assert answer.status_code == 200
    metric = api.get(f"/v1/models/{name}/metric").json()
    assert all(math.isfinite(v) for row in metric["L"] for v in row)
    # every triplet step overflowed and was skipped (as in the core): L is still the identity,
    # so ||L(a - b)||^2 = (2e308)^2 exceeds float64: a 422 naming it, never Infinity in JSON
    assert metric["L"] == [[1.0, 0.0], [0.0, 1.0]]
    far = api.post(f"/v1/models/{name}/distance", json={"a": [1e308, 0], "b": [-1e308, 0]})
    assert "overflow" in assert_problem(far, 422)["detail"]


def test_unknown_models_everywhere_are_404(api: httpx.Client, service: ServiceProcess) -> None:
    for method, path, body in [
        ("GET", "/v1/models/ghost", None),
        ("DELETE", "/v1/models/ghost", None),
        ("GET", "/v1/models/ghost/metric", None),
        ("PUT", "/v1/models/ghost/metric", {"L": [[1]]}),
        ("POST", "/v1/models/ghost/distance", {"a": [1], "b": [1]}),
        ("POST", "/v1/models/ghost/verify", {"a": [1], "b": [1]}),
        ("POST", "/v1/models/ghost/transform", {"x": [[1]]}),
    ]:
        assert_problem(api.request(method, path, json=body), 404)


@pytest.mark.parametrize("bad", ["a*", "a?", "[ab]", "{x}", "a}{b", "x{y}z", "*", "A", "a b"])
def test_model_names_with_glob_or_hash_tag_characters_are_refused(
    api: httpx.Client, rdb: redis.Redis, service: ServiceProcess, bad: str
) -> None:
    assert_problem(api.post("/v1/models", json={"name": bad, "dim": 2}), 422)
    quoted = "/v1/models/" + urllib.parse.quote(bad, safe="")
    for method, path, body in [
        ("GET", quoted, None),
        ("DELETE", quoted, None),
        ("POST", quoted + "/samples", {"x": [1, 2], "y": 1}),
        ("POST", quoted + "/distance", {"a": [1, 2], "b": [1, 2]}),
    ]:
        response = api.request(method, path, json=body)
        assert response.status_code in (404, 422)
        assert_problem(response, response.status_code)
    assert bad.encode() not in rdb.smembers("opml:models")
    assert not [k for k in rdb.scan_iter(match="opml:*") if bad.encode() in k]


# -- Schemathesis against the live schema --------------------------------------------------------


def test_schemathesis_finds_no_5xx_and_no_state_change_on_rejection(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    api.post(f"/v1/models/{name}/samples?wait=true", json={"x": [1, 0], "y": "seed"})
    existing = {m["name"] for m in api.get("/v1/models").json()["models"]}
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    session = requests.Session()
    outcomes: dict[int, int] = {}

    def check(case: Any) -> None:
        before = settled(api, name)
        version = before["model"]["version"]
        query = case.query if isinstance(case.query, dict) else {}
        # min_version as the service will read it (requests flattens lists into repeated
        # parameters; the last one counts): a wait that must run out costs 3 s, tested elsewhere
        sent = requests.Request("GET", "http://x/", params=query).prepare().url or ""
        seen = QueryParams(urlsplit(sent).query).get("min_version", "")
        if seen.isascii() and seen.isdigit() and int(seen) > version:
            query["min_version"] = version
        try:
            response = case.call(base_url=service.url, session=session, timeout=30)
        except (requests.exceptions.InvalidHeader, ValueError, UnicodeError):
            return  # the client library refused to send it: nothing reached the service
        status = response.status_code
        outcomes[status] = outcomes.get(status, 0) + 1
        headers = {k.lower(): v[0] for k, v in response.headers.items()}
        is_problem = headers.get("content-type", "").startswith("application/problem+json")
        assert status < 500, f"{case.method} {case.formatted_path}: {response.text}"
        if 400 <= status < 500:
            assert is_problem, response.text
            body = response.json()
            assert body["status"] == status and {"type", "title", "detail"} <= body.keys()
            assert settled(api, name) == before, f"{case.method} {case.formatted_path}"

    for result in schema.get_all_operations():
        operation = result.ok()
        pinned = "{name}" in operation.path and operation.method.lower() != "delete"
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(
                generation_mode=mode, path_parameters={"name": name} if pinned else None
            )

            @settings(
                max_examples=12,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def run(case: Any) -> None:
                check(case)

            try:
                run()
            except Unsatisfiable:  # nothing to violate (e.g. GET /livez has no inputs)
                continue
    for created in {m["name"] for m in api.get("/v1/models").json()["models"]} - existing:
        api.delete(f"/v1/models/{created}")
    assert sum(outcomes.values()) > 100 and any(400 <= s < 500 for s in outcomes), outcomes


# -- Hypothesis-generated WebSocket frames ---------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)
_number = st.integers(-(2**70), 2**70) | st.floats()  # NaN, Inf and huge ints included
_vector = st.lists(_number | st.text(max_size=3) | st.none(), max_size=4)
_label = st.integers() | st.text(max_size=140) | st.booleans() | st.floats() | st.none()
_sample = st.fixed_dictionaries({"x": _vector, "y": _label}) | _json
_frame = (
    st.fixed_dictionaries(
        {"id": st.integers() | st.text(max_size=300) | _json},
        optional={"x": _vector, "y": _label, "samples": st.lists(_sample, max_size=5)},
    )
    | _json
)


def test_hypothesis_websocket_frames_get_acks_or_problems_and_rejections_change_nothing(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:

        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(frame=_frame | st.text(max_size=50))
        def run(frame: Any) -> None:
            before = settled(api, name)
            ws.send(frame if isinstance(frame, str) else json.dumps(frame))
            answer = json.loads(ws.recv(timeout=10))
            if "ack" in answer:
                assert answer["last_seq"] >= answer["first_seq"] >= 1
                return
            problem = answer["error"]
            assert 400 <= problem["status"] < 500 and problem["detail"], answer
            assert {"type", "title", "status", "detail"} <= problem.keys()
            assert settled(api, name) == before

        run()
        ws.send(json.dumps({"id": "still-open", "x": [1, 2], "y": "a"}))
        assert json.loads(ws.recv(timeout=10))["ack"] == "still-open"


def test_websocket_named_cases(service: ServiceProcess, api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    before = settled(api, name)
    nasty = [
        '{"id": 1, "x": [NaN, 1], "y": "a"}',
        '{"id": 2, "x": [1, Infinity], "y": "a"}',
        '{"id": 3, "x": [1, "2"], "y": "a"}',
        '{"id": 4, "x": [1, 2, 3], "y": "a"}',
        '{"id": 5, "samples": []}',
        '{"id": 6, "x": ' + "[" * 50_000 + "]" * 50_000 + ', "y": 1}',
        json.dumps({"id": 7, "samples": [{"x": [1, 2], "y": 1}] * 501}),
    ]
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for text in nasty:
            ws.send(text)
            assert 400 <= json.loads(ws.recv(timeout=10))["error"]["status"] < 500, text
    assert _close_code_of_an_oversized_frame(service, name) == 1009
    assert settled(api, name) == before


def _close_code_of_an_oversized_frame(service: ServiceProcess, name: str) -> int:
    """The close code the service answers a frame header declaring more than its limit with.

    The header alone is sent over a raw socket: a client still writing a large payload when the
    service closes would see a reset instead of the close frame (uncompressed frames carry the
    whole payload on the wire)."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /v1/models/{name}/stream HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        # FIN + text frame, masked, 64-bit length far over any limit, the mask, no payload
        sock.sendall(bytes([0x81, 0x80 | 127]) + (1 << 40).to_bytes(8, "big") + os.urandom(4))
        while True:  # read until the service closes the connection
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    assert len(data) >= 4 and data[0] == 0x88, data[:16]  # a close frame, unmasked
    return int.from_bytes(data[2:4], "big")
