"""The web console (``/ui/``) and the read endpoints its pages need.

``/ui/`` serves the console's static files (HTML, plain ES modules, CSS and the vendored
charting library, ``service/api/ui/``) from the package itself: nothing is fetched from
another origin, and the pages' Content-Security-Policy forbids it. The files hold no data and
are open like ``/docs``; everything the pages show comes from the ``/v1`` API below and the
others, with the viewer's key, so the console sees exactly what that key may see.

Read endpoints (scope ``query``, like every read; answered by the model's owner process):

* ``GET /v1/models/{name}/recent``: the latest applied samples (at most
  :data:`~service.engine.writer.RECENT_SAMPLES`, kept in memory by the learning process, so
  empty after a restart until samples arrive), with their first two principal components as
  the metric sees them (``z = x L^T``) and as given (``x``, after the model's ``normalize``).
* ``GET /v1/models/{name}/calibration``: the ROC of the calibration window (the prequential
  pairs the served threshold is calibrated on) and the operating point of the served threshold.
* ``GET /v1/key``: the scopes of the caller's key (all of them when no keys are configured).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, Field

from service.api.auth import presented_key
from service.api.deps import MinVersionDep, ModelsDep, NameDep
from service.api.presenters import json_response, verify_threshold
from service.core.calibration import in_order
from service.core.curves import principal_components, rates, roc
from service.core.normalize import normalize_rows
from service.engine.writer import RECENT_SAMPLES
from service.errors import NotFound
from service.security import KeyRing, Scope

router = APIRouter(tags=["console"])

#: The console's static files (package data).
UI_DIR = Path(__file__).resolve().parents[1] / "ui"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}
#: Nothing from another origin: scripts, styles, images and sockets from this service only
#: (uPlot sets element styles from script, hence ``'unsafe-inline'`` for styles alone).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@router.get("/ui", include_in_schema=False)
async def ui_root() -> Response:
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/{path:path}", include_in_schema=False)
async def ui_file(path: str) -> Response:
    """A file of the console (``index.html`` for ``/ui/``); 404 outside :data:`UI_DIR`."""
    target = (UI_DIR / (path or "index.html")).resolve()
    if not target.is_relative_to(UI_DIR) or not target.is_file() or target.suffix not in _TYPES:
        raise NotFound(f"no console file {path!r}")
    return FileResponse(target, media_type=_TYPES[target.suffix], headers=_HEADERS)


# -- read endpoints ---------------------------------------------------------------------------


class Projection(BaseModel):
    """Rows' first two principal components, and the variance share of each axis."""

    points: list[list[float]]
    explained: list[float]


class RecentOut(BaseModel):
    """The latest applied samples and their two-dimensional pictures."""

    version: int
    count: int
    classes: list[str] = Field(description="Class keys in order of first appearance.")
    samples: list[dict[str, Any]] = Field(description="`{x, y}` each, oldest first, as logged.")
    projection: dict[str, Projection] = Field(
        description="`x`: principal components of the samples as given (after `normalize`); "
        "`z`: of the samples mapped by the metric, `x L^T`. Row i is sample i."
    )


class RocPoint(BaseModel):
    threshold: float
    far: float
    frr: float


class CalibrationOut(BaseModel):
    """The calibration window's ROC and the served threshold's operating point."""

    version: int
    pairs: int
    window: int
    calibrated: bool
    eer: float | None
    accuracy: float | None
    threshold: float
    threshold_source: str
    at_threshold: RocPoint | None
    points: list[RocPoint]


class KeyOut(BaseModel):
    """What the caller's key may do."""

    keys_configured: bool
    scopes: list[str]


@router.get("/v1/models/{name}/recent", response_model=RecentOut, tags=["queries"])
async def recent_samples(
    name: NameDep,
    models: ModelsDep,
    limit: Annotated[
        int,
        Query(ge=1, le=RECENT_SAMPLES, description="At most this many of the latest samples."),
    ] = 300,
    min_version: MinVersionDep = None,
) -> Response:
    """The latest applied samples (``{x, y}``, oldest first) of the version answered, with their
    first two principal components before and after the metric (``x`` and ``z = x L^T``), for
    a picture of how the metric separates the classes. Kept in memory by the process that
    learns the model: after a restart the list is empty until samples arrive."""
    runtime = await models.lookup(name)
    snap, X, keys = await runtime.recent_samples(min_version, limit)
    with np.errstate(all="ignore"):
        seen = normalize_rows(X, snap.config.normalize)
        Z = snap.metric.transform(X) if len(X) else np.empty((0, X.shape[1]))
    px, sx = principal_components(seen)
    pz, sz = principal_components(Z)
    if not (np.isfinite(px).all() and np.isfinite(pz).all()):  # an overflowing stream
        px, pz = np.nan_to_num(px), np.nan_to_num(pz)
    return json_response(
        {
            "version": snap.version,
            "count": len(keys),
            "classes": list(dict.fromkeys(keys)),
            "samples": [{"x": x, "y": y} for x, y in zip(X.tolist(), keys, strict=True)],
            "projection": {
                "x": {"points": px.tolist(), "explained": sx.tolist()},
                "z": {"points": pz.tolist(), "explained": sz.tolist()},
            },
        }
    )


@router.get("/v1/models/{name}/calibration", response_model=CalibrationOut, tags=["queries"])
async def calibration_curve(
    name: NameDep,
    models: ModelsDep,
    points: Annotated[int, Query(ge=2, le=1000, description="Points on the curve.")] = 50,
    min_version: MinVersionDep = None,
) -> Response:
    """The ROC of the calibration window: false accept and false reject rates of the served
    metric over its recent prequential pairs (each measured before its sample was learned), at
    ``points`` thresholds from the smallest to the largest distance, and at the threshold a
    ``verify`` without one uses (``at_threshold``, ``threshold_source`` as verify says it).
    ``points`` is empty (and ``at_threshold`` null) before the first pair."""
    snap = await (await models.lookup(name)).read(min_version)
    cal = snap.calibration
    threshold, source = verify_threshold(snap, None)
    window = in_order(snap.ring, snap.pairs_seen, snap.window_size)
    curve: list[dict[str, float]] = []
    at: dict[str, float] | None = None
    if len(window):
        t, far, frr = roc(window, points)
        curve = [
            {"threshold": float(a), "far": float(b), "frr": float(c)}
            for a, b, c in zip(t, far, frr, strict=True)
        ]
        far_t, frr_t = rates(np.sort(window[:, 0]), np.sort(window[:, 1]), np.array([threshold]))
        at = {"threshold": threshold, "far": float(far_t[0]), "frr": float(frr_t[0])}
    return json_response(
        {
            "version": snap.version,
            "pairs": cal.pairs,
            "window": snap.window_size,
            "calibrated": cal.calibrated,
            "eer": cal.eer,
            "accuracy": cal.accuracy,
            "threshold": threshold,
            "threshold_source": source,
            "at_threshold": at,
            "points": curve,
        }
    )


@router.get("/v1/key", response_model=KeyOut, tags=["console"])
async def key_scopes(request: Request) -> KeyOut:
    """The scopes of the key this request carries (``admin`` includes the others), so a client
    can show what it may do; without configured keys every scope is open."""
    keys: KeyRing = request.app.state.keys
    if not keys.enabled:
        return KeyOut(keys_configured=False, scopes=[s.value for s in Scope])
    key = presented_key(request.scope)
    scopes = keys.scopes_of(key) if key is not None else None
    return KeyOut(keys_configured=True, scopes=sorted(s.value for s in scopes or ()))
