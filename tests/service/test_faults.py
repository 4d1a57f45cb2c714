"""Misbehaving WebSocket clients: slow /events readers, a /stream client that never reads its
acks, clients that disconnect mid-frame. Ingestion for others goes on and memory stays bounded.

(kill -9 of the service: test_durability.py; Redis killed and restarted: test_redis_outage.py;
the lease owner killed or paused: test_two_processes.py.)
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.service.support import (
    Launch,
    RedisServer,
    core_learner,
    make_model,
    rss_bytes,
    scrape,
    series,
    stream,
)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def ws_handshake(port: int, path: str, rcvbuf: int = 4096) -> socket.socket:
    """A WebSocket opened by hand, so the test controls exactly what is (not) read or sent."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # small: fills up quickly
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return sock


def ws_frame(payload: bytes, declared: int | None = None) -> bytes:
    """A masked client text frame; ``declared`` lies about the payload length."""
    n = len(payload) if declared is None else declared
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 2**16:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def test_slow_and_broken_websocket_clients_do_not_hold_up_ingestion(
    tmp_path: Path, own_redis: RedisServer, launch: Launch
) -> None:
    svc = launch(tmp_path, own_redis.url).start()
    X, y = stream(3000, 8, 4, seed=9)
    sockets: list[socket.socket] = []
    try:
        with svc.client() as api:
            make_model(api, "m", 8, gamma=0.02)
            make_model(api, "noise", 8)
            warm = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(100)]}
            api.post("/v1/models/noise/samples?wait=true", json=warm)
            baseline = rss_bytes(svc.pid)

            # 10 /events readers that never read, pushed at every change (10 ms)
            for _ in range(10):
                sockets.append(ws_handshake(svc.port, "/v1/models/m/events?interval_ms=10"))
            # 4 /stream clients that send until TCP pushes back, and never read an ack
            frame = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(50)]}
            for c in range(4):
                sock = ws_handshake(svc.port, "/v1/models/noise/stream")
                sock.settimeout(0.5)
                try:
                    for k in range(5000):
                        sock.sendall(ws_frame(json.dumps({"id": f"{c}-{k}", **frame}).encode()))
                except TimeoutError:
                    pass  # the server stopped reading: its window is full
                sockets.append(sock)
            # 30 clients that vanish in the middle of a 100 kB frame
            for _ in range(30):
                with ws_handshake(svc.port, "/v1/models/noise/stream") as sock:
                    sock.sendall(ws_frame(b'{"id": 1, "samples": [' + b" " * 50_000, 100_000))

            order: list[int] = []
            for k in range(0, 3000, 10):  # someone else ingests meanwhile, unhindered
                body = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 10)]}
                answer = api.post("/v1/models/m/samples", json=body)
                assert answer.status_code == 202 and answer.json()["first_seq"] == len(order) + 1
                order += range(k, k + 10)
            got = api.get("/v1/models/m/metric", params={"min_version": 3000}).json()
            np.testing.assert_allclose(
                np.array(got["L"]), core_learner(X, y, dim=8, gamma=0.02).L, rtol=0, atol=1e-12
            )
            grown = rss_bytes(svc.pid) - baseline
            assert grown < 64 * 2**20, f"service RSS grew by {grown / 2**20:.1f} MiB"

            for sock in sockets:
                sock.close()
            deadline = time.monotonic() + 30
            while True:  # every connection's tasks and queues are released
                open_ = series(scrape(api), "opml_websocket_connections")
                if sum(open_.values()) == 0:
                    break
                assert time.monotonic() < deadline, open_
                time.sleep(0.1)
            assert api.get("/livez").status_code == 200
    finally:
        for sock in sockets:
            sock.close()
        svc.stop()
