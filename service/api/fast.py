"""The lean path of the hot queries: ``POST /v1/models/{name}/distance`` and ``/verify``.

FastAPI spends ~250 us of CPU per request on this machine before and after a route runs
(matching every route, solving dependencies, ``json.loads`` then re-validating the body with
pydantic, serialising the response model). :class:`FastQueries` answers the common case of the
two hot queries itself, with the routes' own code (:func:`~service.api.routes.queries.
distance_answer`, :func:`~service.api.routes.queries.verify_answer`):

* ``POST /v1/models/<name>/distance`` or ``/verify`` with a valid name, no query string or
  only ``min_version=<digits>``, and ``Content-Type: application/json``: the body is parsed and
  validated in one pass (pydantic's ``model_validate_json``, the routes' body models);
* ``POST .../distance`` with ``Content-Type: application/x-npz``: the binary gallery (handled
  only here; :func:`service.models.inputs.npz_arrays`), answered with its own 4xx problems.

Everything else goes to the application unchanged. A JSON request that fails validation here
(or that a route would reject with 422) is *replayed* into the FastAPI route with its body, so
every refusal, problem document and ``errors[].loc`` is exactly the route's. This middleware is
the innermost one: authentication, the body limit and the HTTP metrics wrap it as they wrap
the routes (it sets ``scope["route"]`` so the metrics see the route template).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.routes import queries
from service.errors import InvalidInput, ServiceError, http_error, problem_response
from service.models import inputs
from service.models.schemas import NAME_PATTERN, DistanceBody, VerifyBody
from service.models.service import ModelService

_PATH = re.compile(r"/v1/models/(" + NAME_PATTERN.strip("^$") + r")/(distance|verify)")
_QUERY = re.compile(rb"(?:min_version=(\d{1,18}))?")
#: The routes this path stands in for (``scope["route"]``: the metrics label by template).
_ROUTES = {
    route.path.rsplit("/", 1)[-1]: route
    for route in queries.router.routes
    if isinstance(route, APIRoute) and route.path.endswith(("/distance", "/verify"))
}
_NPZ_SHAPES = {"a": 1, "b": 2}


class _Replay(Exception):
    """The request is left to the FastAPI route (with its body)."""


def _media_type(value: bytes) -> bytes:
    return value.split(b";", 1)[0].strip().lower()


class FastQueries:
    """ASGI middleware: the hot queries without FastAPI's per-request machinery."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = _PATH.fullmatch(scope["path"])
        query = _QUERY.fullmatch(scope["query_string"])
        if path is None or query is None:
            await self.app(scope, receive, send)
            return
        content_type = accept = b""
        for key, value in scope["headers"]:
            if key == b"content-type":
                content_type = _media_type(value)
            elif key == b"accept":
                accept = value
        name, what = path.group(1), path.group(2)
        binary = content_type == inputs.NPZ.encode() and what == "distance"
        if content_type != b"application/json" and not binary:
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(receive)
        except ClientDisconnect:
            return
        except HTTPException as exc:  # BodyLimit: a streamed body over OPML_MAX_BODY_BYTES
            await problem_response(http_error(exc.status_code, str(exc.detail)))(
                scope, receive, send
            )
            return
        scope["route"] = _ROUTES[what]
        min_version = None if query.group(1) is None else int(query.group(1))
        try:
            response = await self._answer(
                scope, name, what, body, binary, min_version, accept.decode("latin-1")
            )
        except _Replay:
            del scope["route"]  # FastAPI routes it afresh
            await self.app(scope, _replaying(body, receive), send)
            return
        except ServiceError as exc:
            response = problem_response(exc)
        await response(scope, receive, send)

    async def _answer(
        self,
        scope: Scope,
        name: str,
        what: str,
        body: bytes,
        binary: bool,
        min_version: int | None,
        accept: str,
    ) -> Any:
        models: ModelService = scope["app"].state.models
        if binary:  # the body is checked first, as FastAPI does with a JSON one
            limit: int = scope["app"].state.settings.max_body_bytes
            arrays = inputs.npz_arrays(body, _NPZ_SHAPES, limit)
            snap = await models.snapshot(name, min_version)
            return await queries.distance_answer(
                snap, arrays["a"], arrays["b"], npy=queries.wants_npy(accept)
            )
        try:
            if what == "distance":
                parsed: Any = DistanceBody.model_validate_json(body)
            else:
                parsed = VerifyBody.model_validate_json(body)
        except ValidationError:
            raise _Replay from None
        snap = await models.snapshot(name, min_version)
        try:
            if what == "distance":
                return await queries.distance_answer(
                    snap, parsed.a, parsed.b, npy=queries.wants_npy(accept)
                )
            return queries.verify_answer(name, snap, parsed.a, parsed.b, parsed.threshold)
        except InvalidInput:
            # The route answers it: its JSON parser differs from pydantic's on a few edge
            # cases (an integer literal too large for a float), and its error must be the one.
            raise _Replay from None


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that delivers ``body`` (already read) once, then defers to ``receive``."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
