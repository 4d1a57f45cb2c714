"""WebSockets: ``/stream`` (ingestion) and ``/events`` (push of the model's state).

``/stream``: a reader loop parses and validates each frame, starts its append at once (queued
for the log in frame order, without a task per frame) and puts it on a bounded queue of
``OPML_WS_WINDOW`` frames; one sender takes them in order, waits for each append to return and
sends its ``ack`` (or its ``error``). When the window is full the reader stops reading, so a
fast client is held back by TCP flow control instead of by server memory; under learner
backpressure (no room for a frame's samples) it waits for room before it reads on. Acks and
errors keep frame order.

``/events``: frames are produced at most every ``interval_ms`` when the model changed, into a
bounded per-connection queue; when a slow reader lets it fill, the oldest frame is dropped and
counted (``dropped`` in every frame), so ingestion never waits for a reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from service import telemetry
from service.api.auth import accept_subprotocol
from service.api.deps import WsModelsDep
from service.api.ingestion import Items, count_accepted, count_refused, validate
from service.api.parsing import Block, error_items, invalid, invalid_request
from service.api.presenters import event_frame
from service.api.problems import count, problem, status_of
from service.api.schemas import NAME_PATTERN, BinaryHeader, StreamFrame
from service.engine.registry import Registry
from service.engine.runtime import Appended, ModelRuntime, NotServedHere
from service.engine.snapshot import ModelClosed
from service.errors import InvalidInput, NotFound, ServiceError

router = APIRouter(prefix="/v1/models/{name}", tags=["websocket"])

#: Close code for a connection to a model that does not exist / was deleted.
CLOSE_NOT_FOUND = 4404
#: Close code (RFC 6455 "try again later") when the model's learning moves to another process:
#: reconnecting reaches the new owner.
CLOSE_TRY_AGAIN = 1013


#: Handshake response header of ``/stream``: the frame encodings this server reads.
FRAMES_HEADER = "x-opml-frames"
FRAMES_SUPPORTED = "json, binary"

#: The binary frame's layout (public): a uint32 LE header length, then the block's values as
#: little-endian IEEE 754 float64, row-major (:func:`parse_binary`).
_HEADER_LEN = struct.Struct("<I")
BLOCK_DTYPE = np.dtype("<f8")


@dataclass(frozen=True)
class BinaryFrame:
    """A binary client frame (see :func:`parse_binary`): its id and its samples."""

    id: Any
    block: Block


def _frame_id(raw: Any) -> Any:
    return raw.get("id") if isinstance(raw, dict) else None


async def _open(
    websocket: WebSocket,
    models: Registry,
    name: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> ModelRuntime | None:
    await websocket.accept(subprotocol=accept_subprotocol(websocket.scope), headers=headers)
    try:
        if not re.fullmatch(NAME_PATTERN, name):
            raise invalid(["path", "name"], f"must match {NAME_PATTERN}")
        return await models.lookup(name)
    except ServiceError as exc:
        with contextlib.suppress(WebSocketDisconnect):  # the client left: nobody to tell
            await websocket.send_json({"error": problem(exc), "id": None})
            await websocket.close(CLOSE_NOT_FOUND if status_of(exc) == 404 else 1008)
        return None


@router.websocket("/stream", name="stream_samples")
async def stream_samples(websocket: WebSocket, name: str, models: WsModelsDep) -> None:
    """Ingestion over one connection: frames in, ``ack`` / ``error`` frames out, in order."""
    advertise = [(FRAMES_HEADER.encode(), FRAMES_SUPPORTED.encode())]
    runtime = await _open(websocket, models, name, advertise)
    if runtime is None:
        return
    window: asyncio.Queue[_InFlight] = asyncio.Queue(models.settings.ws_window)
    # Either side ending ends both: a client that stops reading acks and then vanishes leaves
    # the reader blocked on a full window, and only the sender's failed send notices.
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(_read_frames(websocket, runtime, window)),
        asyncio.create_task(_send_acks(websocket, runtime, window)),
    ]
    telemetry.WS_OPEN["stream"].inc()
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        telemetry.WS_OPEN["stream"].dec()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        while not window.empty():  # frames whose answer nobody will read
            _give_up(window.get_nowait()[-1])


#: The append of a frame (ModelRuntime.submit), or what refused the frame.
_Started = asyncio.Future[Appended] | ServiceError
#: A frame in flight: receipt time, id (as sent; as JSON), samples, and its append or refusal.
_InFlight = tuple[float, Any, str, int, _Started]


def _give_up(started: _Started) -> None:
    """Nobody will read the frame's answer: its samples are left out of the log if they
    were not sent yet."""
    if isinstance(started, asyncio.Future):
        started.cancel()


async def _read_frames(
    websocket: WebSocket, runtime: ModelRuntime, window: asyncio.Queue[_InFlight]
) -> None:
    """Parse and check each frame and start its append at once, without a task per frame
    (:meth:`~service.engine.runtime.ModelRuntime.submit`): it is queued for the log before the
    next frame is read, so seqs follow frame order, and frames that arrive while an append is
    in flight are logged together in the next one (group commit, one fsync). The window bounds
    the frames in flight. With no room for a frame (learner backpressure) the reader waits
    for room before it reads on."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        received = time.perf_counter()
        text, data = message.get("text"), message.get("bytes")
        frame: StreamFrame | BinaryFrame | ServiceError
        if text is not None:
            frame_id, frame = _parse(text)
        elif data is not None:
            frame_id, frame = parse_binary(data, runtime.config.dim)
        else:
            continue
        started: _Started
        samples = 0
        id_json = ""
        if isinstance(frame, ServiceError):
            started = frame
        else:
            id_json = str(frame.id) if type(frame.id) is int else json.dumps(frame.id)
            items, loc, indexed = _items(frame)
            samples = len(items)
            try:
                X, keys, holdout = validate(runtime, items, loc=loc, indexed=indexed)
                field = "w:" + id_json
                logged = runtime.submit(X, keys, holdout, field)
                if logged is None:  # no room now: wait for it before reading on
                    logged = await runtime.submit_when_room(X, keys, holdout, field)
                started = logged
            except ServiceError as exc:
                started = exc
        try:
            await window.put((received, frame_id, id_json, samples, started))
        except BaseException:
            _give_up(started)
            raise


