"""Identification (1:N): the gallery of a model and ``identify``.

* ``POST /v1/models/{name}/gallery`` ``{"items": [{id, x, y?}, ...]}`` enrols items (at most
  ``OPML_MAX_BATCH`` per request, ``OPML_MAX_GALLERY`` per model); answered once durable in
  Redis. An id already enrolled is **replaced** (vector and label; ``replaced`` counts them).
  ``Idempotency-Key`` works as for samples (a retry answers the first answer, header
  ``Idempotent-Replayed: true``; the key reused for other items is 409).
* ``GET /v1/models/{name}/gallery?cursor=&limit=`` ``{count, ids, next_cursor}``: ids in the
  order of their string form, ``limit`` (1-1000, default 100) per page.
* ``DELETE /v1/models/{name}/gallery/{id}`` 204; 404 for an unknown id.
* ``POST /v1/models/{name}/identify`` ``{x, k?, threshold?}`` -> ``{matches: [{id, y,
  squared_distance, same}], version, threshold, threshold_source, calibrated}``, or ``{xs,
  k?, threshold?}`` -> ``{results: [{matches}], version, ...}``. Matches in ascending squared
  distance (Eq. 2), ties by id (string form, code point order): exactly the brute force under
  the ``L`` of ``version`` (see :mod:`service.core.gallery`). ``same`` is ``squared_distance
  <= threshold`` with the threshold of ``verify`` (the caller's, else the calibrated one, else
  a fallback; ``threshold_source`` says which).
  ``k`` defaults to 1; ``k < 1``, or ``k`` beyond the gallery's size, is a 422 naming ``k``
  (not clipped: a caller asking for 10 matches and getting 3 would not know why). ``min_version``
  waits until the gallery is transformed to at least that version.
  Binary form: ``Content-Type: application/x-npz`` with ``np.savez(f, x=x)`` or
  ``np.savez(f, xs=X)`` (``k`` and one of ``threshold``, ``far``, ``frr`` then in the query
  string, with the JSON body's rules), and/or ``Accept: application/x-npz`` for an ``.npz``
  answer: ``squared_distances`` (m, k) float64, ``same`` (m, k) bool, ``ids`` and ``y`` (m,
  k) unicode (the string form of each id and label; ``y`` is ``""`` when an item has none),
  ``unknown`` (m,) bool, ``threshold``, ``threshold_source``, ``calibrated`` and ``version``
  (0-d), and with a target ``operating_point`` (0-d unicode: its JSON object), m = 1 for
  ``x``; header ``X-Version``.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from service.api import parsing
from service.api.deps import MinVersionDep, ModelsDep, NameDep, body_doc, json_body
from service.api.npy import NPZ, npz_bytes, wants
from service.api.presenters import verify_threshold
from service.api.routes.queries import operating_entry
from service.api.routes.samples import IdempotencyKey
from service.api.schemas import (
    MAX_ID_CHARS,
    EnrolBody,
    Enrolled,
    GalleryPage,
    Identified,
    IdentifiedMany,
    IdentifyBody,
)
from service.engine import operating
from service.engine.gallery import Match
from service.engine.registry import Registry
from service.errors import LimitExceeded

router = APIRouter(prefix="/v1/models/{name}", tags=["identification"])

#: Most matches one identify answers (rows of ``xs`` times ``k``).
MAX_MATCHES = 1_000_000

_BINARY = {"schema": {"type": "string", "format": "binary"}}


@router.post(
    "/gallery",
    response_model=Enrolled,
    openapi_extra=body_doc(EnrolBody),
)
async def enrol(
    name: NameDep,
    body: Annotated[EnrolBody, json_body(EnrolBody)],
    models: ModelsDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Enrol items (an id already enrolled is replaced); answered once durable."""
    runtime = models.get(name)
    max_batch = models.settings.max_batch
    if len(body.items) > max_batch:
        raise LimitExceeded(
            f"{len(body.items)} items in one request; at most {max_batch} (OPML_MAX_BATCH)"
        )
    X, ids, keys, labels = parsing.gallery_items(body.items, runtime.config.dim)
    field = f"g:{idempotency_key}" if idempotency_key else ""
    done = await runtime.gallery.enrol(X, ids, keys, labels, field)
    answer = Enrolled(enrolled=done.enrolled, replaced=done.replaced, size=done.size)
    headers = {"Idempotent-Replayed": "true"} if done.replayed else {}
    return JSONResponse(answer.model_dump(), headers=headers)


