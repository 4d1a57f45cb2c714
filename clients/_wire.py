"""Everything the sync and async clients share, with no I/O: input coercion, the requests of
every operation (:class:`Call`), reading answers, retry decisions, and the ingestion window.

The two clients differ only in how they wait (``time.sleep`` and blocking sockets versus
``await``); what they send, how they read answers and when they retry is decided here once.
"""

from __future__ import annotations

import io
import json
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import numpy as np

from clients.errors import APIError, ConnectionFailed, FrameRejected, from_problem
from clients.retry import RetryPolicy
from clients.types import (
    Ack,
    Array,
    Certificate,
    Distance,
    Distances,
    Ingested,
    MetricSnapshot,
    Model,
    Progress,
    Transformed,
    Verdict,
)

T = TypeVar("T")
Label = int | str
FrameId = int | str
NPY = "application/x-npy"
NPZ = "application/x-npz"
#: ``distances`` sends a numpy gallery of at least this many values as an ``.npz`` body and
#: reads the answer as ``.npy`` bytes (no number is formatted or parsed as text: a 10,000 x 128
#: gallery is ~25 MB of JSON, whose parsing alone costs the service ~0.2-0.5 s).
BINARY_GALLERY_VALUES = 4096

# -- inputs ------------------------------------------------------------------------------------


def _floats(value: Any, name: str) -> Array:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not a numeric array ({exc})") from None


def finite(value: Any, name: str, ndim: int, *, keep_float32: bool = False) -> Array:
    """``value`` as a non-empty, finite ``ndim``-D float64 array (1: a vector, 2: a matrix);
    ValueError naming ``name`` (and the first bad row) otherwise. ``keep_float32``: a float32
    numpy array stays float32 (the ``.npz`` gallery: half the bytes, exact in float64).

    >>> finite([[1, 2], [3, float("nan")]], "X", 2)
    Traceback (most recent call last):
    ValueError: X: row 1 contains NaN or Inf
    """
    keep = keep_float32 and isinstance(value, np.ndarray) and value.dtype == np.float32
    arr: Array = value if keep else _floats(value, name)
    if arr.ndim != ndim or arr.size == 0:
        kind = "vector" if ndim == 1 else "2-D matrix"
        raise ValueError(f"{name}: expected a non-empty {kind}, got shape {arr.shape}")
    ok = np.isfinite(arr)
    if not ok.all():
        if ndim == 1:
            raise ValueError(f"{name}: contains NaN or Inf")
        bad = int(np.flatnonzero(~ok.all(axis=1))[0])
        raise ValueError(f"{name}: row {bad} contains NaN or Inf")
    return arr


def vector(value: Any, name: str) -> list[float]:
    """A finite 1-D vector (list, tuple or numpy array) as a JSON list."""
    out: list[float] = finite(value, name, 1).tolist()
    return out


def matrix(value: Any, name: str) -> list[list[float]]:
    """A finite 2-D matrix with at least one row as a JSON list of lists."""
    out: list[list[float]] = finite(value, name, 2).tolist()
    return out


def label(value: Any, name: str = "y") -> Label:
    """A label as the contract knows it: an int, or a string of 1-128 characters.

    Integral floats (labels read from a numeric file) become ints; numpy scalars plain ones.

    >>> label(np.int64(3)), label(2.0), label("cat")
    (3, 2, 'cat')
    """
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name}: a label is a string or an integer, got a boolean")
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        if not float(value).is_integer():
            raise ValueError(f"{name}: a numeric label must be an integer, got {value!r}")
        return int(value)
    if isinstance(value, str):
        if not 1 <= len(value) <= 128:
            raise ValueError(f"{name}: a label has 1 to 128 characters, got {len(value)}")
        return value
    raise ValueError(f"{name}: a label is a string or an integer, got {type(value).__name__}")


def labels(values: Any, n: int) -> list[Label]:
    """``n`` labels from a sequence or 1-D array."""
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if len(seq) != n:
        raise ValueError(f"y: expected {n} labels, got {len(seq)}")
    return [label(v, f"y[{i}]") for i, v in enumerate(seq)]


