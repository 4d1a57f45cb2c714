"""``/v1/models``: create, list, read, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response, status

from service.api import parsing
from service.api.deps import ModelsDep, NameDep, body_doc, json_body
from service.api.presenters import model_document
from service.api.schemas import ModelCreate, ModelList, ModelOut
from service.core import LearnerConfig

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelOut,
    openapi_extra=body_doc(ModelCreate),
)
async def create_model(
    body: Annotated[ModelCreate, json_body(ModelCreate)], models: ModelsDep
) -> ModelOut:
    """Create a model; 409 if the name exists."""
    if body.dim > models.settings.max_dim:
        raise parsing.invalid(
            ["body", "dim"], f"must be <= {models.settings.max_dim} (OPML_MAX_DIM)"
        )
    config = LearnerConfig(**body.model_dump(exclude={"name"}))
    runtime = await models.create(body.name, config)
    return ModelOut.model_validate(model_document(runtime.status()))


@router.get("", response_model=ModelList)
async def list_models(models: ModelsDep) -> ModelList:
    """Every model, by name."""
    return ModelList(
        models=[ModelOut.model_validate(model_document(rt.status())) for rt in models.all()]
    )


@router.get("/{name}", response_model=ModelOut)
async def get_model(name: NameDep, models: ModelsDep) -> ModelOut:
    """One model: hyperparameters, version, counters, verification calibration."""
    return ModelOut.model_validate(model_document(models.get(name).status()))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
async def delete_model(name: NameDep, models: ModelsDep) -> Response:
    """Delete a model and every one of its Redis keys."""
    await models.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
