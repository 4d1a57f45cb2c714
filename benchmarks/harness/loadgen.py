"""Load generator for the service benchmarks: one measurement per process, JSON out.

It runs as its own process (so its CPU is not the service's) and is started by
``benchmarks/service_load.py``; it can also be pointed at any running service by hand::

    .venv/bin/python -m benchmarks.harness.loadgen ws --url http://127.0.0.1:8000 --model m64 \\
        --dim 64 --frame 64 --seconds 10 --out /tmp/ws.json

The model must exist (``service_load`` creates it). Every payload is encoded before the clock
starts (JSON: vectors in full float64 precision, compact separators, as the SDK sends them), so
the generator's own encoding cost is not part of the figures; only a WS frame's id is spliced in
at send time (one copy of the pre-encoded body, the same for both encodings). Measurements:

``ws``
    Closed loop over ``--connections`` WebSocket ingestion connections, each with at most
    ``--window`` unacknowledged frames of ``--frame`` samples. ``--encoding json`` (default):
    JSON text frames ``{"id", "samples": [{"x", "y"}, ...]}`` (``--frame 1`` sends the single
    form ``{"id", "x", "y"}``). ``--encoding binary``: the service's binary frames, ``uint32
    little-endian H | H bytes of UTF-8 JSON {"id", "y": [labels]} | len(y) x dim float64
    little-endian, row-major`` (also for ``--frame 1``); the run stops with an error unless the
    handshake answer's ``x-opml-frames`` header lists ``binary``. Acks are JSON text frames
    either way. Throughput = samples acknowledged (= durably logged) per second
    after a warm-up. Learner lag: a ``WS /events?interval_ms=10`` reader records each event's
    ``version`` and the service's wall-clock ``time`` of the event; an ack received at
    (client wall clock) ``t`` whose ``last_seq`` is ``s`` is applied by the first event with
    ``version >= s``; lag = that event's ``time - t``. Client and service share the machine's
    clock. Resolution: the service produces an event at most every 10 ms, and at the latest one
    period after the snapshot changed, so each lag is an upper bound, late by 0-10 ms (about 5 ms
    on average) plus event-loop scheduling delay. ``--rate`` (samples/s) turns the loop into a
    paced sender (used as background load during the query measurements).
``rest-one``
    Open loop: single-sample ``POST .../samples`` scheduled on a fixed timetable at ``--rate``
    requests/s; latency is measured from each request's *scheduled* time (so a stall shows up as
    latency of every request that should have been sent meanwhile: no coordinated omission).
    ``lateness`` is how late the generator itself dispatched (its own share of the latency).
``rest-batch``
    Closed loop: ``--concurrency`` workers POST ``--frame``-sample batches back to back.
``query``
    Open loop like ``rest-one`` on ``distance``, ``verify`` (one pair each) or ``livez`` (the
    HTTP stack's own floor).
``gallery``
    One-to-many ``distance`` of one vector against ``--gallery`` vectors, sequentially
    (latency per query); ``--decimals`` rounds the JSON numbers to shorten the body.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import math
import os
import random
import struct
import sys
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import connect
from websockets.speedups import apply_mask  # C: the frames' XOR mask

#: Quantiles stored for the CDF plots (dense in the tail).
CDF_Q = np.unique(np.concatenate([np.linspace(0.0, 0.99, 100), 1 - np.logspace(-2, -4, 21)]))


def stream(n: int, d: int, seed: int = 0, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark stream: unit-norm Gaussian vectors, labels cycling over ``classes``."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X, np.arange(n) % classes


def pool_size(frame: int, d: int) -> int:
    """Samples in the cyclic pool the frames are cut from (a multiple of ``frame``)."""
    want = max(4096 if d <= 128 else 1024, frame * 4)
    return frame * math.ceil(want / frame)


def summary(values_s: np.ndarray) -> dict[str, Any]:
    """p50/p90/p99/p99.9/max/mean in milliseconds, plus the CDF points for the plots."""
    v = np.asarray(values_s, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"n": 0}
    ms = v * 1e3
    return {
        "n": int(v.size),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "p999_ms": float(np.percentile(ms, 99.9)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "cdf": [[float(q), float(np.quantile(ms, q))] for q in CDF_Q],
    }


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _row(x: np.ndarray, decimals: int | None = None) -> list[float]:
    values: list[float] = x.tolist()
    return values if decimals is None else [round(v, decimals) for v in values]


# -- WebSocket ingestion ---------------------------------------------------------------------

#: Handshake answer header of ``/stream`` listing the frame encodings the service reads.
FRAMES_HEADER = "x-opml-frames"
_HEADER_LEN = struct.Struct("<I")

#: A frame's payload from its id and its position ``k`` in the connection's sequence.
Payload = Callable[[int, int], str | bytes]


def json_frames(X: np.ndarray, y: np.ndarray, frame: int) -> tuple[Payload, float]:
    """JSON text frames of ``frame`` samples cut from the pool (pre-encoded; the id is spliced
    in at send time) and their mean size in bytes."""
    n = len(X)
    if frame == 1:
        bodies = [_dumps({"x": _row(X[i]), "y": int(y[i])})[1:-1] for i in range(n)]
        prefix = ""
    else:
        bodies = [
            _dumps([{"x": _row(X[i]), "y": int(y[i])} for i in range(k, k + frame)])
            for k in range(0, n, frame)
        ]
        prefix = '"samples":'

    def payload(frame_id: int, k: int) -> str:
        return f'{{"id":{frame_id},{prefix}{bodies[k % len(bodies)]}}}'

    size = float(np.mean([len(payload(10**12, k).encode()) for k in range(len(bodies))]))
    return payload, size


def binary_frames(X: np.ndarray, y: np.ndarray, frame: int) -> tuple[Payload, float]:
    """The service's binary frames of ``frame`` samples (header tail and float64 block
    pre-encoded; the id and the header length are spliced in at send time), mean bytes."""
    parts = [
        (
            b"," + _dumps({"y": [int(v) for v in y[k : k + frame]]})[1:].encode(),
            np.ascontiguousarray(X[k : k + frame], dtype="<f8").tobytes(),
        )
        for k in range(0, len(X), frame)
    ]

    def payload(frame_id: int, k: int) -> bytes:
        tail, block = parts[k % len(parts)]
        head = b'{"id":%d%b' % (frame_id, tail)
        return b"".join((_HEADER_LEN.pack(len(head)), head, block))

    size = float(np.mean([len(payload(10**12, k)) for k in range(len(parts))]))
    return payload, size


class LoadgenError(Exception):
    """A measurement that cannot run as asked (reported on stderr, exit status 2)."""


class RawWebSocket:
    """A minimal RFC 6455 client for the ingestion connections (``ws``).

    Why not the ``websockets`` asyncio client (still used for ``/events``): it costs ~40 us of
    generator CPU per frame sent and ack received on this machine, as much as a lean service
    spends per frame, so at tens of thousands of frames per second the generator would take the
    CPU the service needs (the service, its redis-server and the generator share 2 cores). This
    one frames a pre-encoded payload with a fresh 4-byte mask per frame (XOR in C,
    ``websockets.speedups.apply_mask``), writes it without waiting (asyncio buffers, and flushes
    the frames written in one event-loop turn together), and parses every complete server frame
    of each chunk read in one pass; pings are answered, a close frame ends :meth:`receive`.

    ``deflate=True`` offers permessage-deflate (RFC 7692) as browsers and Python's websockets
    do; if the service accepts, messages are compressed (with the context kept between
    messages unless the service's answer says otherwise) and compressed acks are inflated.
    :attr:`deflate` says whether it was negotiated.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> None:
        self.reader, self.writer, self.headers = reader, writer, headers
        self._buffer = b""
        extension = headers.get("sec-websocket-extensions", "")
        params = {
            k.strip(): v.strip() for k, _, v in (p.partition("=") for p in extension.split(";")[1:])
        }
        #: True when the service accepted permessage-deflate.
        self.deflate = extension.startswith("permessage-deflate")
        self._bits = int(params.get("client_max_window_bits") or 15)
        self._reset_compressor = "client_no_context_takeover" in params
        self._reset_inflater = "server_no_context_takeover" in params
        self._compressor = zlib.compressobj(wbits=-self._bits)
        self._inflater = zlib.decompressobj(wbits=-15)

    @classmethod
    async def connect(cls, url: str, deflate: bool = False) -> RawWebSocket:
        """Open ``ws://host:port/path`` (the handshake must answer 101)."""
        offer = (
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            if deflate
            else ""
        )
        parts = httpx.URL(url)
        reader, writer = await asyncio.open_connection(parts.host, parts.port or 80)
        key = base64.b64encode(os.urandom(16)).decode()
        target = parts.raw_path.decode()
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {parts.host}:{parts.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{offer}\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        if status_line.split()[1] != "101":
            writer.close()
            raise LoadgenError(f"{url}: the handshake was answered {status_line!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
        return cls(reader, writer, headers)

    def _frame(self, opcode: int, payload: bytes) -> bytes:
        first = 0x80 | opcode
        if self.deflate and opcode in (0x1, 0x2):  # data frames only; RSV1 marks compression
            payload = self._compressor.compress(payload) + self._compressor.flush(zlib.Z_SYNC_FLUSH)
            payload = payload[:-4]  # RFC 7692 7.2.1: without the trailing 00 00 ff ff
            if self._reset_compressor:
                self._compressor = zlib.compressobj(wbits=-self._bits)
            first |= 0x40
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", first, 0x80 | n)
        elif n < 65536:
            head = struct.pack("!BBH", first, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", first, 0x80 | 127, n)
        mask = random.randbytes(4)
        return head + mask + apply_mask(payload, mask)

    def send(self, message: str | bytes) -> None:
        """Write one text (``str``) or binary (``bytes``) message."""
        if isinstance(message, str):
            self.writer.write(self._frame(0x1, message.encode()))
        else:
            self.writer.write(self._frame(0x2, message))

    async def drain(self) -> None:
        await self.writer.drain()

    async def receive(self) -> list[str | bytes]:
        """The messages of the next chunk read (at least one); ConnectionError once closed."""
        while True:
            chunk = await self.reader.read(1 << 16)
            if not chunk:
                raise ConnectionError("the service closed the connection")
            data = self._buffer + chunk
            out: list[str | bytes] = []
            pos = 0
            while len(data) - pos >= 2:
                opcode, n = data[pos] & 0x0F, data[pos + 1] & 0x7F
                compressed = bool(data[pos] & 0x40)
                start = pos + 2
                if n == 126:
                    if len(data) - start < 2:
                        break
                    (n,) = struct.unpack_from("!H", data, start)
                    start += 2
                elif n == 127:
                    if len(data) - start < 8:
                        break
                    (n,) = struct.unpack_from("!Q", data, start)
                    start += 8
                if len(data) - start < n:
                    break
                payload = data[start : start + n]
                pos = start + n
                if compressed:
                    payload = self._inflater.decompress(payload + b"\x00\x00\xff\xff")
                    if self._reset_inflater:
                        self._inflater = zlib.decompressobj(wbits=-15)
                if opcode == 0x1:
                    out.append(payload.decode())
                elif opcode == 0x2:
                    out.append(payload)
                elif opcode == 0x9:  # ping: pong with its payload
                    self.writer.write(self._frame(0xA, payload))
                elif opcode == 0x8:
                    raise ConnectionError(f"the service closed the WebSocket: {payload!r}")
            self._buffer = data[pos:]
            if out:
                return out

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.write(self._frame(0x8, struct.pack("!H", 1000)))
            self.writer.close()
            await self.writer.wait_closed()


def check_frames_header(ws: RawWebSocket, encoding: str) -> None:
    """Stop unless the service said (handshake ``x-opml-frames``) that it reads ``encoding``."""
    if encoding == "json":
        return
    value = ws.headers.get(FRAMES_HEADER)
    offered = {p.strip() for p in (value or "").split(",")}
    if encoding not in offered:
        raise LoadgenError(
            f"ws --encoding {encoding}: the service does not read {encoding} frames "
            f"(handshake header {FRAMES_HEADER}: {value!r})"
        )


class _Connection:
    """One ingestion connection: a sender bounded by the window and a receiver of acks."""

    def __init__(self, index: int, make: Payload, frame: int, window: int) -> None:
        self.index = index  # frame ids index * 10^9 + k: distinct per connection
        self.make = make
        self.frame = frame
        self.window = asyncio.Semaphore(window)
        self.sent: dict[int, float] = {}
        self.acks: list[tuple[float, int, int, float]] = []  # (wall, last_seq, n, rtt)
        self.errors = 0
        self.first_error: Any = None
        self.next = 0

    def payload(self, k: int) -> tuple[int, str | bytes]:
        frame_id = self.index * 1_000_000_000 + k
        return frame_id, self.make(frame_id, k)

    async def send_loop(self, ws: RawWebSocket, stop_at: float, rate: float | None) -> None:
        start = time.perf_counter()
        while time.perf_counter() < stop_at:
            await self.window.acquire()
            if rate:
                due = start + self.next * self.frame / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            frame_id, data = self.payload(self.next)
            self.next += 1
            self.sent[frame_id] = time.perf_counter()
            ws.send(data)
            await ws.drain()

    async def receive_loop(self, ws: RawWebSocket) -> None:
        while True:
            messages = await ws.receive()
            now_wall, now = time.time(), time.perf_counter()
            for raw in messages:
                doc = json.loads(raw)
                self.window.release()
                if "ack" not in doc:
                    self.errors += 1
                    if self.first_error is None:
                        self.first_error = doc
                    self.sent.pop(doc.get("id"), None)
                    continue
                sent = self.sent.pop(doc["ack"], now)
                n = doc["last_seq"] - doc["first_seq"] + 1
                self.acks.append((now_wall, int(doc["last_seq"]), n, now - sent))


async def _events(url: str, log: list[tuple[float, int]], opened: asyncio.Event) -> None:
    async with connect(url, max_size=None, compression=None) as ws:
        opened.set()
        async for raw in ws:
            doc = json.loads(raw)
            if "version" in doc:
                log.append((float(doc.get("time", time.time())), int(doc["version"])))


async def run_ws(args: argparse.Namespace) -> dict[str, Any]:
    base = args.url.replace("http", "ws", 1) + f"/v1/models/{args.model}"
    n = pool_size(args.frame, args.dim)
    X, y = stream(n, args.dim, args.seed)
    encode = binary_frames if args.encoding == "binary" else json_frames
    make, frame_bytes = encode(X, y, args.frame)
    events: list[tuple[float, int]] = []
    opened = asyncio.Event()
    ev_task = None
    if args.events:
        ev_task = asyncio.create_task(_events(base + "/events?interval_ms=10", events, opened))
        await asyncio.wait_for(opened.wait(), 10)
    conns = [
        _Connection(args.first_id + i, make, args.frame, args.window)
        for i in range(args.connections)
    ]
    sockets = [await RawWebSocket.connect(base + "/stream", args.deflate) for _ in conns]
    try:
        for ws in sockets:
            check_frames_header(ws, args.encoding)
        deflate = all(ws.deflate for ws in sockets)
        receivers = [
            asyncio.create_task(c.receive_loop(ws)) for c, ws in zip(conns, sockets, strict=True)
        ]
        t0_wall, t0, cpu0 = time.time(), time.perf_counter(), time.process_time()
        stop_at = t0 + args.seconds
        rate = args.rate / args.connections if args.rate else None
        await asyncio.gather(
            *(c.send_loop(ws, stop_at, rate) for c, ws in zip(conns, sockets, strict=True))
        )
        t_end_wall, cpu_run = time.time(), time.process_time() - cpu0
        deadline = time.perf_counter() + 60
        while any(c.sent for c in conns) and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)
        for task in receivers:
            task.cancel()
    finally:
        for ws in sockets:
            await ws.close()
    acks = sorted(a for c in conns for a in c.acks)
    warm = min(1.0, 0.15 * args.seconds)
    steady = [a for a in acks if t0_wall + warm <= a[0] <= t_end_wall]
    span = t_end_wall - (t0_wall + warm)
    samples_steady = sum(a[2] for a in steady)
    out: dict[str, Any] = {
        "kind": "ws",
        "encoding": args.encoding,
        "deflate_offered": args.deflate,
        "deflate": deflate,
        "dim": args.dim,
        "frame": args.frame,
        "frame_bytes": frame_bytes,
        "window": args.window,
        "connections": args.connections,
        "offered_rate": args.rate,
        "seconds": args.seconds,
        "warmup_s": warm,
        "frames_acked": len(acks),
        "samples_acked": int(sum(a[2] for a in acks)),
        "frame_errors": sum(c.errors for c in conns),
        "first_error": next((c.first_error for c in conns if c.first_error is not None), None),
        "steady_wall": [t0_wall + warm, t_end_wall],
        "generator_cpu_run_s": cpu_run * (t_end_wall - t0_wall - warm) / (t_end_wall - t0_wall),
        "throughput": samples_steady / span if span > 0 else float("nan"),
        "frames_per_s": len(steady) / span if span > 0 else float("nan"),
        "frame_rtt": summary(np.array([a[3] for a in steady])),
    }
    if ev_task is not None:
        last_seq = max((a[1] for a in acks), default=0)
        deadline = time.perf_counter() + args.drain
        while (not events or events[-1][1] < last_seq) and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        ev_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await ev_task
        times = np.array([e[0] for e in events])
        versions = np.array([e[1] for e in events])
        lags: list[float] = []
        unapplied = 0
        for wall, seq, _, _ in steady:
            i = int(np.searchsorted(versions, seq, side="left"))
            if i >= len(versions):
                unapplied += 1
                continue
            lags.append(max(0.0, times[i] - wall))
        out["lag"] = summary(np.array(lags))
        out["lag_unapplied"] = unapplied
        out["events"] = len(events)
        out["applied_at_end"] = int(versions[-1]) if len(versions) else 0
        out["catch_up_s"] = (
            float(times[-1] - t_end_wall) if len(times) and versions[-1] >= last_seq else None
        )
    return out


# -- HTTP ------------------------------------------------------------------------------------


def _client(url: str, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=60
    )
    return httpx.AsyncClient(
        base_url=url,
        limits=limits,
        timeout=httpx.Timeout(30.0),
        headers={"content-type": "application/json"},
    )


JSON_HEADERS = "Content-Type: application/json\r\n"


class RawPool:
    """A minimal HTTP/1.1 keep-alive client for the open-loop measurements.

    httpx is used for the closed-loop runs, but not here: on this machine its async client
    costs ~1-4 ms of generator CPU per request, and once requests queue for a connection its
    pool rescans every waiting request on each change (quadratic in the backlog), so at 500-1000
    requests/s the generator, not the service, set the latency. This client costs tens of
    microseconds per request: at most ``size`` persistent connections, FIFO hand-over of a
    freed connection to the oldest waiter, ``Content-Length`` or chunked bodies. A connection
    idle for ``IDLE_S`` is closed rather than reused: uvicorn closes one idle for 5 s (its
    ``timeout_keep_alive``), and a request written on it as it closes gets no answer.
    """

    IDLE_S = 4.0

    def __init__(self, url: str, size: int) -> None:
        parts = httpx.URL(url)
        self.host, self.port = parts.host, parts.port or 80
        self.size = size
        # (reader, writer, when it was freed), the most recently freed last
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.waiters: deque[asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
        self.waiters = deque()
        self.opened = 0

    async def _acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        stale = time.monotonic() - self.IDLE_S
        while self.idle and self.idle[0][2] < stale:  # the oldest first
            self.idle.pop(0)[1].close()
            self.opened -= 1
        if self.idle:
            reader, writer, _ = self.idle.pop()
            return reader, writer
        if self.opened < self.size:
            self.opened += 1
            try:
                return await asyncio.open_connection(self.host, self.port)
            except OSError:
                self.opened -= 1
                raise
        waiter: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        return await waiter

    def _release(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        if conn is None:
            self.opened -= 1
            return
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append((*conn, time.monotonic()))

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: str = JSON_HEADERS
    ) -> tuple[int, bytes]:
        """One request (``headers``: CRLF-terminated header lines); status and body."""
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = await self._acquire()
        assert conn is not None
        reader, writer = conn
        try:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{headers}"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            status = int((await reader.readline()).split()[1])
            length, chunked = 0, False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                key, _, value = line.partition(b":")
                key = key.strip().lower()
                if key == b"content-length":
                    length = int(value)
                elif key == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            if not chunked:
                return status, await reader.readexactly(length)
            parts = []
            while True:
                size = int((await reader.readline()).strip(), 16)
                parts.append(await reader.readexactly(size + 2))
                if size == 0:
                    return status, b"".join(p[:-2] for p in parts)
        except BaseException:
            writer.close()
            conn = None
            raise
        finally:
            self._release(conn)

    async def close(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()


async def open_loop(
    request: Callable[[int], Awaitable[int]], rate: float, seconds: float
) -> dict[str, Any]:
    """``rate`` requests/s on a fixed timetable; latency from each scheduled time (no
    coordinated omission), the generator's own lateness in starting each request (its timer
    and its share of the CPU), and the latency from that start (``from_send``).

    The timetable is kept by a thread that sleeps with ``time.sleep`` (a nanosecond clock) and
    hands each start to the event loop, which wakes at once. ``asyncio.sleep`` is not precise
    enough: the loop waits in ``epoll`` with a timeout rounded up to whole milliseconds, so
    every request started up to 1 ms late (about 1.1 ms at p50 when measured side by side, 0.2
    ms with the thread), and that lateness counted as latency."""
    n = int(rate * seconds)
    latency = np.full(n, np.nan)
    lateness = np.full(n, np.nan)
    statuses: dict[str, int] = {}
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, scheduled: float) -> None:
        lateness[i] = time.perf_counter() - scheduled
        try:
            key = str(await asyncio.wait_for(request(i), 30))
        except (OSError, ValueError, IndexError, TimeoutError, asyncio.IncompleteReadError) as exc:
            key = type(exc).__name__
        latency[i] = time.perf_counter() - scheduled
        statuses[key] = statuses.get(key, 0) + 1

    t0 = time.perf_counter() + 0.05
    t0_wall, cpu0 = time.time() + 0.05, time.process_time()
    loop = asyncio.get_running_loop()

    def start(i: int, scheduled: float) -> None:
        task = asyncio.create_task(one(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def timetable() -> None:  # see the docstring: a thread, not asyncio.sleep
        for i in range(n):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            loop.call_soon_threadsafe(start, i, scheduled)

    # The thread's completion reaches the loop through the same queue, after every start it
    # handed over: once this returns, every request has been started.
    await asyncio.to_thread(timetable)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    elapsed = time.perf_counter() - t0
    cpu_run = time.process_time() - cpu0
    t_end_wall = t0_wall + n / rate
    ok = sum(v for k, v in statuses.items() if k.startswith("2"))
    return {
        "offered_rate": rate,
        "requests": n,
        "ok": ok,
        "statuses": statuses,
        "achieved_rate": ok / elapsed,
        "steady_wall": [t0_wall, t_end_wall],
        "generator_cpu_run_s": cpu_run,
        "latency": summary(latency),
        "lateness": summary(lateness),
        "from_send": summary(latency - lateness),
    }


async def run_rest_one(args: argparse.Namespace) -> dict[str, Any]:
    X, y = stream(pool_size(1, args.dim), args.dim, args.seed)
    bodies = [
        _dumps({"x": _row(x), "y": int(label)}).encode() for x, label in zip(X, y, strict=True)
    ]
    path = f"/v1/models/{args.model}/samples"
    pool = RawPool(args.url, args.pool)
    await pool.request("GET", "/livez")

    async def request(i: int) -> int:
        return (await pool.request("POST", path, bodies[i % len(bodies)]))[0]

    out = await open_loop(request, args.rate, args.seconds)
    await pool.close()
    return {"kind": "rest-one", "dim": args.dim, "pool": args.pool, **out}


async def run_rest_batch(args: argparse.Namespace) -> dict[str, Any]:
    n = pool_size(args.frame, args.dim)
    X, y = stream(n, args.dim, args.seed)
    bodies = [
        _dumps({"samples": [{"x": _row(X[i]), "y": int(y[i])} for i in range(k, k + args.frame)]})
        .encode()
        for k in range(0, n, args.frame)
    ]  # fmt: skip
    path = f"/v1/models/{args.model}/samples"
    latencies: list[float] = []
    accepted = 0
    failed = 0
    async with _client(args.url, args.concurrency) as client:
        await client.get("/livez")
        t0, t0_wall, cpu0 = time.perf_counter(), time.time(), time.process_time()
        stop_at = t0 + args.seconds

        async def worker(w: int) -> None:
            nonlocal accepted, failed
            k = w
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                response = await client.post(path, content=bodies[k % len(bodies)])
                k += args.concurrency
                if response.status_code == 202:
                    accepted += int(response.json()["accepted"])
                    latencies.append(time.perf_counter() - start)
                else:
                    failed += 1

        await asyncio.gather(*(worker(w) for w in range(args.concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "kind": "rest-batch",
        "dim": args.dim,
        "batch": args.frame,
        "concurrency": args.concurrency,
        "samples_acked": accepted,
        "failed": failed,
        "throughput": accepted / elapsed,
        "steady_wall": [t0_wall, t0_wall + elapsed],
        "generator_cpu_run_s": time.process_time() - cpu0,
        "latency": summary(np.array(latencies)),
    }


async def run_query(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed + 1)
    A = rng.normal(size=(512, args.dim))
    B = rng.normal(size=(512, args.dim))
    if args.target == "livez":
        path, method, bodies = "/livez", "GET", [b""]
    else:
        path, method = f"/v1/models/{args.model}/{args.target}", "POST"
        bodies = [_dumps({"a": _row(a), "b": _row(b)}).encode() for a, b in zip(A, B, strict=True)]
    pool = RawPool(args.url, args.pool)
    for _ in range(20):  # warm the route
        await pool.request(method, path, bodies[0])

    async def request(i: int) -> int:
        return (await pool.request(method, path, bodies[i % len(bodies)]))[0]

    out = await open_loop(request, args.rate, args.seconds)
    await pool.close()
    return {"kind": "query", "target": args.target, "dim": args.dim, "pool": args.pool, **out}


async def run_gallery(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed + 2)
    a = rng.normal(size=args.dim)
    B = rng.normal(size=(args.gallery, args.dim))
    decimals = None if args.decimals < 0 else args.decimals
    headers = {"Content-Type": "application/json"}
    if args.gallery_encoding == "npz":  # the binary gallery: .npz in, .npy out
        buf = io.BytesIO()
        np.savez(buf, a=a, b=B)
        body = buf.getvalue()
        headers = {"Content-Type": "application/x-npz", "Accept": "application/x-npy"}
    else:
        body = _dumps({"a": _row(a, decimals), "b": [_row(b, decimals) for b in B]}).encode()
    path = f"/v1/models/{args.model}/distance"
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    async with _client(args.url, 1) as client:
        await client.get("/livez")
        for _ in range(args.queries):
            start = time.perf_counter()
            response = await client.post(path, content=body, headers=headers)
            if args.gallery_encoding == "npz" and response.status_code == 200:
                _ = np.load(io.BytesIO(response.content), allow_pickle=False)
            else:
                _ = response.json()  # the answer is part of the client's wait
            latencies.append(time.perf_counter() - start)
            key = str(response.status_code)
            statuses[key] = statuses.get(key, 0) + 1
    return {
        "kind": "gallery",
        "dim": args.dim,
        "gallery": args.gallery,
        "decimals": decimals,
        "encoding": args.gallery_encoding,
        "body_bytes": len(body),
        "statuses": statuses,
        "latency": summary(np.array(latencies)),
    }


RUNNERS: dict[str, Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "ws": run_ws,
    "rest-one": run_rest_one,
    "rest-batch": run_rest_batch,
    "query": run_query,
    "gallery": run_gallery,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=sorted(RUNNERS))
    parser.add_argument("--url", required=True, help="http://host:port of the service")
    parser.add_argument("--model", default="bench")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--frame", type=int, default=64, help="samples per frame / batch")
    parser.add_argument("--window", type=int, default=32, help="WS frames in flight")
    parser.add_argument(
        "--encoding", choices=("json", "binary"), default="json", help="WS frame encoding"
    )
    parser.add_argument("--connections", type=int, default=1, help="WS connections")
    parser.add_argument("--deflate", action="store_true", help="ws: offer permessage-deflate")
    parser.add_argument("--events", action="store_true", help="measure the learner lag (ws)")
    parser.add_argument("--drain", type=float, default=30.0, help="s to wait for the learner")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s (ws: samples/s)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pool", type=int, default=64, help="HTTP connections")
    parser.add_argument("--concurrency", type=int, default=4, help="rest-batch workers")
    parser.add_argument("--target", choices=("distance", "verify", "livez"), default="distance")
    parser.add_argument("--gallery", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=5)
    parser.add_argument("--decimals", type=int, default=-1, help="gallery: round (-1: no)")
    parser.add_argument("--gallery-encoding", choices=("json", "npz"), default="json",
                        help="gallery: JSON body, or .npz body with a .npy answer")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-id", type=int, default=0,
                        help="ws: index of the first connection's frame ids (index * 10^9 + k); "
                        "a run on a model that already saw these ids must start elsewhere, "
                        "or its frames are idempotent replays")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the JSON result here (else stdout)")
    args = parser.parse_args(argv)
    run: Callable[[Awaitable[dict[str, Any]]], dict[str, Any]] = asyncio.run  # type: ignore[assignment]
    with contextlib.suppress(ImportError):
        import uvloop  # the service runs on uvloop too; it cuts the generator's own cost

        run = uvloop.run
    started = time.process_time()
    try:
        result = run(RUNNERS[args.kind](args))
    except LoadgenError as exc:
        print(f"benchmarks.harness.loadgen: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    result["generator_cpu_s"] = time.process_time() - started
    result["generator_pid"] = os.getpid()
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