def samples(X: Any, y: Any, holdout: Any = None) -> list[dict[str, Any]]:
    """Rows of ``X`` with their labels as ``[{x, y}, ...]``; ``holdout``: booleans, True for
    the rows to route to the certification reservoir (``"holdout": true``).

    >>> samples([[1.0], [2.0]], ["a", "b"], holdout=[False, True])[1]
    {'x': [2.0], 'y': 'b', 'holdout': True}
    """
    rows = matrix(X, "X")
    return sample_docs(rows, labels(y, len(rows)), holdout_flags(holdout, len(rows)))


def holdout_flags(value: Any, n: int) -> list[bool] | None:
    """``n`` booleans (True: to the certification reservoir) from a sequence or array, or None
    when none is set; one boolean applies to all ``n``.

    >>> holdout_flags(np.array([False, True]), 2), holdout_flags(None, 2), holdout_flags(True, 2)
    ([False, True], None, [True, True])
    """
    if value is None or value is False:
        return None
    if value is True:
        return [True] * n
    flags = np.asarray(value)
    if flags.dtype != np.bool_ or flags.shape != (n,):
        got = f"{flags.dtype} of shape {flags.shape}"
        raise ValueError(f"holdout: expected {n} booleans, got {got}")
    return flags.tolist() if flags.any() else None


def sample_docs(
    rows: list[list[float]], ys: list[Label], holdout: list[bool] | None = None
) -> list[dict[str, Any]]:
    """``[{x, y}, ...]`` of rows already checked and their labels (``holdout: true`` on the
    flagged ones)."""
    docs: list[dict[str, Any]] = [{"x": x, "y": lab} for x, lab in zip(rows, ys, strict=True)]
    for doc, held in zip(docs, holdout or [], strict=False):
        if held:
            doc["holdout"] = True
    return docs


# -- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request and how to read its answer.

    ``replay_safe`` says whether sending it twice is harmless, so that a connection dropped
    after the request went out may be retried (a refused connection always may).
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    replay_safe: bool = True
    #: A binary body (sent instead of ``json``, with its ``Content-Type`` in ``headers``).
    content: bytes | None = None


def _model_path(name: str, tail: str = "") -> str:
    return f"/v1/models/{quote(name, safe='')}{tail}"


def _json_of(response: httpx.Response) -> Any:
    return response.json()