def _items(frame: StreamFrame | BinaryFrame) -> tuple[Items, list[str | int], bool]:
    """A frame's samples (a binary frame's block, a JSON frame's list or its one sample) and
    where they are in it (``loc``, ``indexed``: see :func:`~service.api.ingestion.ingest`)."""
    if isinstance(frame, BinaryFrame):
        return frame.block, [], True
    return frame.located([])


#: Most acknowledged frames whose samples one connection counts together (see _send_acks).
COUNT_EVERY = 64


async def _send_acks(
    websocket: WebSocket, runtime: ModelRuntime, window: asyncio.Queue[_InFlight]
) -> None:
    """Each frame's answer, in frame order: its ``ack`` (made directly, one per frame) once its
    append returned, or its ``error``.

    The samples of acknowledged frames are counted together (one counter increment instead of
    one per frame): before the ack that leaves no frame waiting, every :data:`COUNT_EVERY`
    frames, and when the connection ends; so the count of an acknowledged frame is exposed
    at the latest when the connection's burst of frames is answered."""
    accepted = runtime.telemetry.accepted["ws"]
    uncounted = frames = 0
    try:
        while True:
            received, frame_id, id_json, samples, started = await window.get()
            try:
                if not isinstance(started, asyncio.Future):
                    raise started
                appended = await started
            except ServiceError as exc:
                if samples:  # a frame that did not parse is not counted
                    count_refused(runtime, "ws", samples, exc)
                count(exc, "ws")
                outcome = "error"
                reply = websocket.send_json({"error": problem(exc), "id": frame_id})
            else:
                if appended.replayed:
                    count_accepted(runtime, "ws", appended)
                    replayed = ',"replayed":true'
                else:
                    uncounted += appended.last_seq - appended.first_seq + 1
                    frames += 1
                    replayed = ""
                outcome = "ack"
                reply = websocket.send_text(
                    f'{{"ack":{id_json},"first_seq":{appended.first_seq},'
                    f'"last_seq":{appended.last_seq}{replayed}}}'
                )
            if uncounted and (frames >= COUNT_EVERY or window.empty()):
                accepted.inc(uncounted)
                uncounted = frames = 0
            await reply  # made above, sent after the count it may expose
            telemetry.WS_FRAME[outcome].observe(time.perf_counter() - received)
    finally:
        if uncounted:
            accepted.inc(uncounted)


def _parse(text: str) -> tuple[Any, StreamFrame | ServiceError]:
    try:  # the common case in one step: JSON straight into the model, no dict in between
        frame = StreamFrame.model_validate_json(text)
        return frame.id, frame
    except ValidationError:
        pass  # redo it in two steps, which name the problem exactly as they always did
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return None, invalid([], f"a frame is a JSON object; this one is not JSON ({exc})")
    except RecursionError:
        return None, invalid([], "the frame is nested too deeply to parse")
    if not isinstance(raw, dict):
        return None, invalid([], 'a frame is a JSON object, {"id", "samples"} or {"id", "x", "y"}')
    if "id" not in raw:
        return None, invalid(["id"], "a frame needs an id")
    try:
        return raw["id"], StreamFrame.model_validate(raw)
    except ValidationError as exc:
        return raw["id"], _invalid_frame(exc)


