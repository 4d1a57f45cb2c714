"""Queries: pure reads of one snapshot; every answer carries its ``version``.

``distance`` and ``verify`` are the hot queries. Their routes are thin: they hand the raw body,
its ``Content-Type`` and ``min_version`` to :func:`answer_distance` / :func:`answer_verify`,
which parse them with :mod:`service.api.parsing` and answer. The lean path
(:mod:`service.api.lean`) calls the same two functions without FastAPI's per-request
machinery, so it is a pure optimisation: same parsers, same answers, same problems.

One-to-many ``distance`` (``a`` against the candidate rows ``b``) also takes a binary body: an
``.npz`` (``Content-Type: application/x-npz``, ``np.savez(f, a=a, b=B)``: ``a`` of shape (d,),
``b`` of shape (n, d), float64 or float32; read by :func:`service.api.npy.npz_arrays`), and
answers
``Accept: application/x-npy`` (either body) with the squared distances as ``.npy`` bytes and
the version in header ``X-Version``.

Restricted distances (``service.core.brm``, docs/algorithms/brm.md): a ``brm`` model's ``distance``
answers always add ``restricted_distance`` / ``restricted_squared_distance`` (one to many:
``restricted_distances`` / ``restricted_squared_distances``), ``D_R`` in [0, 1) under its own
``L``, and its ``verify`` decides on ``restricted_squared_distance <= threshold`` (its
calibrated threshold is in ``D_R^2`` units). Any other model adds them when asked with the query
parameter ``?restricted=true`` (a query parameter, so a binary body can ask too), measured
with the canonical factor of ``M = L^T L`` (an O(d^3) eigendecomposition once per published
snapshot, then O(d^2) per pair like ``squared_distance``). ``.npy`` answers stay the plain
squared distances.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Header, Query, Request, Response

from service.api import parsing
from service.api.deps import MinVersionDep, ModelsDep, NameDep, body_doc, json_body
from service.api.npy import NPY, NPZ, npy_bytes, wants_npy
from service.api.presenters import json_response, model_document, verify_threshold
from service.api.schemas import (
    CertificateOut,
    DistanceBody,
    DistanceOut,
    DistancesOut,
    MetricBody,
    MetricOut,
    ModelOut,
    RocOut,
    TransformBody,
    TransformOut,
    VerifyBody,
    VerifyOut,
)
from service.core._validation import Array
from service.core.brm import restricted_root
from service.core.operating_points import DEFAULT_DELTA, MAX_ROC_POINTS, OperatingPoint, roc
from service.engine import operating
from service.engine.registry import Registry
from service.engine.runtime import ModelRuntime
from service.engine.snapshot import Snapshot

router = APIRouter(prefix="/v1/models/{name}", tags=["queries"])

#: A one-to-many ``b`` of at least this many values is computed in a worker thread (BLAS
#: releases the GIL): the event loop keeps answering other requests meanwhile.
THREAD_VALUES = 1 << 16
#: ... in one of these threads, not the default executor the learners use: a burst of large
#: candidate matrices queues here instead of holding back learning (2 cores: 2 threads are plenty).
_ROWS_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="opml-one-to-many")

_BINARY = {"schema": {"type": "string", "format": "binary"}}


async def _rows_call(fn: Callable[[Array, Array], Array], a: Array, B: Array) -> Array:
    """``fn(a, B)``, in a thread of its own when ``B`` is large."""
    if B.size >= THREAD_VALUES:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_ROWS_THREADS, fn, a, B)
    return fn(a, B)


async def squared_distances(snap: Snapshot, a: Array, B: Array) -> Array:
    """``||L(a - b_i)||^2`` for validated candidate rows ``B``; 422 if a value overflows float64."""
    sq = await _rows_call(snap.metric.squared_distances, a, B)
    return parsing.finite_or_422(sq, "squared_distance")


async def distance_answer(
    snap: Snapshot, a: Any, b: Any, *, npy: bool, restricted: bool = False
) -> Response:
    """The answer of ``distance``: ``a`` a vector; ``b`` a vector, a list of vectors, or an
    (n, d) array (a binary body, shape already checked). ``restricted`` (always for ``brm``)
    adds the restricted distances."""
    d = snap.metric.dim
    restricted = restricted or snap.metric.config.algorithm == "brm"
    va = parsing.vector(a, d, ["body", "a"])
    if isinstance(b, np.ndarray) or (b and isinstance(b[0], list)):
        if isinstance(b, np.ndarray):
            B = parsing.binary_matrix(b, d, ["body", "b"])
        else:
            B = parsing.matrix(b, d, ["body", "b"])
        sq = await squared_distances(snap, va, B)
        if npy:
            headers = {"X-Version": str(snap.version)}
            return Response(npy_bytes(sq), media_type=NPY, headers=headers)
        many: dict[str, Any] = {"distances": np.sqrt(sq).tolist(), "squared_distances": sq.tolist()}
        if restricted:
            rsq = await _rows_call(snap.metric.restricted_squared_distances, va, B)
            many["restricted_distances"] = restricted_root(rsq).tolist()
            many["restricted_squared_distances"] = rsq.tolist()
        return json_response({**many, "version": snap.version})
    vb = parsing.vector(b, d, ["body", "b"])
    value = snap.metric.squared_distance(va, vb)  # overflow: inf, quietly (the core's errstate)
    if not math.isfinite(value):
        parsing.finite_or_422(np.array([value]), "squared_distance")
    one: dict[str, Any] = {"distance": math.sqrt(value), "squared_distance": value}
    if restricted:
        rvalue = snap.metric.restricted_squared_distance(va, vb)  # in [0, 1): always finite
        one["restricted_distance"] = float(restricted_root(rvalue))
        one["restricted_squared_distance"] = rvalue
    return json_response({**one, "version": snap.version})


def verify_answer(
    runtime: ModelRuntime,
    snap: Snapshot,
    a: Any,
    b: Any,
    threshold: float | None,
    point: OperatingPoint | None = None,
    point_json: str = "",
) -> Response:
    """The answer of ``verify`` (and its ``opml_verify_decisions_total`` count); with an
    operating ``point`` (certified for ``snap``'s metric; ``point_json``: its wire form,
    encoded once in the cache) its threshold decides."""
    d = snap.metric.dim
    va = parsing.vector(a, d, ["body", "a"])
    vb = parsing.vector(b, d, ["body", "b"])
    value = snap.metric.squared_distance(va, vb)
    if not math.isfinite(value):
        parsing.finite_or_422(np.array([value]), "squared_distance")
    extra: dict[str, Any] = {}
    if point is None:
        limit, source = verify_threshold(snap, threshold)
    else:
        limit, source = point.threshold, point.kind
    if snap.metric.config.algorithm == "brm":  # it decides on D_R^2 (its threshold's units)
        decided = extra["restricted_squared_distance"] = snap.metric.restricted_squared_distance(
            va, vb
        )
    else:
        decided = value
    same = decided <= limit
    runtime.telemetry.verify_decision(same, source)
    return json_response(
        {
            "same": same,
            "squared_distance": value,
            **extra,
            "threshold": limit,
            "calibrated": snap.calibration.calibrated,
            "threshold_source": source,
            "version": snap.version,
        },
        encoded={"operating_point": point_json} if point is not None else None,
    )


async def operating_entry(
    runtime: ModelRuntime, min_version: int | None, at: Snapshot | None = None
) -> Any:
    """The cached held-out evaluation a decision by target uses: the newest (``at`` None;
    after waiting, bounded, for ``min_version``), or that of the snapshot ``at``."""
    newest = await runtime.read(min_version)
    cache = operating.cache_of(runtime.owned_writer())
    if at is None:
        entry = cache.ready(newest, min_version)  # the hot path: cached, no coroutine
        return entry if entry is not None else await cache.latest(newest, min_version)
    return await cache.of(at, newest)


async def answer_distance(
    models: Registry,
    name: str,
    min_version: int | None,
    content_type: str | None,
    body: bytes,
    accept: str | None,
    restricted: bool = False,
) -> Response:
    """``POST .../distance`` from its raw parts (the route and the lean path both call it)."""
    a, b = parsing.distance_body(content_type, body, models.settings.max_body_bytes)
    snap = await (await models.lookup(name)).read(min_version)
    return await distance_answer(snap, a, b, npy=wants_npy(accept), restricted=restricted)


async def answer_verify(
    models: Registry, name: str, min_version: int | None, content_type: str | None, body: bytes
) -> Response:
    """``POST .../verify`` from its raw parts (the route and the lean path both call it)."""
    parsed = parsing.json_body(VerifyBody, content_type, body)
    runtime = await models.lookup(name)
    target = None
    if parsed.threshold is None:
        target = operating.target_of(parsed.far, parsed.frr, runtime.config.operating_point)
    if target is None:
        snap = await runtime.read(min_version)
        return verify_answer(runtime, snap, parsed.a, parsed.b, parsed.threshold)
    entry = await operating_entry(runtime, min_version)
    point, point_json = operating.wire_json(entry, target)
    return verify_answer(runtime, entry.snapshot, parsed.a, parsed.b, None, point, point_json)


_NPZ_DOC = (
    "JSON `{a, b}`, b one vector or a list of vectors; or, one to many with a binary body, "
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
            "binary body); with `Accept: application/x-npy`, one to many answers the "
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
    restricted: Annotated[
        str | None,
        Query(
            description="true: add the restricted distance D_R in [0, 1) (the BRM paper's Eq. 7; "
            "always added for a brm model).",
            json_schema_extra={"enum": ["true", "false"]},
        ),
    ] = None,
) -> Response:
    """``squared_distance = ||L(a - b)||^2`` (Eq. 2), ``distance`` its square root (Eq. 1).

    ``?restricted=true`` adds ``restricted_distance`` and ``restricted_squared_distance``
    (one to many: ``restricted_distances``, ``restricted_squared_distances``): ``D_R`` in
    [0, 1) of the BRM paper's Eq. 7 (Sigmoid restriction, p = 2) under the canonical factor of
    ``M = L^T L``; a ``brm`` model always adds them, under its own ``L``.

    One to many: ``b`` a list of vectors, or a binary body: ``Content-Type:
    application/x-npz`` with the bytes of ``np.savez(f, a=a, b=B)`` (``a`` (d,), ``B`` (n, d),
    float64 or float32; never unpickled; at most OPML_MAX_BODY_BYTES as float64; refusals are
    422 naming ``body``, ``body.a`` or ``body.b``). ``Accept: application/x-npy`` answers one to
    many with the squared distances as ``.npy`` bytes (float64, shape (n,)) and header
    ``X-Version``; JSON otherwise.
    """
    content_type = request.headers.get("content-type")
    body = await request.body()
    wanted = parsing.restricted(restricted)
    return await answer_distance(models, name, min_version, content_type, body, accept, wanted)


@router.post("/verify", response_model=VerifyOut, openapi_extra=body_doc(VerifyBody))
async def verify(
    name: NameDep, request: Request, models: ModelsDep, min_version: MinVersionDep = None
) -> Response:
    """``same = squared_distance <= threshold``; the threshold's source is reported. A ``brm``
    model decides on ``restricted_squared_distance <= threshold`` (``D_R^2``, the units its
    threshold is calibrated in) and reports both distances."""
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
    return json_response({"z": Z.tolist(), "version": snap.version})


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
    if wants_npy(accept):
        body = npy_bytes(np.asarray(snap.metric.L))
        return Response(body, media_type=NPY, headers={"X-Version": str(snap.version)})
    return json_response({"L": snap.metric.L.tolist(), "version": snap.version})


@router.put("/metric", response_model=ModelOut, openapi_extra=body_doc(MetricBody))
async def put_metric(
    name: NameDep, body: Annotated[MetricBody, json_body(MetricBody)], models: ModelsDep
) -> ModelOut:
    """Warm start: replace ``L`` (ordered after every sample logged before it)."""
    runtime = await models.lookup(name)
    await runtime.put_metric(parsing.metric(body.L, runtime.config.dim))
    return ModelOut.model_validate(model_document(runtime.status()))


def _finite(value: Any) -> Any:
    """JSON has no Infinity: a non-finite number in a certificate's ``details`` (a threshold
    off the PAC-Bayes grid) is shown as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


