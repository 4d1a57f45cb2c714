"""Dependencies as named ``Annotated`` aliases, so route signatures stay one line each.

Request bodies and ``min_version`` are read by the parsers of :mod:`service.api.parsing` (the
same ones the lean path uses), not by FastAPI's own body handling: :func:`json_body` makes the
dependency, and :func:`body_doc` documents the body in the OpenAPI schema (FastAPI cannot see a
body it does not parse; :func:`document_bodies` adds the models' schemas to its components).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Path, Query, Request, WebSocket
from pydantic import BaseModel

from service.api import parsing
from service.api.forward import Forwarder
from service.api.schemas import NAME_PATTERN
from service.config import Settings
from service.engine.registry import Registry

B = TypeVar("B", bound=BaseModel)

# ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
# thread hand-off per request (costly next to a query) for an attribute read.


async def _models(request: Request) -> Registry:
    models: Registry = request.app.state.models
    return models


async def _ws_models(websocket: WebSocket) -> Registry:
    models: Registry = websocket.app.state.models
    return models


async def _forwarder(request: Request) -> Forwarder:
    forwarder: Forwarder = request.app.state.forwarder
    return forwarder


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _min_version(
    min_version: Annotated[
        str | None,
        Query(
            description="Wait (bounded) until this seq is applied; else 503 + Retry-After.",
            json_schema_extra={"pattern": "^[0-9]{1,20}$"},
        ),
    ] = None,
) -> int | None:
    return parsing.min_version(min_version)


ModelsDep = Annotated[Registry, Depends(_models)]
WsModelsDep = Annotated[Registry, Depends(_ws_models)]
ForwarderDep = Annotated[Forwarder, Depends(_forwarder)]
SettingsDep = Annotated[Settings, Depends(_settings)]
NameDep = Annotated[str, Path(pattern=NAME_PATTERN, description="Model name.")]
MinVersionDep = Annotated[int | None, Depends(_min_version)]

#: Models documented as request bodies (see :func:`body_doc`).
_BODY_MODELS: dict[str, type[BaseModel]] = {}


def json_body(model: type[B]) -> Any:
    """A dependency giving the request's JSON body as ``model`` (:func:`parsing.json_body`)."""

    async def read(request: Request) -> B:
        return parsing.json_body(model, request.headers.get("content-type"), await request.body())

    return Depends(read)


def body_doc(
    model: type[BaseModel], description: str = "", extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON body of ``model`` (plus ``extra`` media types)."""
    _BODY_MODELS[model.__name__] = model
    content = {parsing.JSON: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    body: dict[str, Any] = {"required": True, "content": {**content, **(extra or {})}}
    if description:
        body["description"] = description
    return {"requestBody": body}


def extend_openapi(app: FastAPI, edit: Callable[[dict[str, Any]], None]) -> None:
    """Have ``edit`` amend the app's OpenAPI schema once, when it is first generated."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            edit(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document_bodies(app: FastAPI) -> None:
    """Add the schemas of the documented body models to the app's OpenAPI components."""

    def edit(schema: dict[str, Any]) -> None:
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, model in _BODY_MODELS.items():
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for sub, definition in body.pop("$defs", {}).items():
                components.setdefault(sub, definition)
            components.setdefault(name, body)

    extend_openapi(app, edit)