@router.get("/gallery", response_model=GalleryPage)
async def list_gallery(
    name: NameDep,
    models: ModelsDep,
    cursor: Annotated[
        str | None,
        Query(max_length=MAX_ID_CHARS, description="`next_cursor` of the previous page."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Ids per page.")] = 100,
) -> GalleryPage:
    """How many items the gallery holds, and their ids, a page at a time."""
    count, ids, next_cursor = models.get(name).gallery.listing(cursor, limit)
    return GalleryPage(count=count, ids=ids, next_cursor=next_cursor)


@router.delete("/gallery/{item_id:path}", status_code=204, response_class=Response)
async def delete_item(
    name: NameDep,
    item_id: Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS, description="Item id.")],
    models: ModelsDep,
) -> Response:
    """Remove one item (404 if the gallery has no such id)."""
    await models.get(name).gallery.delete(item_id)
    return Response(status_code=204)


def _matches(found: list[Match], limit: float) -> dict[str, Any]:
    """One vector's matches and whether none passes (``unknown``: nobody the gallery knows)."""
    matches = [_match(m, limit) for m in found]
    return {"matches": matches, "unknown": not any(m["same"] for m in matches)}


def _match(m: Match, limit: float) -> dict[str, Any]:
    return {"id": m.id, "y": m.y, "squared_distance": m.squared_distance,
            "same": m.squared_distance <= limit}  # fmt: skip


async def answer_identify(
    models: Registry,
    name: str,
    min_version: int | None,
    content_type: str | None,
    body: bytes,
    accept: str | None,
    k: str | None = None,
    threshold: str | None = None,
    far: str | None = None,
    frr: str | None = None,
) -> Response:
    """``POST .../identify`` from its raw parts (``k``, ``threshold``, ``far``, ``frr``: the
    query string's, read for an ``.npz`` body)."""
    settings = models.settings
    request = parsing.identify_body(
        content_type, body, settings.max_body_bytes, k, threshold, far, frr
    )
    runtime = models.get(name)
    X = parsing.query_rows(request, runtime.config.dim)
    if len(X) > settings.max_batch:
        raise LimitExceeded(
            f"{len(X)} vectors in one request; at most {settings.max_batch} (OPML_MAX_BATCH)"
        )
    if len(X) * request.k > MAX_MATCHES:
        raise LimitExceeded(
            f"{len(X)} vectors x k = {request.k} matches; at most {MAX_MATCHES} per request"
        )
    view = await runtime.gallery.read(min_version)
    if request.k > view.size:
        raise parsing.invalid(
            request.k_loc,
            "the gallery is empty: enrol items first"
            if view.size == 0
            else f"asks for {request.k} matches but the gallery holds {view.size} items",
        )
    found = await runtime.gallery.search(view, X, request.k)
    values = np.array([[m.squared_distance for m in ms] for ms in found])
    parsing.finite_or_422(values, "squared_distance")
    target = None
    if request.threshold is None:
        target = operating.target_of(request.far, request.frr, runtime.config.operating_point)
    point, point_json = None, None
    if target is None:
        limit, source = verify_threshold(view.snapshot, request.threshold)
    else:
        if runtime.config.algorithm == "brm":
            raise parsing.invalid(
                ["body", "algorithm"],
                "algorithm: a brm model's operating points are certified on its restricted "
                "distance D_R^2, and identify decides on squared distances; give a threshold",
            )
        entry = await operating_entry(runtime, None, view.snapshot)
        point, point_json = operating.wire_json(entry, target)
        limit, source = point.threshold, point.kind
    decided: dict[str, Any] = {
        "version": view.version,
        "threshold": limit,
        "threshold_source": source,
        "calibrated": view.snapshot.calibration.calibrated,
    }
    if wants(accept, NPZ):
        npz = _npz(found, values, decided, point_json)
        return Response(npz, media_type=NPZ, headers={"X-Version": str(view.version)})
    if point is not None:
        decided["operating_point"] = operating.wire(point)
    if request.many:
        results = [_matches(ms, limit) for ms in found]
        return JSONResponse({"results": results, **decided})
    return JSONResponse({**_matches(found[0], limit), **decided})