@router.get(
    "/certificate",
    response_model=CertificateOut,
    responses={409: {"description": "Not certifiable yet: too few held-out samples (members "
                     "`needed`, `have`), or the model holds none out."}},
)  # fmt: skip
async def get_certificate(
    name: NameDep,
    models: ModelsDep,
    delta: Annotated[
        float,
        Query(gt=0, lt=1, description="The three bounds hold together with prob. >= 1 - delta."),
    ] = 0.05,
    method: Annotated[
        str,
        Query(
            description="binomial (exact test-set bound on the held-out reservoir), kl (its "
            "Chernoff relaxation), or pac-bayes (the randomised metric; no held-out samples).",
            json_schema_extra={"enum": ["binomial", "kl", "pac-bayes"]},
        ),
    ] = "binomial",
    threshold: Annotated[
        float | None,
        Query(
            ge=0,
            allow_inf_nan=False,
            description="Certify at this threshold (default: "
            "the served one, as verify uses it); fix it before looking at certificates.",
        ),
    ] = None,
    min_version: MinVersionDep = None,
) -> Response:
    """High-confidence upper bounds on the triplet error, false accept rate and false reject
    rate of the metric of one snapshot (docs/guides/certificates.md)."""
    checked_delta, checked_method = parsing.certificate_args(delta, method)
    runtime = await models.lookup(name)
    cert = await runtime.certificate(min_version, checked_delta, checked_method, threshold)
    return json_response(_finite(cert.to_dict()))


