"""Slow clients are cut off: a request head a byte at a time, a body that stops or trickles,
over real sockets against a real service process with small limits (OPML_HEAD_TIMEOUT_S,
OPML_BODY_GRACE_S, OPML_BODY_MIN_RATE); slow answers and WebSockets are not."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect

from tests.service.support import RedisServer, ServiceProcess, scrape

HEAD_TIMEOUT_S = 2.0
BODY_GRACE_S = 2.0
BODY_MIN_RATE = 100
#: Far beyond the limits: a client that is not cut off by then never will be.
BOUND_S = 30.0
#: A client's pace while it dribbles (and how long it looks for the server's answer between
#: two of its bytes).
PACE_S = 0.2


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    server = RedisServer(tmp_path_factory.mktemp("slow-redis")).start()
    try:
        with ServiceProcess(
            tmp_path_factory.mktemp("slow"),
            server.url,
            OPML_HEAD_TIMEOUT_S=str(HEAD_TIMEOUT_S),
            OPML_BODY_GRACE_S=str(BODY_GRACE_S),
            OPML_BODY_MIN_RATE=str(BODY_MIN_RATE),
            OPML_MIN_VERSION_WAIT_S="5",  # longer than every limit: a slow answer is not cut
        ) as proc:
            with proc.client() as client:
                created = client.post("/v1/models", json={"name": "slow", "dim": 2})
                assert created.status_code == 201, created.text
            yield proc
    finally:
        server.stop()


def closed_count(svc: ServiceProcess, phase: str) -> float:
    with svc.client() as client:
        return scrape(client).get(
            ("opml_http_slow_clients_closed_total", frozenset({("phase", phase)})), 0.0
        )


class Dribbler:
    """A raw client socket that sends bytes at its own pace and notices the server's answer
    or close."""

    def __init__(self, svc: ServiceProcess) -> None:
        # before the connect: the server's limits run from its accept, which comes after
        self.opened = time.monotonic()
        self.sock = socket.create_connection(("127.0.0.1", svc.port), timeout=BOUND_S)
        self.received = b""
        self.closed = False

    def __enter__(self) -> Dribbler:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def poll(self, wait: float) -> bool:
        """Read what the server sent within ``wait`` seconds; True once it has closed."""
        if not self.closed and select.select([self.sock], [], [], wait)[0]:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            self.received += chunk
            self.closed = not chunk
        return self.closed

    def send(self, data: bytes) -> bool:
        """Send ``data``; False if the server has closed the connection meanwhile."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def dribble(self, data: bytes, repeat: bytes = b"") -> float:
        """Send ``data`` one byte per ``PACE_S`` (then ``repeat`` for ever) until the server
        closes (the test fails past ``BOUND_S``); the seconds since the connection was
        opened."""
        started = time.monotonic()

        def stream() -> Iterator[int]:
            yield from data
            while repeat:
                yield from repeat

        for byte in stream():
            assert time.monotonic() - started < BOUND_S, "the slow client was never cut off"
            # stop at the first byte of an answer: a byte sent after the server's close would
            # be answered by a reset, which may discard the answer before it is read
            if not self.send(bytes([byte])) or self.poll(PACE_S) or self.received:
                break
        return self.wait_closed(self.opened)

    def wait_closed(self, started: float | None = None) -> float:
        """Wait (bounded) until the server closes; the seconds since ``started``."""
        started = time.monotonic() if started is None else started
        while not self.poll(PACE_S):
            assert time.monotonic() - started < BOUND_S, f"still open: {self.received!r}"
        return time.monotonic() - started

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        head, _, body = self.received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        return int(status_line.split()[1]), headers, body


def assert_408(answer: tuple[int, dict[str, str], bytes]) -> dict[str, object]:
    status, headers, body = answer
    assert status == 408, answer
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    problem: dict[str, object] = json.loads(body)
    assert problem["type"] == "/problems/request-timeout" and problem["status"] == 408
    return problem


def still_serves(svc: ServiceProcess) -> None:
    assert httpx.get(f"{svc.url}/v1/models/slow", timeout=BOUND_S).status_code == 200


