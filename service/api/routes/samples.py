"""``POST /v1/models/{name}/samples``: ingestion over HTTP.

The route is thin: it hands the raw body, its ``Content-Type``, ``?wait`` and the
``Idempotency-Key`` header to :func:`answer_ingest`, which parses them with
:mod:`service.api.parsing` and answers. The lean path (:mod:`service.api.lean`) calls the same
function without FastAPI's per-request machinery, so both answer alike (a naive client sends one
sample per request: that machinery was most of the service's cost per request).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from service.api import parsing
from service.api.deps import ModelsDep, NameDep, body_doc
from service.api.ingestion import ingest
from service.api.presenters import json_response
from service.api.schemas import Accepted, Applied, IngestBody, StepOut
from service.engine.registry import Registry

router = APIRouter(prefix="/v1/models/{name}", tags=["ingestion"])

# Both are read raw and checked by parsing.ingest_options (one parser for the route and the
# lean path); the schema still says what is accepted.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="A retry with the same key returns the first answer and logs nothing.",
        json_schema_extra={"minLength": 1, "maxLength": parsing.MAX_IDEMPOTENCY_KEY},
    ),
]
Wait = Annotated[
    str | None,
    Query(
        description="Answer 200 once applied, with results: a boolean (true/false, 1/0, "
        "yes/no, on/off, t/f, y/n).",
        json_schema_extra={"pattern": parsing.WAIT_PATTERN},
    ),
]


async def answer_ingest(
    models: Registry,
    name: str,
    content_type: str | None,
    body: bytes,
    wait: str | None,
    idempotency_key: str | None,
) -> Response:
    """``POST .../samples`` from its raw parts (the route and the lean path both call it)."""
    parsed = parsing.json_body(IngestBody, content_type, body)
    waiting, key = parsing.ingest_options(wait, idempotency_key)
    items, loc, indexed = parsed.located(["body"])
    result = await ingest(
        await models.lookup(name),
        items,
        loc=loc,
        indexed=indexed,
        transport="rest",
        idempotency_field=f"h:{key}" if key else "",
        wait=waiting,
    )
    headers = {"Idempotent-Replayed": "true"} if result.replayed else None
    answer = {
        "accepted": result.accepted,
        "first_seq": result.first_seq,
        "last_seq": result.last_seq,
    }
    if not waiting:
        return json_response(answer, 202, headers)
    assert result.version is not None
    results = None if result.results is None else [StepOut(**r) for r in result.results]
    applied = Applied(**answer, version=result.version, results=results)
    return json_response(applied.model_dump(), 200, headers)


@router.post(
    "/samples",
    status_code=202,
    response_model=Accepted,
    responses={200: {"model": Applied, "description": "?wait=true: applied, with results."}},
    openapi_extra=body_doc(IngestBody),
)
async def ingest_samples(
    name: NameDep,
    request: Request,
    models: ModelsDep,
    idempotency_key: IdempotencyKey = None,
    wait: Wait = None,
) -> Response:
    """Append samples to the model's durable log (202 once logged; 200 once applied)."""
    content_type = request.headers.get("content-type")
    body = await request.body()
    return await answer_ingest(models, name, content_type, body, wait, idempotency_key)
