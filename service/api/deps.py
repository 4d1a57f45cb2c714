"""Dependencies as named ``Annotated`` aliases, so route signatures stay one line each."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request, WebSocket

from service.config import Settings
from service.models.schemas import NAME_PATTERN
from service.models.service import ModelService

# ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
# thread hand-off per request (it cost ~100 us of CPU per query) for an attribute read.


async def _models(request: Request) -> ModelService:
    models: ModelService = request.app.state.models
    return models


async def _ws_models(websocket: WebSocket) -> ModelService:
    models: ModelService = websocket.app.state.models
    return models


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


ModelsDep = Annotated[ModelService, Depends(_models)]
WsModelsDep = Annotated[ModelService, Depends(_ws_models)]
SettingsDep = Annotated[Settings, Depends(_settings)]
NameDep = Annotated[str, Path(pattern=NAME_PATTERN, description="Model name.")]
MinVersionDep = Annotated[
    int | None,
    Query(ge=0, description="Wait (bounded) until this seq is applied; else 503 + Retry-After."),
]
