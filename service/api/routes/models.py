"""``/v1/models``: create, list, read, delete."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import JSONResponse

from service.api import auth, parsing
from service.api.deps import ForwarderDep, ModelsDep, NameDep, body_doc, json_body
from service.api.forward import HOP_HEADER, Forwarder
from service.api.presenters import model_document
from service.api.schemas import ModelCreate, ModelList, ModelOut
from service.engine.registry import Registry
from service.engine.runtime import ModelRuntime, NotServedHere
from service.errors import Unavailable

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelOut,
    openapi_extra=body_doc(ModelCreate),
)
async def create_model(
    body: Annotated[ModelCreate, json_body(ModelCreate)],
    request: Request,
    models: ModelsDep,
    forwarder: ForwarderDep,
) -> Response:
    """Create a model; 409 if the name exists.

    ``algorithm``: ``copml`` (default), ``opml``, ``sgd``, ``sgd_psd`` or ``brm``, each with its
    own hyperparameters and defaults (docs/guides/algorithms.md). A hyperparameter the algorithm
    does not use, or a combination out of range, is a 422 naming the field; nothing is created.
    """
    grant = auth.grant_of(request.scope)
    if grant is not None and not grant.covers(body.name):
        raise auth.not_covered(body.name)
    placement = models.placement(body.name)
    if placement is not None and HOP_HEADER not in request.headers:
        # created by the process that will learn it: no hand-over right after the create
        with contextlib.suppress(Unavailable):  # that process is gone: create it here
            return await forwarder.http(
                request.scope, await request.body(), placement[1], placement[0]
            )
    if body.dim > models.settings.max_dim:
        raise parsing.invalid(
            ["body", "dim"], f"must be <= {models.settings.max_dim} (OPML_MAX_DIM)"
        )
    config = parsing.learner_config(body)
    runtime = await models.create(body.name, config)
    return JSONResponse(
        ModelOut.model_validate(model_document(runtime.status())).model_dump(), status_code=201
    )


async def _document(
    models: Registry, forwarder: Forwarder, runtime: ModelRuntime, authorization: str | None
) -> Any:
    """A model's document: ours, or its owner's (another process learns it; asked with the
    caller's key, which that process checks again)."""
    if runtime.serving:
        return model_document(runtime.status())
    holder = await models.holder(runtime.name)
    if holder is None:
        if await models.gone(runtime.name):
            return None
        raise NotServedHere(runtime.name)
    return await forwarder.model_document(runtime.name, holder[1], holder[0], authorization)


@router.get("", response_model=ModelList)
async def list_models(request: Request, models: ModelsDep, forwarder: ForwarderDep) -> ModelList:
    """Every model, by name (each as its owner process reports it); for an API key limited to
    some models, only those."""
    grant = auth.grant_of(request.scope)
    visible = [rt for rt in models.all() if grant is None or grant.covers(rt.name)]
    authorization = request.headers.get("authorization")
    documents = await asyncio.gather(
        *(_document(models, forwarder, rt, authorization) for rt in visible)
    )
    return ModelList(models=[ModelOut.model_validate(d) for d in documents if d is not None])


@router.get("/{name}", response_model=ModelOut)
async def get_model(name: NameDep, models: ModelsDep) -> ModelOut:
    """One model: hyperparameters, version, counters, verification calibration."""
    return ModelOut.model_validate(model_document((await models.lookup(name)).status()))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
async def delete_model(name: NameDep, models: ModelsDep) -> Response:
    """Delete a model and every one of its Redis keys."""
    await models.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
