"""The floor of the service's stack: a bare uvicorn app doing only the unavoidable work.

The ingestion and query benchmarks start it beside the service, on the service's own Redis
(``appendfsync always``), and drive both with the same client in the same run, so the
service's figures are read as ratios to what its stack (uvicorn, redis-py, Redis, numpy) can
do at all on that machine at that moment, rather than as absolute figures that move with the
machine.

Per one-sample frame or request it does the durable work and nothing else: parse the JSON (or
the binary frame's header and block), check the vector (dimension, finite), append with one
Lua script in the manner of the service's (sequence number, stream entry, label set, frame-id
record), group-committed (every append that arrives while a script call is in flight goes
into the next call, so one fsync covers them all), then acknowledge. The log is kept to its
last :data:`KEPT_SAMPLES` samples, as the service's checkpoints (every 10,000 samples by
default) trim its log: an unbounded log would grow by gigabytes during the binary runs and
make the Redis server that both share rewrite its AOF under either side's measurements. No
learner, no idempotency replay, no validation messages, no metrics, no authentication.

Queries (``distance``, ``verify``, ``identify``): parse, one read of a matrix cached in the
process, numpy (one BLAS thread, as the service pins its small products), answer.

    .venv/bin/python -m benchmarks.harness.floor --redis-url redis://127.0.0.1:6379/0 \\
        --port 8100 --dim 64

Routes (a subset of the service's shapes, on any model name):
``POST /v1/models/{m}/samples`` (``{"x", "y"}`` or ``{"samples": [...]}``),
``WS /v1/models/{m}/stream`` (JSON or binary frames, acks in frame order),
``POST /v1/models/{m}/distance`` and ``/verify`` (``{"a", "b"}``), ``/identify``
(``{"x", "k"}``, against a random gallery of ``--gallery`` items), ``GET /livez``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import redis.asyncio as aioredis
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The samples the floor's log keeps (the service's default ``OPML_CHECKPOINT_EVERY``).
KEPT_SAMPLES = 10_000

#: One call appends every group of ARGV[2:] (id, n, x, y): the next sequence numbers, one
#: stream entry each, the label into the label set, the frame id's record; then trims the log
#: to the entries holding its last ARGV[1] samples (an entry ``<last seq>-1`` goes once all its
#: samples are older), as the service's checkpoint script trims its log; returns first/last
#: seq per group.
APPEND = """
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local out = {}
local p = 3
for g = 1, tonumber(ARGV[2]) do
  local id, n, x, y = ARGV[p], tonumber(ARGV[p + 1]), ARGV[p + 2], ARGV[p + 3]
  p = p + 4
  local first = seq + 1
  seq = seq + n
  redis.call('XADD', KEYS[2], string.format('%d-1', seq), 'n', n, 'x', x, 'y', y)
  redis.call('SADD', KEYS[3], y)
  redis.call('HSET', KEYS[4], id, seq)
  out[#out + 1] = first
  out[#out + 1] = seq
end
redis.call('HSET', KEYS[1], 'seq', seq)
local keep = tonumber(ARGV[1])
if seq > keep then redis.call('XTRIM', KEYS[2], 'MINID', seq - keep + 1) end
return out
"""
KEYS = ["floor:meta", "floor:log", "floor:labels", "floor:ids"]
_HEADER_LEN = struct.Struct("<I")


class GroupCommit:
    """Appends queued while a script call is in flight go together into the next call."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.script = client.register_script(APPEND)
        self.pending: list[tuple[list[Any], asyncio.Future[tuple[int, int]]]] = []
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self.run())

    def append(self, frame_id: str, n: int, x: bytes, y: str) -> asyncio.Future[tuple[int, int]]:
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self.pending.append(([frame_id, n, x, y], future))
        self.wake.set()
        return future

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, []
            if not batch:
                continue
            args: list[Any] = [KEPT_SAMPLES, len(batch)]
            for group, _ in batch:
                args += group
            try:
                seqs = await self.script(keys=KEYS, args=args)
            except Exception as exc:  # every waiter learns of the failure
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for i, (_, future) in enumerate(batch):
                future.set_result((int(seqs[2 * i]), int(seqs[2 * i + 1])))


class Floor:
    """The ASGI app (see the module docstring)."""

    def __init__(self, redis_url: str, dim: int, gallery: int, gallery_dim: int) -> None:
        self.redis_url, self.dim = redis_url, dim
        #: The cached matrices of the queries, one per dimension asked for.
        self.matrices: dict[int, np.ndarray] = {}
        #: The identification gallery, already transformed (G L^T), in float32 as the
        #: service keeps it.
        rng = np.random.default_rng(1)
        GL = rng.normal(size=(gallery, gallery_dim)) @ self.matrix(gallery_dim).T
        self.GL = GL.astype(np.float32)
        self.GL_sq = np.einsum("ij,ij->i", GL, GL)
        self.commit: GroupCommit | None = None
        self.frames = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self.websocket(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                client = aioredis.from_url(self.redis_url)
                await client.delete(*KEYS)
                self.commit = GroupCommit(client)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def matrix(self, d: int) -> np.ndarray:
        if d not in self.matrices:
            rng = np.random.default_rng(d)
            self.matrices[d] = np.eye(d) + 0.01 * rng.normal(size=(d, d))
        return self.matrices[d]

    def vector(self, value: Any) -> bytes:
        x = np.asarray(value, dtype=np.float64)
        if x.shape != (self.dim,) or not np.isfinite(x).all():
            raise ValueError("x: not a finite vector of the model's dimension")
        return x.tobytes()

    def append_doc(self, doc: dict[str, Any], frame_id: str) -> asyncio.Future[tuple[int, int]]:
        assert self.commit is not None
        samples = doc.get("samples", [doc])
        if len(samples) == 1:
            s = samples[0]
            return self.commit.append(frame_id, 1, self.vector(s["x"]), str(s["y"]))
        x = b"".join(self.vector(s["x"]) for s in samples)
        y = json.dumps([s["y"] for s in samples])
        return self.commit.append(frame_id, len(samples), x, y)

    def append_binary(self, data: bytes) -> tuple[Any, asyncio.Future[tuple[int, int]]]:
        assert self.commit is not None
        (h,) = _HEADER_LEN.unpack_from(data)
        head = json.loads(data[4 : 4 + h])
        block = np.frombuffer(data, dtype="<f8", offset=4 + h)
        n = len(head["y"])
        if block.size != n * self.dim or not np.isfinite(block).all():
            raise ValueError("x: the block is not len(y) finite vectors of the model's dimension")
        y = json.dumps(head["y"])
        return head["id"], self.commit.append(str(head["id"]), n, block.tobytes(), y)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path: str = scope["path"]
        status, answer = 404, b'{"detail":"not a route of the floor"}'
        if path == "/livez":
            status, answer = 200, b'{"status":"ok"}'
        try:
            if path.endswith("/samples"):
                self.frames += 1
                first, last = await self.append_doc(json.loads(body), f"r{self.frames}")
                status = 202
                answer = b'{"accepted":%d,"first_seq":%d,"last_seq":%d}' % (
                    last - first + 1, first, last)  # fmt: skip
            elif path.endswith(("/distance", "/verify")):
                status = 200
                doc = json.loads(body)
                a, b = np.asarray(doc["a"], np.float64), np.asarray(doc["b"], np.float64)
                if a.ndim != 1 or b.shape[-1] != a.shape[0]:
                    raise ValueError("a, b: vectors of one dimension")
                z = (b - a) @ self.matrix(a.shape[0]).T  # one pair, or one-to-many
                distance = np.sqrt(np.einsum("...i,...i->...", z, z))
                if path.endswith("/verify"):
                    same = bool(distance < 1.0)
                    answer = json.dumps({"distance": float(distance), "same": same}).encode()
                else:
                    answer = json.dumps({"distance": distance.tolist()}).encode()
            elif path.endswith("/identify"):
                status = 200
                doc = json.loads(body)
                z = self.matrix(self.GL.shape[1]) @ np.asarray(doc["x"], np.float64)
                d2 = self.GL_sq - 2.0 * (self.GL @ z.astype(np.float32)) + z @ z
                k = min(int(doc.get("k", 5)), len(d2))
                top = np.argpartition(d2, k - 1)[:k]
                top = top[np.argsort(d2[top])]
                matches = [{"id": int(i), "squared_distance": float(d2[i])} for i in top]
                answer = json.dumps({"matches": matches}).encode()
        except (ValueError, KeyError, TypeError) as exc:
            status, answer = 422, json.dumps({"detail": str(exc)}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": answer})

    async def websocket(self, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept", "headers": [(b"x-opml-frames", b"json, binary")]})
        acks: asyncio.Queue[tuple[Any, asyncio.Future[tuple[int, int]]] | None] = asyncio.Queue()

        async def acknowledge() -> None:  # in frame order, as the service
            while (item := await acks.get()) is not None:
                frame_id, future = item
                try:
                    first, last = await future
                    text = json.dumps({"ack": frame_id, "first_seq": first, "last_seq": last})
                except Exception as exc:
                    text = json.dumps({"id": frame_id, "error": {"detail": str(exc)}})
                await send({"type": "websocket.send", "text": text})

        acker = asyncio.get_running_loop().create_task(acknowledge())
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    break
                try:
                    if message.get("bytes") is not None:
                        acks.put_nowait(self.append_binary(message["bytes"]))
                    else:
                        doc = json.loads(message["text"])
                        acks.put_nowait((doc["id"], self.append_doc(doc, str(doc["id"]))))
                except (ValueError, KeyError, TypeError, struct.error) as exc:
                    failed: asyncio.Future[tuple[int, int]] = asyncio.Future()
                    failed.set_exception(exc)
                    acks.put_nowait((None, failed))
        finally:
            acks.put_nowait(None)
            acker.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.floor")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--gallery", type=int, default=10_000, help="identify: gallery items")
    parser.add_argument("--gallery-dim", type=int, default=128, help="identify: their d")
    parser.add_argument("--ws-per-message-deflate", action="store_true")
    args = parser.parse_args(argv)
    uvicorn.run(
        Floor(args.redis_url, args.dim, args.gallery, args.gallery_dim),
        host=args.host,
        port=args.port,
        log_level="warning",
        ws_per_message_deflate=args.ws_per_message_deflate,
    )


if __name__ == "__main__":
    main()