def _version_params(min_version: int | None, restricted: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {} if min_version is None else {"min_version": int(min_version)}
    if restricted:  # the service's ?restricted=true: add D_R (a brm model always does)
        params["restricted"] = "true"
    return params


def create_model(name: str, dim: int, options: dict[str, Any]) -> Call[Model]:
    body = {"name": name, "dim": int(dim), **{k: v for k, v in options.items() if v is not None}}
    return Call("POST", "/v1/models", lambda r: Model.from_json(r.json()), body, replay_safe=False)


def list_models() -> Call[list[Model]]:
    return Call("GET", "/v1/models", lambda r: [Model.from_json(m) for m in r.json()["models"]])


def get_model(name: str) -> Call[Model]:
    return Call("GET", _model_path(name), lambda r: Model.from_json(r.json()))


def delete_model(name: str) -> Call[None]:
    return Call("DELETE", _model_path(name), lambda r: None, replay_safe=False)


def ingest(
    body: dict[str, Any], name: str, wait: bool, idempotency_key: str | None
) -> Call[Ingested]:
    # A generated key makes the retry of a request whose answer was lost log nothing twice.
    key = idempotency_key or uuid.uuid4().hex
    return Call(
        "POST",
        _model_path(name, "/samples"),
        lambda r: Ingested.from_json(r.json()),
        body,
        {"wait": "true"} if wait else {},
        {"Idempotency-Key": key},
    )


def distance(
    name: str, a: Any, b: Any, min_version: int | None, restricted: bool = False
) -> Call[Distance]:
    body = {"a": vector(a, "a"), "b": vector(b, "b")}
    return Call(
        "POST",
        _model_path(name, "/distance"),
        lambda r: Distance.from_json(r.json()),
        body,
        _version_params(min_version, restricted),
    )


def distances(
    name: str,
    a: Any,
    B: Any,
    min_version: int | None,
    binary: bool | None = None,
    restricted: bool = False,
) -> Call[Distances]:
    """One to many; ``binary`` None: an ``.npz`` body when ``B`` is a 2-D numpy array of at
    least :data:`BINARY_GALLERY_VALUES` values, else JSON. ``restricted``: the answer is JSON
    (``.npy`` answers carry the squared distances only), whatever the body."""
    if binary is None:
        binary = isinstance(B, np.ndarray) and B.ndim == 2 and B.size >= BINARY_GALLERY_VALUES
    params = _version_params(min_version, restricted)
    if not binary:
        body = {"a": vector(a, "a"), "b": matrix(B, "b")}
        return Call("POST", _model_path(name, "/distance"), _distances, body, params)
    return Call(
        "POST",
        _model_path(name, "/distance"),
        _distances,
        params=params,
        headers={"Content-Type": NPZ} if restricted else {"Content-Type": NPZ, "Accept": NPY},
        content=gallery_npz(a, B),
    )


def gallery_npz(a: Any, B: Any) -> bytes:
    """The ``.npz`` body of a one-to-many ``distance``: ``a`` (d,) and ``b`` (n, d); float32
    arrays stay float32 (half the bytes, exact in the service's float64), others float64.

    >>> import io
    >>> arrays = np.load(io.BytesIO(gallery_npz([1, 2], np.eye(2, dtype=np.float32))))
    >>> arrays["a"].dtype, arrays["b"].dtype, arrays["b"].shape
    (dtype('float64'), dtype('float32'), (2, 2))
    """
    va = finite(a, "a", 1, keep_float32=True)
    vb = finite(B, "b", 2, keep_float32=True)
    buf = io.BytesIO()
    np.savez(buf, a=va, b=vb)
    return buf.getvalue()


def _distances(response: httpx.Response) -> Distances:
    """A one-to-many answer: ``.npy`` squared distances (header ``X-Version``) or JSON."""
    if response.headers.get("content-type", "").startswith(NPY):
        sq = np.load(io.BytesIO(response.content), allow_pickle=False).astype(np.float64)
        return Distances(np.sqrt(sq), sq, int(response.headers["x-version"]))
    return Distances.from_json(response.json())


def _decision(body: dict[str, Any], threshold: float | None, far: float | None,
              frr: float | None) -> dict[str, Any]:  # fmt: skip
    """``threshold`` or a target rate ``far`` / ``frr`` (the service refuses two at once)."""
    for key, value in (("threshold", threshold), ("far", far), ("frr", frr)):
        if value is not None:
            body[key] = float(value)
    return body


def verify(
    name: str,
    a: Any,
    b: Any,
    threshold: float | None,
    min_version: int | None,
    far: float | None = None,
    frr: float | None = None,
) -> Call[Verdict]:
    body: dict[str, Any] = {"a": vector(a, "a"), "b": vector(b, "b")}
    _decision(body, threshold, far, frr)
    return Call(
        "POST",
        _model_path(name, "/verify"),
        lambda r: Verdict.from_json(r.json()),
        body,
        _version_params(min_version),
    )


def transform(name: str, X: Any, min_version: int | None) -> Call[Transformed]:
    return Call(
        "POST",
        _model_path(name, "/transform"),
        lambda r: Transformed.from_json(r.json()),
        {"x": matrix(X, "x")},
        _version_params(min_version),
    )


def _npy(response: httpx.Response) -> Array:
    L: Array = np.load(io.BytesIO(response.content), allow_pickle=False).astype(np.float64)
    return L


def metric(name: str, min_version: int | None) -> Call[Array]:
    return Call(
        "GET",
        _model_path(name, "/metric"),
        _npy,
        params=_version_params(min_version),
        headers={"Accept": NPY},
    )


def metric_snapshot(name: str, min_version: int | None) -> Call[MetricSnapshot]:
    return Call(
        "GET",
        _model_path(name, "/metric"),
        lambda r: MetricSnapshot.from_json(r.json()),
        params=_version_params(min_version),
    )


def put_metric(name: str, L: Any) -> Call[Model]:
    return Call(
        "PUT",
        _model_path(name, "/metric"),
        lambda r: Model.from_json(r.json()),
        {"L": matrix(L, "L")},
    )


def roc(name: str, points: int, delta: float, min_version: int | None) -> Call[dict[str, Any]]:
    """The held-out ROC (JSON: ``points`` of threshold, estimates and bounds)."""
    params = {"points": int(points), "delta": float(delta), **_version_params(min_version)}
    return Call("GET", _model_path(name, "/roc"), _json_of, params=params)


def roc_csv(name: str, points: int, delta: float, min_version: int | None) -> Call[str]:
    """The held-out ROC as CSV text (one header line, one line per threshold)."""
    params = {"points": int(points), "delta": float(delta), **_version_params(min_version)}
    return Call(
        "GET", _model_path(name, "/roc"), lambda r: r.text, params=params,
        headers={"Accept": "text/csv"},
    )  # fmt: skip


def certificate(
    name: str, delta: float, method: str, threshold: float | None, min_version: int | None
) -> Call[Certificate]:
    params: dict[str, Any] = {"delta": float(delta), "method": method}
    if threshold is not None:
        params["threshold"] = float(threshold)
    return Call(
        "GET",
        _model_path(name, "/certificate"),
        lambda r: Certificate.from_json(r.json()),
        params={**params, **_version_params(min_version)},
    )


def livez() -> Call[dict[str, Any]]:
    return Call("GET", "/livez", _json_of)


def readyz() -> Call[dict[str, Any]]:
    return Call("GET", "/readyz", _json_of)


def prometheus() -> Call[str]:
    return Call("GET", "/metrics", lambda r: r.text)


def openapi() -> Call[dict[str, Any]]:
    return Call("GET", "/openapi.json", _json_of)


# -- answers and retries -----------------------------------------------------------------------


def retry_after(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds (the delta-seconds form; an HTTP date counts as absent)."""
    value = headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def problem(response: httpx.Response) -> APIError:
    """The exception for a 4xx/5xx answer."""
    where = f"{response.request.method} {response.request.url.path}"
    return refusal(response.status_code, response.content, where, retry_after(response.headers))


def refusal(
    status: int, body: bytes | bytearray, where: str, retry_after: float | None = None
) -> APIError:
    """The exception for status ``status`` with ``body``: its problem document, or, when the
    body is none (a proxy's empty 403, an HTML error page), a message that names the status
    and ``where`` it came from.

    >>> str(refusal(403, b"", "WebSocket /v1/models/faces/stream"))
    '403 Forbidden: WebSocket /v1/models/faces/stream answered 403 with an empty body'
    """
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("detail" in doc or "title" in doc):
        return from_problem(status, doc, retry_after)
    text = body.decode(errors="replace").strip()
    said = f": {text[:200]}" if text else " with an empty body"
    return from_problem(status, {"detail": f"{where} answered {status}{said}"}, retry_after)


def handshake_refusal(status: int, body: bytes | bytearray, url: str) -> Exception:
    """What a refused WebSocket handshake raises: its :class:`APIError` (401, 403, 404, 422,
    ...), or :class:`ConnectionError` for a 5xx (transient: the stream reconnects)."""
    where = f"WebSocket {httpx.URL(url).path}"
    if status >= 500:
        return ConnectionError(f"{where}: handshake answered {status}")
    return refusal(status, body, where)


#: Failures where the request never reached the service: retrying cannot apply it twice.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def should_retry(call: Call[Any], failure: Exception) -> bool:
    """Whether ``failure`` (a transport error or an :class:`APIError`) is worth a retry (the
    :class:`RetryPolicy` may still give up: :meth:`RetryPolicy.gives_up`)."""
    if isinstance(failure, APIError):
        return failure.status == 503  # a rejected request changed nothing
    if isinstance(failure, NOT_SENT):
        return True
    return call.replay_safe and isinstance(failure, httpx.TransportError)


def give_up(failure: Exception, url: str) -> Exception:
    """What the caller sees once the retries on ``url`` are spent (or none is worth it)."""
    if isinstance(failure, APIError):
        return failure
    if isinstance(failure, (*NOT_SENT, ConnectionRefusedError)):
        return ConnectionFailed(f"cannot connect to {url}: {failure}")
    return ConnectionFailed(f"connection to {url} failed: {type(failure).__name__}: {failure}")


def ws_url(base_url: str, name: str, tail: str, params: dict[str, Any] | None = None) -> str:
    """The ``ws(s)://`` address of model ``name``'s ``tail`` (``/stream``, ``/events``), the
    name quoted as in every HTTP path (``x?y`` cannot turn into a query).

    >>> ws_url("https://h:1/", "x?y", "/events", {"interval_ms": 50})
    'wss://h:1/v1/models/x%3Fy/events?interval_ms=50'
    """
    url = httpx.URL(base_url.rstrip("/") + _model_path(name, tail), params=params or None)
    return str(url.copy_with(scheme="wss" if url.scheme == "https" else "ws"))


# -- ingestion window --------------------------------------------------------------------------


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


# -- gallery and identification ----------------------------------------------------------------
# (Answer types here rather than in clients.types while clients/ is being restructured; they
# follow the same pattern: frozen, built from the answer, the whole document kept in ``raw``.)

ItemId = int | str


@dataclass(frozen=True)
class Match:
    """One gallery item of an identify answer (``y`` None: the item has no label)."""

    id: ItemId
    y: Label | None
    squared_distance: float
    same: bool

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Match:
        return cls(doc["id"], doc.get("y"), float(doc["squared_distance"]), bool(doc["same"]))


@dataclass(frozen=True)
class Identified:
    """``identify`` of one vector: matches in ascending distance (ties by id), the ``version``
    of ``L`` they are exact for, and the threshold ``same`` was decided with."""

    matches: list[Match]
    version: int
    threshold: float
    threshold_source: str
    calibrated: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Identified:
        return cls([Match.from_json(m) for m in doc["matches"]], *_decided(doc), doc)

    @property
    def unknown(self) -> bool:
        """No match passes the threshold: nobody the gallery knows."""
        return not any(m.same for m in self.matches)

    @property
    def operating_point(self) -> dict[str, Any] | None:
        """The certified operating point that decided (a ``far`` / ``frr`` target)."""
        point: dict[str, Any] | None = self.raw.get("operating_point")
        return point


@dataclass(frozen=True)
class IdentifiedMany:
    """``identify`` of several vectors: one list of matches per vector, in order. From the
    binary answer the ids and labels are their string forms (``.npz`` holds no mixed types)."""

    results: list[list[Match]]
    version: int
    threshold: float
    threshold_source: str
    calibrated: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> IdentifiedMany:
        results = [[Match.from_json(m) for m in r["matches"]] for r in doc["results"]]
        return cls(results, *_decided(doc), doc)


def _decided(doc: dict[str, Any]) -> tuple[int, float, str, bool]:
    source = str(doc["threshold_source"])
    return int(doc["version"]), float(doc["threshold"]), source, bool(doc["calibrated"])


@dataclass(frozen=True)
class Enrolled:
    """An enrol's answer: items sent, how many replaced an enrolled id, the gallery's size."""

    enrolled: int
    replaced: int
    size: int
    replayed: bool = False


@dataclass(frozen=True)
class GalleryPage:
    """One page of a gallery's ids (in the order of their string form) and its item count;
    ``next_cursor`` (None after the last page) fetches the next."""

    count: int
    ids: list[ItemId]
    next_cursor: str | None


def item_ids(values: Any, n: int) -> list[ItemId]:
    """``n`` gallery ids: ints, or strings of 1-256 characters (as labels, integral numbers
    from a numeric file become ints).

    >>> item_ids(np.array([3.0, 4.0]), 2), item_ids(["a", 7], 2)
    ([3, 4], ['a', 7])
    """
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if len(seq) != n:
        raise ValueError(f"ids: expected {n} ids, got {len(seq)}")
    out: list[ItemId] = []
    for i, value in enumerate(seq):
        if isinstance(value, str) and not 1 <= len(value) <= 256:
            raise ValueError(f"ids[{i}]: an id has 1 to 256 characters, got {len(value)}")
        out.append(value if isinstance(value, str) else label(value, f"ids[{i}]"))
    return out


def enroll(name: str, ids: Any, X: Any, y: Any, idempotency_key: str | None) -> Call[Enrolled]:
    """Enrol rows of ``X`` under ``ids`` (labels ``y``: a sequence with None for none, or None).
    A generated ``Idempotency-Key`` makes a retry after a lost answer write nothing twice."""
    rows = matrix(X, "X")
    keys = item_ids(ids, len(rows))
    given = [None] * len(rows) if y is None else y.tolist() if isinstance(y, np.ndarray) else y
    if len(given) != len(rows):
        raise ValueError(f"y: expected {len(rows)} labels, got {len(given)}")
    items = []
    for i, (item_id, x, lab) in enumerate(zip(keys, rows, given, strict=True)):
        item: dict[str, Any] = {"id": item_id, "x": x}
        if lab is not None:
            item["y"] = label(lab, f"y[{i}]")
        items.append(item)
    return Call(
        "POST",
        _model_path(name, "/gallery"),
        _enrolled,
        {"items": items},
        headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex},
    )


def _enrolled(response: httpx.Response) -> Enrolled:
    doc = response.json()
    replayed = response.headers.get("idempotent-replayed") == "true"
    return Enrolled(int(doc["enrolled"]), int(doc["replaced"]), int(doc["size"]), replayed)


def identify(
    name: str,
    x: Any,
    k: int,
    threshold: float | None,
    min_version: int | None,
    far: float | None = None,
    frr: float | None = None,
) -> Call[Identified]:
    body: dict[str, Any] = {"x": vector(x, "x"), "k": int(k)}
    _decision(body, threshold, far, frr)
    return Call(
        "POST",
        _model_path(name, "/identify"),
        lambda r: Identified.from_json(r.json()),
        body,
        _version_params(min_version),
    )


def identify_many(
    name: str,
    X: Any,
    k: int,
    threshold: float | None,
    min_version: int | None,
    binary: bool | None = None,
    far: float | None = None,
    frr: float | None = None,
) -> Call[IdentifiedMany]:
    """Several vectors; ``binary`` None: an ``.npz`` body and answer when ``X`` is a 2-D numpy
    array of at least :data:`BINARY_GALLERY_VALUES` values, else JSON (always JSON with a
    target rate ``far`` / ``frr``)."""
    if binary is None:
        binary = isinstance(X, np.ndarray) and X.ndim == 2 and X.size >= BINARY_GALLERY_VALUES
    binary = binary and far is None and frr is None
    params = _version_params(min_version)
    if not binary:
        body: dict[str, Any] = {"xs": matrix(X, "X"), "k": int(k)}
        _decision(body, threshold, far, frr)
        parse = IdentifiedMany.from_json
        return Call("POST", _model_path(name, "/identify"), lambda r: parse(r.json()), body, params)
    params["k"] = int(k)
    if threshold is not None:
        params["threshold"] = float(threshold)
    rows = finite(X, "X", 2, keep_float32=True)  # exact in the service's float64
    buf = io.BytesIO()
    np.savez(buf, xs=rows)
    content, headers = buf.getvalue(), {"Content-Type": NPZ, "Accept": NPZ}
    path = _model_path(name, "/identify")
    return Call("POST", path, _identified_npz, params=params, headers=headers, content=content)


def _identified_npz(response: httpx.Response) -> IdentifiedMany:
    """The ``.npz`` answer of ``identify``: (m, k) arrays turned into matches."""
    a = np.load(io.BytesIO(response.content), allow_pickle=False)
    columns = (a[key].tolist() for key in ("ids", "y", "squared_distances", "same"))
    results = [
        [Match(i, y or None, sq, same) for i, y, sq, same in zip(*row, strict=True)]
        for row in zip(*columns, strict=True)
    ]
    source = str(a["threshold_source"])
    version, threshold, calibrated = int(a["version"]), float(a["threshold"]), bool(a["calibrated"])
    return IdentifiedMany(results, version, threshold, source, calibrated)


def gallery_list(name: str, cursor: str | None, limit: int | None) -> Call[GalleryPage]:
    params: dict[str, Any] = {}
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = int(limit)
    return Call("GET", _model_path(name, "/gallery"), _gallery_page, params=params)


def _gallery_page(response: httpx.Response) -> GalleryPage:
    doc = response.json()
    return GalleryPage(int(doc["count"]), list(doc["ids"]), doc["next_cursor"])


def gallery_delete(name: str, item_id: ItemId) -> Call[None]:
    # Not replay safe: a retry of a delete that went through would answer 404.
    path = _model_path(name, "/gallery/" + quote(str(item_id), safe=""))
    return Call("DELETE", path, lambda r: None, replay_safe=False)
