"""WebSockets: ``/stream`` (ingestion) and ``/events`` (push of the model's state).

``/stream``: a reader loop parses and validates frames and puts them on a bounded queue of
``OPML_WS_WINDOW`` frames; one sender takes them in order, appends each to the log and sends its
``ack`` (or its ``error``). When the window is full the reader stops reading, so a fast client is
held back by TCP flow control instead of by server memory. Acks and errors keep frame order.

``/events``: frames are produced at most every ``interval_ms`` when the model changed, into a
bounded per-connection queue; when a slow reader lets it fill, the oldest frame is dropped and
counted (``dropped`` in every frame), so ingestion never waits for a reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from typing import Annotated, Any

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect
from pydantic import ValidationError
from redis.exceptions import RedisError

from service import telemetry
from service.api.auth import accept_subprotocol
from service.api.deps import WsModelsDep
from service.errors import InvalidInput, NotFound, ServiceError, from_redis, validation_errors
from service.models.runtime import ModelClosed, ModelRuntime
from service.models.schemas import NAME_PATTERN, StreamFrame
from service.models.service import ModelService, updates, verification

router = APIRouter(prefix="/v1/models/{name}", tags=["websocket"])

#: Close code for a connection to a model that does not exist / was deleted.
CLOSE_NOT_FOUND = 4404


#: A received frame waiting for its answer: receipt time, frame id, parsed frame or its error.
_Pending = tuple[float, Any, StreamFrame | ServiceError]


def _frame_id(raw: Any) -> Any:
    return raw.get("id") if isinstance(raw, dict) else None


async def _open(websocket: WebSocket, models: ModelService, name: str) -> ModelRuntime | None:
    await websocket.accept(subprotocol=accept_subprotocol(websocket.scope))
    try:
        if not re.fullmatch(NAME_PATTERN, name):
            raise InvalidInput(f"name: must match {NAME_PATTERN}")
        return models.get(name)
    except ServiceError as exc:
        await websocket.send_json({"error": exc.problem(), "id": None})
        await websocket.close(CLOSE_NOT_FOUND if exc.status == 404 else 1008)
        return None


@router.websocket("/stream", name="stream_samples")
async def stream_samples(websocket: WebSocket, name: str, models: WsModelsDep) -> None:
    """Ingestion over one connection: frames in, ``ack`` / ``error`` frames out, in order."""
    if await _open(websocket, models, name) is None:
        return
    window: asyncio.Queue[_Pending | None] = asyncio.Queue(models.settings.ws_window)
    # Either side ending ends both: a client that stops reading acks and then vanishes leaves
    # the reader blocked on a full window, and only the sender's failed send notices.
    tasks = [
        asyncio.create_task(_read_frames(websocket, window)),
        asyncio.create_task(_send_acks(websocket, models, name, window)),
    ]
    telemetry.WS_CONNECTIONS.labels("stream").inc()
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        telemetry.WS_CONNECTIONS.labels("stream").dec()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _read_frames(websocket: WebSocket, window: asyncio.Queue[_Pending | None]) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            text = await websocket.receive_text()
            await window.put((time.perf_counter(), *_parse(text)))


def _parse(text: str) -> tuple[Any, StreamFrame | ServiceError]:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return None, InvalidInput(f"frame is not JSON ({exc})")
    except RecursionError:
        return None, InvalidInput("frame is nested too deeply to parse")
    try:
        return raw["id"], StreamFrame.model_validate(raw)
    except ValidationError as exc:
        items = validation_errors(exc.errors())
        where = ".".join(str(p) for p in items[0]["loc"]) if items else "frame"
        msg = items[0]["msg"] if items else "invalid frame"
        return _frame_id(raw), InvalidInput(f"{where}: {msg}", items)
    except (KeyError, TypeError):
        return None, InvalidInput("id: a frame needs an id")


async def _send_acks(
    websocket: WebSocket,
    models: ModelService,
    name: str,
    window: asyncio.Queue[_Pending | None],
) -> None:
    while True:
        item = await window.get()
        if item is None:
            return
        received, frame_id, frame = item
        try:
            if isinstance(frame, ServiceError):
                raise frame
            result = await models.ingest(
                name,
                frame.as_samples(),
                idempotency_field="w:" + json.dumps(frame.id),
                loc=["samples"] if frame.samples is not None else [],
                indexed=frame.samples is not None,
                transport="ws",
            )
            answer: dict[str, Any] = {
                "ack": frame.id,
                "first_seq": result.first_seq,
                "last_seq": result.last_seq,
            }
            if result.replayed:
                answer["replayed"] = True
        except ServiceError as exc:
            answer = {"error": exc.problem(), "id": frame_id}
        except RedisError as exc:
            telemetry.REDIS_ERRORS.labels("ws").inc()
            answer = {"error": from_redis(exc).problem(), "id": frame_id}
        await websocket.send_json(answer)
        outcome = "error" if "error" in answer else "ack"
        telemetry.WS_FRAME_DURATION.labels(outcome).observe(time.perf_counter() - received)


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
        seen = None
        while True:
            snap = runtime.snapshot
            if snap is not seen:
                seen = snap
                if len(pending) >= limit:
                    pending.popleft()
                    dropped += 1
                    telemetry.EVENTS_DROPPED.labels(name).inc()
                pending.append(
                    {
                        "version": snap.version,
                        "samples_seen": snap.version,
                        "classes": snap.classes,
                        "updates": updates(snap.counts),
                        "verification": verification(snap),
                        "metric_puts": snap.metric_puts,
                        "time": time.time(),
                    }
                )
                ready.set()
            await asyncio.sleep(interval_ms / 1000)
            await runtime.wait_change(snap)

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
    telemetry.WS_CONNECTIONS.labels("events").inc()
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if isinstance(task.exception(), ModelClosed):
                problem = NotFound(f"model {name!r} was deleted").problem()
                with contextlib.suppress(Exception):
                    await websocket.send_json({"error": problem, "id": None})
                    await websocket.close(CLOSE_NOT_FOUND)
    finally:
        telemetry.WS_CONNECTIONS.labels("events").dec()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                await task
