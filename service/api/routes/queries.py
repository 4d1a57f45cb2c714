"""Queries: pure reads of one snapshot; every answer carries its ``version``.

``distance`` and ``verify`` are the hot queries. Their routes are thin: they hand the raw body,
its ``Content-Type`` and ``min_version`` to :func:`answer_distance` / :func:`answer_verify`,
which parse them with :mod:`service.api.parsing` and answer. The lean path
(:mod:`service.api.lean`) calls the same two functions without FastAPI's per-request
machinery, so it is a pure optimisation: same parsers, same answers, same problems.

One-to-many ``distance`` also takes a binary gallery: an ``.npz`` body
(``Content-Type: application/x-npz``, ``np.savez(f, a=a, b=B)``: ``a`` of shape (d,), ``b`` of
shape (n, d), float64 or float32; read by :func:`service.api.parsing.npz_arrays`), and answers
``Accept: application/x-npy`` (either body) with the squared distances as ``.npy`` bytes and
the version in header ``X-Version``.
"""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Header, Request, Response

from service.api import parsing
from service.api.deps import MinVersionDep, ModelsDep, NameDep, body_doc, json_body
from service.api.parsing import NPY, NPZ
from service.api.presenters import model_document, verify_threshold
from service.api.schemas import (
    DistanceBody,
    DistanceOut,
    DistancesOut,
    MetricBody,
    MetricOut,
    ModelOut,
    TransformBody,
    TransformOut,
    VerifyBody,
    VerifyOut,
)
from service.core._validation import Array
from service.engine.registry import Registry
from service.engine.runtime import ModelRuntime
from service.engine.snapshot import Snapshot

router = APIRouter(prefix="/v1/models/{name}", tags=["queries"])

#: A one-to-many gallery of at least this many values is computed in a worker thread (BLAS
#: releases the GIL): the event loop keeps answering other requests meanwhile.
THREAD_VALUES = 1 << 16
#: ... in one of these threads, not the default executor the learners use: a burst of large
#: galleries queues here instead of holding back learning (2 cores: 2 threads are plenty).
_GALLERY_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="opml-gallery")

_BINARY = {"schema": {"type": "string", "format": "binary"}}


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def _json(content: dict[str, Any]) -> Response:
    """Plain JSON (large matrices skip pydantic re-validation; NaN is impossible)."""
    return Response(_ENCODER.encode(content), media_type="application/json")


async def squared_distances(snap: Snapshot, a: Array, B: Array) -> Array:
    """``||L(a - b_i)||^2`` for a validated gallery; 422 if a value overflows float64."""
    if B.size >= THREAD_VALUES:
        loop = asyncio.get_running_loop()
        sq = await loop.run_in_executor(_GALLERY_THREADS, snap.metric.squared_distances, a, B)
    else:
        sq = snap.metric.squared_distances(a, B)
    return parsing.finite_or_422(sq, "squared_distance")


async def distance_answer(snap: Snapshot, a: Any, b: Any, *, npy: bool) -> Response:
    """The answer of ``distance``: ``a`` a vector; ``b`` a vector, a list of vectors, or an
    (n, d) array (a binary body, shape already checked)."""
    d = snap.metric.dim
    va = parsing.vector(a, d, ["body", "a"])
    if isinstance(b, np.ndarray) or (b and isinstance(b[0], list)):
        if isinstance(b, np.ndarray):
            B = parsing.gallery(b, d, ["body", "b"])
        else:
            B = parsing.matrix(b, d, ["body", "b"])
        sq = await squared_distances(snap, va, B)
        if npy:
            headers = {"X-Version": str(snap.version)}
            return Response(parsing.npy_bytes(sq), media_type=NPY, headers=headers)
        return _json(
            {
                "distances": np.sqrt(sq).tolist(),
                "squared_distances": sq.tolist(),
                "version": snap.version,
            }
        )
    vb = parsing.vector(b, d, ["body", "b"])
    value = snap.metric.squared_distance(va, vb)  # overflow: inf, quietly (the core's errstate)
    if not math.isfinite(value):
        parsing.finite_or_422(np.array([value]), "squared_distance")
    return _json({"distance": math.sqrt(value), "squared_distance": value, "version": snap.version})


def verify_answer(
    runtime: ModelRuntime, snap: Snapshot, a: Any, b: Any, threshold: float | None
) -> Response:
    """The answer of ``verify`` (and its ``opml_verify_decisions_total`` count)."""
    d = snap.metric.dim
    va = parsing.vector(a, d, ["body", "a"])
    vb = parsing.vector(b, d, ["body", "b"])
    value = snap.metric.squared_distance(va, vb)
    if not math.isfinite(value):
        parsing.finite_or_422(np.array([value]), "squared_distance")
    limit, source = verify_threshold(snap, threshold)
    same = value <= limit
    runtime.metrics.verify_decision(same, source)
    return _json(
        {
            "same": same,
            "squared_distance": value,
            "threshold": limit,
            "calibrated": snap.calibration.calibrated,
            "threshold_source": source,
            "version": snap.version,
        }
    )