@router.get(
    "/roc",
    response_model=RocOut,
    responses={
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with Accept: text/csv."},
        409: {"description": "Not certifiable: too few held-out samples (`needed`, `have`)."},
    },
)
async def get_roc(
    name: NameDep,
    models: ModelsDep,
    points: Annotated[
        int, Query(ge=2, le=MAX_ROC_POINTS, description="Thresholds on the curve.")
    ] = 20,
    delta: Annotated[
        float,
        Query(gt=0, lt=1, description="Every bound of the curve holds together w.p. 1 - delta."),
    ] = DEFAULT_DELTA,
    min_version: MinVersionDep = None,
    accept: Accept = None,
) -> Response:
    """The served metric's ROC on the held-out reservoir: thresholds (quantiles of the
    calibration window, fixed before the held-out samples are looked at) with the held-out
    false-accept / false-reject estimates, their upper bounds (all holding together with
    probability >= 1 - delta), and the calibration window's own estimates beside them. The
    evaluation is cached per version (as verify's operating points). ``Accept: text/csv``:
    one header line, one line per threshold."""
    runtime = await models.lookup(name)
    entry = await operating_entry(runtime, min_version)
    if entry.pairs is None:
        operating.point_of(entry, operating.Target("far", 0.25))  # raises the refusal
    try:
        curve = roc(entry.pairs, points=points, delta=delta)
    except ValueError as exc:
        field, _, msg = str(exc).partition(": ")
        raise parsing.invalid(["query", field], msg) from None
    if accept is not None and "text/csv" in accept:
        headers = {"X-Version": str(curve.version)}
        return Response(curve.to_csv(), media_type="text/csv", headers=headers)
    return json_response(curve.to_dict())
