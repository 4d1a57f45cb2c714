"""The lean path of the hot queries, ``POST /v1/models/{name}/distance`` and ``/verify``: a pure
optimisation, on by default (``OPML_LEAN_PATH``).

FastAPI spends ~250 us of CPU per request on this machine before and after a route runs
(matching every route, solving dependencies, serialising). :class:`LeanPath` answers the two hot
queries without that machinery by calling the very functions their routes call
(:func:`~service.api.routes.queries.answer_distance`, :func:`~service.api.routes.queries.
answer_verify`) with the same raw parts: the body bytes, its ``Content-Type``, ``min_version``
read by :func:`service.api.parsing.min_version` from the query string parsed as Starlette parses
it, and ``Accept``. Whatever the request, valid or not, it gets the answer the route would give;
errors are rendered by :func:`service.api.problems.problem_response`, as the app's handlers do.
Requests it does not take (another path or method, a name that does not match the pattern, so
that FastAPI answers 422 as usual) go to the application unchanged.

It is the innermost middleware: authentication, the body limit and the HTTP metrics wrap it as
they wrap the routes (it sets ``scope["route"]`` so the metrics see the route template), and
each request it answers counts in ``opml_http_lean_requests_total``.
"""

from __future__ import annotations

import re

from fastapi.routing import APIRoute
from redis.exceptions import RedisError
from starlette.datastructures import Headers, QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service import telemetry
from service.api import parsing
from service.api.problems import HttpError, from_redis, problem_response
from service.api.routes import queries
from service.api.schemas import NAME_PATTERN
from service.engine.registry import Registry
from service.errors import ServiceError

_PATH = re.compile(r"/v1/models/(" + NAME_PATTERN.strip("^$") + r")/(distance|verify)")
#: The routes this path stands in for (``scope["route"]``: the metrics label by template).
_ROUTES = {
    route.path.rsplit("/", 1)[-1]: route
    for route in queries.router.routes
    if isinstance(route, APIRoute) and route.path.endswith(("/distance", "/verify"))
}
_COUNTERS = {what: telemetry.LEAN_REQUESTS.labels(route.path) for what, route in _ROUTES.items()}


class LeanPath:
    """ASGI middleware: the hot queries without FastAPI's per-request machinery."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = None
        if scope["type"] == "http" and scope["method"] == "POST":
            path = _PATH.fullmatch(scope["path"])
        if path is None:
            await self.app(scope, receive, send)
            return
        name, what = path.group(1), path.group(2)
        scope["route"] = _ROUTES[what]
        _COUNTERS[what].inc()
        try:
            response = await self._answer(scope, receive, name, what)
        except ClientDisconnect:
            return
        await response(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, name: str, what: str) -> Response:
        models: Registry = scope["app"].state.models
        headers = Headers(scope=scope)
        try:
            body = await _read_body(receive)
            min_version = parsing.min_version(QueryParams(scope["query_string"]).get("min_version"))
            content_type = headers.get("content-type")
            if what == "distance":
                return await queries.answer_distance(
                    models, name, min_version, content_type, body, headers.get("accept")
                )
            return await queries.answer_verify(models, name, min_version, content_type, body)
        except ServiceError as exc:
            return problem_response(exc)
        except HTTPException as exc:  # BodyLimit: a streamed body over OPML_MAX_BODY_BYTES
            return problem_response(HttpError(exc.status_code, str(exc.detail)))
        except RedisError as exc:
            telemetry.REDIS_ERROR["api"].inc()
            return problem_response(from_redis(exc))


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