def test_a_head_sent_a_byte_at_a_time_is_answered_408_and_closed(svc: ServiceProcess) -> None:
    before = closed_count(svc, "head")
    with Dribbler(svc) as client:
        took = client.dribble(b"GET /v1/models/slow HTTP/1.1\r\nHost: x\r\nX-Pad: ", repeat=b"a")
        assert "head" in str(assert_408(client.answer())["detail"])
    assert took >= HEAD_TIMEOUT_S  # not cut before its time
    assert closed_count(svc, "head") > before
    still_serves(svc)


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(svc: ServiceProcess) -> None:
    with Dribbler(svc) as client:
        assert client.wait_closed() >= HEAD_TIMEOUT_S * 0.9
        assert client.received == b""


def test_a_later_request_on_a_kept_alive_connection_has_its_own_head_limit(
    svc: ServiceProcess,
) -> None:
    with Dribbler(svc) as client:
        assert client.send(b"GET /v1/models/slow HTTP/1.1\r\nHost: x\r\n\r\n")
        while b'"name":"slow"' not in client.received:  # the first answer, in full
            assert not client.poll(PACE_S), client.received
        client.received = b""
        client.dribble(b"GET /v1/models/slow HTTP/1.1\r\nHost: x\r\nX-Pad: ", repeat=b"b")
        assert_408(client.answer())


def test_a_body_that_stops_midway_is_answered_408_and_closed(svc: ServiceProcess) -> None:
    before = closed_count(svc, "body")
    body = json.dumps({"samples": [{"x": [1.0, 0.0], "y": "a"}] * 40}).encode()
    with Dribbler(svc) as client:
        head = (
            "POST /v1/models/slow/samples HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        assert client.send(head.encode() + body[: len(body) // 2])
        took = client.wait_closed()
        assert "body" in str(assert_408(client.answer())["detail"])
    assert took >= BODY_GRACE_S * 0.9
    assert closed_count(svc, "body") > before
    # nothing of the cut request was logged
    assert httpx.get(f"{svc.url}/v1/models/slow", timeout=BOUND_S).json()["logged_seq"] == 0


def test_a_body_trickling_below_the_floor_rate_is_cut_off(svc: ServiceProcess) -> None:
    body = b'{"name": "never", "dim": 2' + b" " * 10_000 + b"}"
    with Dribbler(svc) as client:
        head = f"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        assert client.send(head.encode())
        client.dribble(body)  # 5 bytes/s, under 100: cut after about the grace
        assert_408(client.answer())
    assert httpx.get(f"{svc.url}/v1/models/never", timeout=BOUND_S).status_code == 404


def test_a_steady_body_above_the_floor_passes(svc: ServiceProcess) -> None:
    # 600 bytes earn 6 s on top of the grace; they arrive in about 1 s
    body = json.dumps({"name": "steady", "dim": 2, "seed": 1}).encode().ljust(600)
    with Dribbler(svc) as client:
        head = f"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        assert client.send(head.encode())
        for lo in range(0, len(body), 120):
            assert client.send(body[lo : lo + 120])
            assert not client.poll(PACE_S)
        while b"\r\n\r\n" not in client.received:
            assert not client.poll(PACE_S), client.received
        assert client.answer()[0] == 201, client.received


def test_slow_answers_and_websockets_are_not_cut(svc: ServiceProcess) -> None:
    # the service takes OPML_MIN_VERSION_WAIT_S (5 s, past every limit) to answer 503
    waited = httpx.get(
        f"{svc.url}/v1/models/slow/metric", params={"min_version": 10**6}, timeout=BOUND_S
    )
    assert waited.status_code == 503, waited.text
    with connect(f"{svc.ws_url}/v1/models/slow/events?interval_ms=50", open_timeout=30) as ws:
        started = time.monotonic()
        assert "version" in json.loads(ws.recv(timeout=30))
        with connect(f"{svc.ws_url}/v1/models/slow/stream", open_timeout=30) as stream:
            n = 0  # frames past every limit's time, each acknowledged
            while time.monotonic() - started < HEAD_TIMEOUT_S + BODY_GRACE_S + 1:
                n += 1
                stream.send(json.dumps({"id": n, "x": [1.0, float(n)], "y": f"c{n % 2}"}))
                assert "ack" in json.loads(stream.recv(timeout=30))
            # the events socket, open as long, still tells of a change made now
            now = time.time()
            stream.send(json.dumps({"id": "last", "x": [2.0, 1.0], "y": "c1"}))
            assert "ack" in json.loads(stream.recv(timeout=30))
            while json.loads(ws.recv(timeout=30))["time"] < now:
                pass
