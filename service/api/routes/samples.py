"""``POST /v1/models/{name}/samples``: ingestion over HTTP."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse

from service.api.deps import ModelsDep, NameDep, body_doc, json_body
from service.api.ingestion import ingest
from service.api.schemas import Accepted, Applied, IngestBody, StepOut

router = APIRouter(prefix="/v1/models/{name}", tags=["ingestion"])

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description="A retry with the same key returns the first answer and logs nothing.",
    ),
]


@router.post(
    "/samples",
    status_code=202,
    response_model=Accepted,
    responses={200: {"model": Applied, "description": "?wait=true: applied, with results."}},
    openapi_extra=body_doc(IngestBody),
)
async def ingest_samples(
    name: NameDep,
    body: Annotated[IngestBody, json_body(IngestBody)],
    models: ModelsDep,
    idempotency_key: IdempotencyKey = None,
    wait: Annotated[bool, Query(description="Answer 200 once applied, with results.")] = False,
) -> Response:
    """Append samples to the model's durable log (202 once logged; 200 once applied)."""
    result = await ingest(
        (await models.lookup(name)),
        body.as_samples(),
        loc=["body", "samples"] if body.samples is not None else ["body"],
        indexed=body.samples is not None,
        transport="rest",
        idempotency_field=f"h:{idempotency_key}" if idempotency_key else "",
        wait=wait,
    )
    headers = {"Idempotent-Replayed": "true"} if result.replayed else {}
    answer = Accepted(
        accepted=result.accepted, first_seq=result.first_seq, last_seq=result.last_seq
    )
    if not wait:
        return JSONResponse(answer.model_dump(), status_code=202, headers=headers)
    assert result.version is not None
    results = None if result.results is None else [StepOut(**r) for r in result.results]
    applied = Applied(**answer.model_dump(), version=result.version, results=results)
    return JSONResponse(applied.model_dump(), status_code=200, headers=headers)
