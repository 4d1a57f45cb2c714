"""The request of every operation (:class:`Call`: method, path, body, and how to read the
answer), shared by the sync and async clients; no I/O here.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import numpy as np

from clients._inputs import finite, item_ids, label, matrix, vector
from clients.types import (
    Array,
    Certificate,
    Distance,
    Distances,
    Enrolled,
    GalleryPage,
    Identified,
    IdentifiedMany,
    Ingested,
    ItemId,
    Match,
    MetricSnapshot,
    Model,
    Transformed,
    Verdict,
)

T = TypeVar("T")
NPY = "application/x-npy"
NPZ = "application/x-npz"
#: ``distances`` sends a numpy matrix of candidate rows of at least this many values as an
#: ``.npz`` body and reads the answer as ``.npy`` bytes (no number is formatted or parsed as
#: text: a 10,000 x 128 matrix is ~25 MB of JSON, whose parsing alone would cost the service
#: far more than the distances).
BINARY_MATRIX_VALUES = 4096


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


def model_path(name: str, tail: str = "") -> str:
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
    return Call("GET", model_path(name), lambda r: Model.from_json(r.json()))


def delete_model(name: str) -> Call[None]:
    return Call("DELETE", model_path(name), lambda r: None, replay_safe=False)


def ingest(
    body: dict[str, Any], name: str, wait: bool, idempotency_key: str | None
) -> Call[Ingested]:
    # A generated key makes the retry of a request whose answer was lost log nothing twice.
    key = idempotency_key or uuid.uuid4().hex
    return Call(
        "POST",
        model_path(name, "/samples"),
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
        model_path(name, "/distance"),
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
    least :data:`BINARY_MATRIX_VALUES` values, else JSON. ``restricted``: the answer is JSON
    (``.npy`` answers carry the squared distances only), whatever the body."""
    if binary is None:
        binary = isinstance(B, np.ndarray) and B.ndim == 2 and B.size >= BINARY_MATRIX_VALUES
    params = _version_params(min_version, restricted)
    if not binary:
        body = {"a": vector(a, "a"), "b": matrix(B, "b")}
        return Call("POST", model_path(name, "/distance"), _distances, body, params)
    return Call(
        "POST",
        model_path(name, "/distance"),
        _distances,
        params=params,
        headers={"Content-Type": NPZ} if restricted else {"Content-Type": NPZ, "Accept": NPY},
        content=one_to_many_npz(a, B),
    )


def one_to_many_npz(a: Any, B: Any) -> bytes:
    """The ``.npz`` body of a one-to-many ``distance``: ``a`` (d,) and ``b`` (n, d); float32
    arrays stay float32 (half the bytes, exact in the service's float64), others float64.

    >>> import io
    >>> arrays = np.load(io.BytesIO(one_to_many_npz([1, 2], np.eye(2, dtype=np.float32))))
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


def _decision(
    body: dict[str, Any], threshold: float | None, far: float | None, frr: float | None
) -> dict[str, Any]:
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
        model_path(name, "/verify"),
        lambda r: Verdict.from_json(r.json()),
        body,
        _version_params(min_version),
    )


def transform(name: str, X: Any, min_version: int | None) -> Call[Transformed]:
    return Call(
        "POST",
        model_path(name, "/transform"),
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
        model_path(name, "/metric"),
        _npy,
        params=_version_params(min_version),
        headers={"Accept": NPY},
    )


def metric_snapshot(name: str, min_version: int | None) -> Call[MetricSnapshot]:
    return Call(
        "GET",
        model_path(name, "/metric"),
        lambda r: MetricSnapshot.from_json(r.json()),
        params=_version_params(min_version),
    )


def put_metric(name: str, L: Any) -> Call[Model]:
    return Call(
        "PUT",
        model_path(name, "/metric"),
        lambda r: Model.from_json(r.json()),
        {"L": matrix(L, "L")},
    )


def roc(name: str, points: int, delta: float, min_version: int | None) -> Call[dict[str, Any]]:
    """The held-out ROC (JSON: ``points`` of threshold, estimates and bounds)."""
    params = {"points": int(points), "delta": float(delta), **_version_params(min_version)}
    return Call("GET", model_path(name, "/roc"), _json_of, params=params)


def roc_csv(name: str, points: int, delta: float, min_version: int | None) -> Call[str]:
    """The held-out ROC as CSV text (one header line, one line per threshold)."""
    params = {"points": int(points), "delta": float(delta), **_version_params(min_version)}
    return Call(
        "GET",
        model_path(name, "/roc"),
        lambda r: r.text,
        params=params,
        headers={"Accept": "text/csv"},
    )


def certificate(
    name: str, delta: float, method: str, threshold: float | None, min_version: int | None
) -> Call[Certificate]:
    params: dict[str, Any] = {"delta": float(delta), "method": method}
    if threshold is not None:
        params["threshold"] = float(threshold)
    return Call(
        "GET",
        model_path(name, "/certificate"),
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


# -- gallery and identification ----------------------------------------------------------------


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
        model_path(name, "/gallery"),
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
        model_path(name, "/identify"),
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
    array of at least :data:`BINARY_MATRIX_VALUES` values, else JSON."""
    if binary is None:
        binary = isinstance(X, np.ndarray) and X.ndim == 2 and X.size >= BINARY_MATRIX_VALUES
    params = _version_params(min_version)
    if not binary:
        body: dict[str, Any] = {"xs": matrix(X, "X"), "k": int(k)}
        _decision(body, threshold, far, frr)
        parse = IdentifiedMany.from_json
        return Call("POST", model_path(name, "/identify"), lambda r: parse(r.json()), body, params)
    params["k"] = int(k)
    _decision(params, threshold, far, frr)
    rows = finite(X, "X", 2, keep_float32=True)  # exact in the service's float64
    buf = io.BytesIO()
    np.savez(buf, xs=rows)
    content, headers = buf.getvalue(), {"Content-Type": NPZ, "Accept": NPZ}
    path = model_path(name, "/identify")
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
    raw: dict[str, Any] = {}
    if "operating_point" in a:  # a target decided: the object as its JSON text
        raw["operating_point"] = json.loads(str(a["operating_point"]))
    return IdentifiedMany(results, version, threshold, source, calibrated, raw)


def gallery_list(name: str, cursor: str | None, limit: int | None) -> Call[GalleryPage]:
    params: dict[str, Any] = {}
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = int(limit)
    return Call("GET", model_path(name, "/gallery"), _gallery_page, params=params)


def _gallery_page(response: httpx.Response) -> GalleryPage:
    doc = response.json()
    return GalleryPage(int(doc["count"]), list(doc["ids"]), doc["next_cursor"])


def gallery_delete(name: str, item_id: ItemId) -> Call[None]:
    # Not replay safe: a retry of a delete that went through would answer 404.
    path = model_path(name, "/gallery/" + quote(str(item_id), safe=""))
    return Call("DELETE", path, lambda r: None, replay_safe=False)
