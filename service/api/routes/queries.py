"""Queries: pure reads of one snapshot; every answer carries its ``version``."""

from __future__ import annotations

import io
import json
import math
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Header, Response

from service import telemetry
from service.api.deps import MinVersionDep, ModelsDep, NameDep
from service.models import inputs
from service.models.schemas import (
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
from service.models.service import model_body, verify_threshold

router = APIRouter(prefix="/v1/models/{name}", tags=["queries"])

NPY = "application/x-npy"


def _json(content: dict[str, Any]) -> Response:
    """Plain ``json.dumps`` (large matrices skip pydantic re-validation; NaN is impossible)."""
    return Response(
        json.dumps(content, allow_nan=False, separators=(",", ":")),
        media_type="application/json",
    )


@router.post(
    "/distance",
    response_model=DistanceOut | DistancesOut,
    responses={200: {"description": "One pair, or one to many when b is a list of vectors."}},
)
async def distance(
    name: NameDep, body: DistanceBody, models: ModelsDep, min_version: MinVersionDep = None
) -> Response:
    """``squared_distance = ||L(a - b)||^2`` (Eq. 2), ``distance`` its square root (Eq. 1)."""
    snap = await models.snapshot(name, min_version)
    d = snap.metric.dim
    a = inputs.vector(body.a, d, ["body", "a"])
    if body.b and isinstance(body.b[0], list):
        B = inputs.matrix(body.b, d, ["body", "b"])
        with np.errstate(all="ignore"):
            sq = inputs.finite_or_422(snap.metric.squared_distances(a, B), "squared_distance")
        return _json(
            {
                "distances": np.sqrt(sq).tolist(),
                "squared_distances": sq.tolist(),
                "version": snap.version,
            }
        )
    b = inputs.vector(body.b, d, ["body", "b"])  # type: ignore[arg-type]
    with np.errstate(all="ignore"):
        value = snap.metric.squared_distance(a, b)
    inputs.finite_or_422(np.array([value]), "squared_distance")
    return _json({"distance": math.sqrt(value), "squared_distance": value, "version": snap.version})


@router.post("/verify", response_model=VerifyOut)
async def verify(
    name: NameDep, body: VerifyBody, models: ModelsDep, min_version: MinVersionDep = None
) -> VerifyOut:
    """``same = squared_distance <= threshold``; the threshold's source is reported."""
    snap = await models.snapshot(name, min_version)
    d = snap.metric.dim
    a = inputs.vector(body.a, d, ["body", "a"])
    b = inputs.vector(body.b, d, ["body", "b"])
    with np.errstate(all="ignore"):
        value = snap.metric.squared_distance(a, b)
    inputs.finite_or_422(np.array([value]), "squared_distance")
    threshold, source = verify_threshold(snap, snap.metric.config.margin, body.threshold)
    same = value <= threshold
    telemetry.VERIFY_DECISIONS.labels(name, "same" if same else "different", source).inc()
    return VerifyOut(
        same=same,
        squared_distance=value,
        threshold=threshold,
        calibrated=snap.calibration.calibrated,
        threshold_source=source,
        version=snap.version,
    )


@router.post("/transform", response_model=TransformOut)
async def transform(
    name: NameDep, body: TransformBody, models: ModelsDep, min_version: MinVersionDep = None
) -> Response:
    """``z = x L^T``: rows mapped into the learned space."""
    snap = await models.snapshot(name, min_version)
    X = inputs.matrix(body.x, snap.metric.dim, ["body", "x"])
    with np.errstate(all="ignore"):
        Z = inputs.finite_or_422(snap.metric.transform(X), "z")
    return _json({"z": Z.tolist(), "version": snap.version})


@router.get(
    "/metric",
    response_model=MetricOut,
    responses={200: {"content": {NPY: {}}, "description": "JSON, or .npy bytes of L."}},
)
async def get_metric(
    name: NameDep,
    models: ModelsDep,
    min_version: MinVersionDep = None,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """``L`` and its version; ``Accept: application/x-npy`` gives the .npy bytes of ``L``."""
    snap = await models.snapshot(name, min_version)
    if accept and NPY in accept:
        buf = io.BytesIO()
        np.save(buf, np.asarray(snap.metric.L), allow_pickle=False)
        return Response(buf.getvalue(), media_type=NPY, headers={"X-Version": str(snap.version)})
    return _json({"L": snap.metric.L.tolist(), "version": snap.version})


@router.put("/metric", response_model=ModelOut)
async def put_metric(name: NameDep, body: MetricBody, models: ModelsDep) -> ModelOut:
    """Warm start: replace ``L`` (ordered after every sample logged before it)."""
    runtime = await models.put_metric(name, body.L)
    return ModelOut.model_validate(model_body(runtime))
