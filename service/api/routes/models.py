"""``/v1/models``: create, list, read, delete."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from service.api.deps import ModelsDep, NameDep
from service.models.schemas import ModelCreate, ModelList, ModelOut
from service.models.service import model_body

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ModelOut)
async def create_model(body: ModelCreate, models: ModelsDep) -> ModelOut:
    """Create a model; 409 if the name exists."""
    return ModelOut.model_validate(model_body(await models.create(body)))


@router.get("", response_model=ModelList)
async def list_models(models: ModelsDep) -> ModelList:
    """Every model, by name."""
    runtimes = models.all()
    return ModelList(models=[ModelOut.model_validate(model_body(rt)) for rt in runtimes])


@router.get("/{name}", response_model=ModelOut)
async def get_model(name: NameDep, models: ModelsDep) -> ModelOut:
    """One model: hyperparameters, version, counters, verification calibration."""
    return ModelOut.model_validate(model_body(models.get(name)))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
async def delete_model(name: NameDep, models: ModelsDep) -> Response:
    """Delete a model and every one of its Redis keys."""
    await models.delete(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