def _npz(
    found: list[list[Match]], values: Any, decided: dict[str, Any], point_json: str | None
) -> bytes:
    """The ``.npz`` answer: (m, k) arrays, ``unknown`` (m,) and the 0-d decision members; the
    operating point, a nested object, as its JSON text (0-d unicode). No object arrays, so
    ``np.load(..., allow_pickle=False)`` reads it."""
    same = values <= decided["threshold"]
    extra = {} if point_json is None else {"operating_point": np.array(point_json)}
    return npz_bytes(
        squared_distances=values,
        same=same,
        unknown=~same.any(axis=1),
        ids=np.array([[str(m.id) for m in ms] for ms in found], dtype=str),
        y=np.array([["" if m.y is None else str(m.y) for m in ms] for ms in found], dtype=str),
        threshold=np.float64(decided["threshold"]),
        threshold_source=np.array(decided["threshold_source"]),
        calibrated=np.bool_(decided["calibrated"]),
        version=np.int64(decided["version"]),
        **extra,
    )


_NPZ_DOC = (
    "JSON `{x | xs, k?, threshold?}`; or `application/x-npz`: the bytes of `np.savez(f, x=x)` "
    "(x of shape (d,)) or `np.savez(f, xs=X)` (X of shape (n, d)), float64 or float32, with "
    "`k` and one of `threshold`, `far`, `frr` in the query string."
)


@router.post(
    "/identify",
    response_model=Identified | IdentifiedMany,
    responses={
        200: {
            "description": "`{matches, ...}` for x, `{results: [{matches}], ...}` for xs; with "
            "`Accept: application/x-npz`, arrays squared_distances, same, ids, y (m, k), "
            "unknown (m,), threshold, threshold_source, calibrated, version (0-d), with a "
            "target operating_point (0-d, its JSON text), and header X-Version.",
            "content": {NPZ: _BINARY},
        }
    },
    openapi_extra=body_doc(IdentifyBody, _NPZ_DOC, {NPZ: _BINARY}),
)
async def identify(
    name: NameDep,
    request: Request,
    models: ModelsDep,
    min_version: MinVersionDep = None,
    accept: Annotated[str | None, Header()] = None,
    k: Annotated[
        str | None, Query(description="Matches per vector, with an .npz body (JSON: in the body).")
    ] = None,
    threshold: Annotated[
        str | None, Query(description="Threshold for `same`, with an .npz body.")
    ] = None,
    far: Annotated[
        str | None, Query(description="Target false-accept rate in (0, 0.5), with an .npz body.")
    ] = None,
    frr: Annotated[
        str | None, Query(description="Target false-reject rate in (0, 0.5), with an .npz body.")
    ] = None,
) -> Response:
    """The ``k`` gallery items nearest to ``x`` (or to each row of ``xs``) under the live
    metric (Eq. 2), exactly, with ``same`` decided as ``verify`` does."""
    return await answer_identify(
        models,
        name,
        min_version,
        request.headers.get("content-type"),
        await request.body(),
        accept,
        k,
        threshold,
        far,
        frr,
    )