def _invalid_frame(exc: ValidationError) -> InvalidInput:
    return invalid_request(error_items(exc))


def parse_binary(data: bytes, dim: int) -> tuple[Any, BinaryFrame | ServiceError]:
    """A binary frame: ``uint32 LE header length | JSON header {"id", "y": [labels]} | block``,
    the block being ``len(y) x dim`` little-endian float64 values, row-major
    (docs/reference/websocket.md)."""
    if len(data) < _HEADER_LEN.size:
        return None, invalid(["header"], "a binary frame starts with a 4-byte header length")
    (size,) = _HEADER_LEN.unpack_from(data)
    end = _HEADER_LEN.size + size
    if end > len(data):
        return None, invalid(
            ["header"], f"header length {size} exceeds the frame ({len(data)} bytes)"
        )
    header = data[_HEADER_LEN.size : end]
    try:
        head = BinaryHeader.model_validate_json(header)
    except ValidationError as exc:
        try:
            raw = json.loads(header)
        except (ValueError, RecursionError):
            return None, invalid(["header"], "the header of a binary frame is a JSON object")
        return _frame_id(raw), _invalid_frame(exc)
    n = len(head.y)
    raw_block = memoryview(data)[end:]
    if len(raw_block) != n * dim * BLOCK_DTYPE.itemsize:
        return head.id, InvalidInput(
            f"block: expected {n} x {dim} float64 values ({n * dim * BLOCK_DTYPE.itemsize} bytes) "
            f"for {n} labels, got {len(raw_block)} bytes",
            [{"loc": ["block"], "msg": "wrong length", "type": "value_error"}],
        )
    # A read-only view of the frame, not a copy: it is logged as it came (codec.block_bytes).
    X = np.frombuffer(raw_block, dtype=BLOCK_DTYPE).reshape(n, dim)
    return head.id, BinaryFrame(head.id, Block(X, list(head.y), head.holdout))


async def _close_with(websocket: WebSocket, error: ServiceError, code: int = 0) -> None:
    """Send ``error`` as the last frame and close (4404 for NotFound unless ``code``)."""
    with contextlib.suppress(Exception):
        await websocket.send_json({"error": problem(error), "id": None})
        await websocket.close(code or CLOSE_NOT_FOUND)


@router.websocket("/events", name="model_events")
async def model_events(
    websocket: WebSocket,
    name: str,
    models: WsModelsDep,
    interval_ms: Annotated[int, Query(ge=10, le=3_600_000)] = 1000,
) -> None:
    """Push ``{version, samples_seen, classes, updates, verification, dropped}`` on change."""
    runtime = await _open(websocket, models, name)
    if runtime is None:
        return
    pending: deque[dict[str, Any]] = deque()
    ready = asyncio.Event()
    dropped = 0
    limit = models.settings.events_queue

    async def produce() -> None:
        nonlocal dropped
        while True:
            status = runtime.status()  # NotServedHere if the model moves: the socket closes
            if len(pending) >= limit:
                pending.popleft()
                dropped += 1
                runtime.telemetry.events_dropped.inc()
            pending.append(event_frame(status))
            ready.set()
            await asyncio.sleep(interval_ms / 1000)
            await runtime.wait_newer(status.snapshot)

    async def deliver() -> None:
        while True:
            await ready.wait()
            ready.clear()
            while pending:
                await websocket.send_json({**pending.popleft(), "dropped": dropped})

    async def drain() -> None:  # notices the client going away
        while True:
            await websocket.receive_text()

    tasks = [asyncio.create_task(t()) for t in (produce, deliver, drain)]
    telemetry.WS_OPEN["events"].inc()
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            deleted = isinstance(exc, ModelClosed) and not exc.moved
            if deleted or (runtime.closed and isinstance(exc, ModelClosed | NotServedHere)):
                await _close_with(websocket, NotFound(f"model {name!r} was deleted"))
            elif isinstance(exc, ModelClosed | NotServedHere):  # learned elsewhere from now on
                await _close_with(websocket, NotServedHere(name), CLOSE_TRY_AGAIN)
    finally:
        telemetry.WS_OPEN["events"].dec()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                await task