async def answer_distance(
    models: Registry,
    name: str,
    min_version: int | None,
    content_type: str | None,
    body: bytes,
    accept: str | None,
) -> Response:
    """``POST .../distance`` from its raw parts (the route and the lean path both call it)."""
    a, b = parsing.distance_body(content_type, body, models.settings.max_body_bytes)
    snap = await (await models.lookup(name)).read(min_version)
    return await distance_answer(snap, a, b, npy=parsing.wants_npy(accept))


async def answer_verify(
    models: Registry, name: str, min_version: int | None, content_type: str | None, body: bytes
) -> Response:
    """``POST .../verify`` from its raw parts (the route and the lean path both call it)."""
    parsed = parsing.json_body(VerifyBody, content_type, body)
    runtime = await models.lookup(name)
    snap = await runtime.read(min_version)
    return verify_answer(runtime, snap, parsed.a, parsed.b, parsed.threshold)


_NPZ_DOC = (
    "JSON `{a, b}`, b one vector or a list of vectors; or, one to many with a binary gallery, "
    "`application/x-npz`: the bytes of `np.savez(f, a=a, b=B)`, a of shape (d,) and B of shape "
    "(n, d), float64 or float32 (no pickle; at most OPML_MAX_BODY_BYTES as float64); errors name "
    "body.a / body.b."
)
Accept = Annotated[str | None, Header()]


@router.post(
    "/distance",
    response_model=DistanceOut | DistancesOut,
    responses={
        200: {
            "description": "One pair, or one to many when b is a list of vectors (or the "
            "binary gallery); with `Accept: application/x-npy`, one to many answers the "
            "squared distances as .npy bytes (float64, shape (n,)) and header X-Version.",
            "content": {NPY: _BINARY},
        }
    },
    openapi_extra=body_doc(DistanceBody, _NPZ_DOC, {NPZ: _BINARY}),
)
async def distance(
    name: NameDep,
    request: Request,
    models: ModelsDep,
    min_version: MinVersionDep = None,
    accept: Accept = None,
) -> Response:
    """``squared_distance = ||L(a - b)||^2`` (Eq. 2), ``distance`` its square root (Eq. 1).

    One to many: ``b`` a list of vectors, or a binary gallery: ``Content-Type:
    application/x-npz`` with the bytes of ``np.savez(f, a=a, b=B)`` (``a`` (d,), ``B`` (n, d),
    float64 or float32; never unpickled; at most OPML_MAX_BODY_BYTES as float64; refusals are
    422 naming ``body``, ``body.a`` or ``body.b``). ``Accept: application/x-npy`` answers one to
    many with the squared distances as ``.npy`` bytes (float64, shape (n,)) and header
    ``X-Version``; JSON otherwise.
    """
    content_type = request.headers.get("content-type")
    body = await request.body()
    return await answer_distance(models, name, min_version, content_type, body, accept)


@router.post("/verify", response_model=VerifyOut, openapi_extra=body_doc(VerifyBody))
async def verify(
    name: NameDep, request: Request, models: ModelsDep, min_version: MinVersionDep = None
) -> Response:
    """``same = squared_distance <= threshold``; the threshold's source is reported."""
    content_type = request.headers.get("content-type")
    return await answer_verify(models, name, min_version, content_type, await request.body())


@router.post("/transform", response_model=TransformOut, openapi_extra=body_doc(TransformBody))
async def transform(
    name: NameDep,
    body: Annotated[TransformBody, json_body(TransformBody)],
    models: ModelsDep,
    min_version: MinVersionDep = None,
) -> Response:
    """``z = x L^T``: rows mapped into the learned space."""
    snap = await (await models.lookup(name)).read(min_version)
    X = parsing.matrix(body.x, snap.metric.dim, ["body", "x"])
    with np.errstate(all="ignore"):
        Z = parsing.finite_or_422(snap.metric.transform(X), "z")
    return _json({"z": Z.tolist(), "version": snap.version})


@router.get(
    "/metric",
    response_model=MetricOut,
    responses={200: {"content": {NPY: {}}, "description": "JSON, or .npy bytes of L."}},
)
async def get_metric(
    name: NameDep, models: ModelsDep, min_version: MinVersionDep = None, accept: Accept = None
) -> Response:
    """``L`` and its version; ``Accept: application/x-npy`` gives the .npy bytes of ``L``."""
    snap = await (await models.lookup(name)).read(min_version)
    if parsing.wants_npy(accept):
        body = parsing.npy_bytes(np.asarray(snap.metric.L))
        return Response(body, media_type=NPY, headers={"X-Version": str(snap.version)})
    return _json({"L": snap.metric.L.tolist(), "version": snap.version})


@router.put("/metric", response_model=ModelOut, openapi_extra=body_doc(MetricBody))
async def put_metric(
    name: NameDep, body: Annotated[MetricBody, json_body(MetricBody)], models: ModelsDep
) -> ModelOut:
    """Warm start: replace ``L`` (ordered after every sample logged before it)."""
    runtime = await models.lookup(name)
    await runtime.put_metric(parsing.metric(body.L, runtime.config.dim))
    return ModelOut.model_validate(model_document(runtime.status()))
