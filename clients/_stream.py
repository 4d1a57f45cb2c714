"""The WebSocket ingestion protocol as the clients speak it: stream addresses, JSON and binary
frames, the window of unacknowledged frames (what each server message means for them, when to
resend, when to give up) and the close codes that are refusals.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from clients._calls import model_path
from clients._inputs import finite, holdout_flags, label, labels, sample_docs
from clients.errors import APIError, ConnectionFailed, FrameRejected, from_problem
from clients.retry import RetryPolicy
from clients.types import Ack, Array, Label, Progress

FrameId = int | str


def ws_url(base_url: str, name: str, tail: str, params: dict[str, Any] | None = None) -> str:
    """The ``ws(s)://`` address of model ``name``'s ``tail`` (``/stream``, ``/events``), the
    name quoted as in every HTTP path (``x?y`` cannot turn into a query).

    >>> ws_url("https://h:1/", "x?y", "/events", {"interval_ms": 50})
    'wss://h:1/v1/models/x%3Fy/events?interval_ms=50'
    """
    url = httpx.URL(base_url.rstrip("/") + model_path(name, tail), params=params or None)
    return str(url.copy_with(scheme="wss" if url.scheme == "https" else "ws"))


@dataclass
class Frame:
    """A client frame as sent: its id, its JSON text (or binary message) and how many samples
    it carries."""

    id: FrameId
    text: str | bytes
    size: int


#: Handshake response header by which a service says which ``/stream`` frame encodings it reads.
FRAMES_HEADER = "x-opml-frames"
_HEADER_LEN = struct.Struct("<I")


def frames_header(ws: Any) -> str | None:
    """The ``x-opml-frames`` handshake header of a connected WebSocket (None: absent)."""
    response = getattr(ws, "response", None)
    value = None if response is None else response.headers.get(FRAMES_HEADER)
    return None if value is None else str(value)


def binary_frame(
    frame_id: FrameId, X: Array, y: list[Label], holdout: list[bool] | None = None
) -> bytes:
    """A binary ``/stream`` frame: ``uint32 LE header length | JSON {"id", "y"[, "holdout"]}
    | X`` as little-endian float64, row-major (one row per label).

    >>> data = binary_frame(7, np.array([[1.0, 2.0]]), ["a"])
    >>> int.from_bytes(data[:4], "little"), data[4:22], len(data)
    (18, b'{"id":7,"y":["a"]}', 38)
    """
    head: dict[str, Any] = {"id": frame_id, "y": y}
    if holdout is not None:
        head["holdout"] = holdout
    header = json.dumps(head, separators=(",", ":")).encode()
    block = np.ascontiguousarray(X, dtype="<f8").tobytes()
    return _HEADER_LEN.pack(len(header)) + header + block


def json_frame(data: bytes) -> str:
    """The JSON frame carrying the same samples as binary frame ``data`` (same id, same
    samples, so the service deduplicates a resend in either encoding)."""
    (size,) = _HEADER_LEN.unpack_from(data)
    head = json.loads(data[_HEADER_LEN.size : _HEADER_LEN.size + size])
    X = np.frombuffer(data[_HEADER_LEN.size + size :], dtype="<f8").reshape(len(head["y"]), -1)
    doc = {"id": head["id"], "samples": sample_docs(X.tolist(), head["y"], head.get("holdout"))}
    return json.dumps(doc, separators=(",", ":"))


class Window:
    """The unacknowledged frames of one stream and what each server message means for them.

    Frames are kept in send order, so a reconnect resends them in that order with the same ids
    (the service acknowledges an id it has logged before without logging it again). The retry
    budget counts consecutive failures (reconnects, transient frame errors) with no ack between.
    """

    def __init__(
        self,
        size: int,
        retry: RetryPolicy,
        on_progress: Callable[[Progress], None] | None,
        binary: bool | None = None,
        model: str = "",
        url: str = "",
    ) -> None:
        if size < 1:
            raise ValueError(f"window: must be >= 1, got {size}")
        self.size = size
        self.retry = retry
        self.on_progress = on_progress
        self.pending: dict[FrameId, Frame] = {}
        self.progress = Progress()
        self._prefix = uuid.uuid4().hex[:16]
        self._count = 0
        self._failures = 0
        #: Binary frames: True / False as asked, None: when the service says it reads them.
        self.binary = binary
        self._server_binary = False
        #: The model streamed to and its dimension (None: unknown, the service checks alone).
        self.model = model
        self.dim: int | None = None
        self.url = url

    def connected(self, frames_header: str | None) -> None:
        """Note what the service just connected to reads (its ``x-opml-frames`` header)."""
        offered = {p.strip() for p in (frames_header or "").split(",")}
        self._server_binary = "binary" in offered

    @property
    def use_binary(self) -> bool:
        return self._server_binary if self.binary is None else self.binary

    def payload(self, frame: Frame) -> str | bytes:
        """What to send for ``frame`` on the current connection (a binary frame made while
        connected to a service that reads them goes as JSON to one that does not)."""
        if isinstance(frame.text, bytes) and not self.use_binary:
            return json_frame(frame.text)
        return frame.text

    @property
    def full(self) -> bool:
        return len(self.pending) >= self.size

    def frame(self, X: Any, y: Any, frame_id: FrameId | None, holdout: Any = None) -> Frame:
        """A frame of the rows of ``X`` (2-D) or of one sample (``X`` 1-D, ``y`` a label);
        ``holdout``: the rows (or the sample: a bool) to route to the certification reservoir."""
        if frame_id is None:
            self._count += 1
            frame_id = f"{self._prefix}-{self._count}"
        elif isinstance(frame_id, bool) or not isinstance(frame_id, int | str):
            raise ValueError(f"frame_id: an int or a string, got {frame_id!r}")
        if frame_id in self.pending:
            raise ValueError(f"frame_id: {frame_id!r} is already in flight")
        one = np.ndim(X) == 1
        arr = finite(X, "x", 1)[None, :] if one else finite(X, "X", 2)
        if self.dim is not None and arr.shape[1] != self.dim:
            got = f"x: has {arr.shape[1]} values" if one else f"X: has {arr.shape[1]} columns"
            raise ValueError(f"{got}, model {self.model} has dim {self.dim}")
        ys = [label(y)] if one else labels(y, len(arr))
        held = holdout_flags(holdout, len(ys))
        if self.use_binary:
            return Frame(frame_id, binary_frame(frame_id, arr, ys, held), len(ys))
        doc: dict[str, Any] = {"id": frame_id}
        if one:  # the contract's single-sample frame
            doc.update(x=arr[0].tolist(), y=ys[0])
            if held:
                doc["holdout"] = True
        else:
            doc["samples"] = sample_docs(arr.tolist(), ys, held)
        return Frame(frame_id, json.dumps(doc, separators=(",", ":")), len(ys))

    def add(self, frame: Frame) -> None:
        self.pending[frame.id] = frame
        self.progress.sent_samples += frame.size
        self.progress.pending_frames = len(self.pending)

    def receive(self, text: str | bytes) -> Frame | None:
        """Apply one server message; the frame to send again after a transient error, if any.

        Raises the problem when the stream itself was refused (unknown model), and
        :class:`FrameRejected` for a frame the service will never accept.
        """
        doc = json.loads(text)
        if "ack" in doc:
            frame = self.pending.pop(doc["ack"], None)
            if frame is None:  # an ack of an id already settled; nothing to do
                return None
            self._failures = 0
            ack = Ack(
                frame.id, int(doc["first_seq"]), int(doc["last_seq"]), bool(doc.get("replayed"))
            )
            p = self.progress
            p.acked_samples += frame.size
            p.acked_frames += 1
            if ack.replayed:
                p.replayed_frames += 1
                p.replayed_samples += frame.size
            p.pending_frames = len(self.pending)
            p.last_ack = ack
            if self.on_progress is not None:
                self.on_progress(p)
            return None
        error = from_problem(int(doc.get("error", {}).get("status", 500)), doc.get("error"))
        frame_id = doc.get("id")
        if frame_id is None or frame_id not in self.pending:
            raise error
        if error.status == 503:
            return self.pending[frame_id]
        del self.pending[frame_id]
        self.progress.pending_frames = len(self.pending)
        raise FrameRejected(frame_id, error)

    def next_delay(self, cause: BaseException, retry_after: float | None = None) -> float:
        """Seconds to wait before the next retry; :class:`ConnectionFailed` when none is left."""
        if self.retry.gives_up(self._failures, cause):
            raise ConnectionFailed(
                f"stream to {self.url}: gave up after {self._failures} retries without an ack "
                f"({type(cause).__name__}: {cause})"
            ) from cause
        self._failures += 1
        return self.retry.delay(self._failures - 1, retry_after)


def close_problem(code: int | None, reason: str) -> APIError | None:
    """The error a WebSocket close code stands for, if it is not a transient drop."""
    if code == 4404:
        return from_problem(404, {"title": "Not found", "detail": reason or "no such model"})
    if code == 1008:
        return from_problem(422, {"title": "Invalid input", "detail": reason or "refused"})
    return None
