"""The lean path of the hot requests: ingestion (``POST /v1/models/{name}/samples``), the hot
queries (``POST .../distance``, ``.../verify``, ``.../identify``) and ``GET /livez``; a pure
optimisation, on by default (``OPML_LEAN_PATH``).

FastAPI spends a large share of a request's CPU before and after a route runs
(its error and exception layers, matching every route, solving dependencies, serialising): most
of what a naive client, one sample per request, costs (docs/design/lean-path.md).
:class:`LeanPath` answers the hot
requests without that machinery by calling the very functions their routes call
(:func:`~service.api.routes.samples.answer_ingest`, :func:`~service.api.routes.queries.
answer_distance`, :func:`~service.api.routes.queries.answer_verify`,
:func:`~service.api.routes.gallery.answer_identify`, :func:`~service.api.routes.ops.livez`)
with the same raw parts: the body bytes, its ``Content-Type``, the query string parsed as
Starlette parses it (``min_version``, ``wait``, ``restricted`` are read by
:mod:`service.api.parsing`; for ``identify`` also ``k`` and ``threshold``), ``Accept`` and
``Idempotency-Key`` as Starlette reads a header. Whatever the request, valid or not, it gets the
answer the route would give; errors are rendered by :func:`service.api.problems.
problem_response` (an unexpected one by :func:`service.api.problems.unexpected`), as the app's
handlers do. Requests it does not take (another path or method, a name that does not match the
pattern, so that FastAPI answers 422 as usual) go to the application unchanged.

It is the innermost of the service's ASGI layers (:mod:`service.app`): the HTTP telemetry,
authentication, the body limit and owner routing wrap it as they wrap the routes (it sets
``scope["route"]`` so the telemetry sees the route template), and each request it answers counts
in ``opml_http_lean_requests_total``.
"""

from __future__ import annotations

import re

from fastapi.routing import APIRoute
from starlette.datastructures import Headers, QueryParams
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service import telemetry
from service.api import parsing
from service.api.problems import response_for
from service.api.routes import gallery, ops, queries, samples
from service.api.schemas import NAME_PATTERN
from service.engine.registry import Registry

_HOT = ("samples", "distance", "verify", "identify")
_PATH = re.compile(r"/v1/models/(" + NAME_PATTERN.strip("^$") + r")/(" + "|".join(_HOT) + ")")
LIVEZ = "/livez"
#: The routes this path stands in for, by the last segment of their template
#: (``scope["route"]``: the telemetry labels by template).
_ROUTES = {
    route.path.rsplit("/", 1)[-1]: route
    for module in (samples, queries, gallery, ops)
    for route in module.router.routes
    if isinstance(route, APIRoute)
    and (
        (route.path.endswith(tuple(f"/{hot}" for hot in _HOT)) and "POST" in (route.methods or ()))
        or route.path == LIVEZ
    )
}
_COUNTERS = {what: telemetry.LEAN_REQUESTS.labels(route.path) for what, route in _ROUTES.items()}
#: What an empty query string parses to (most requests have none: not parsed again each time).
_NO_QUERY = QueryParams(b"")


class LeanPath:
    """ASGI middleware: the hot requests without FastAPI's per-request machinery."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method = scope["method"]
            if method == "POST":
                path = _PATH.fullmatch(scope["path"])
                if path is not None:
                    await self._serve(scope, receive, send, path.group(2), path.group(1))
                    return
            elif method == "GET" and scope["path"] == LIVEZ:
                await self._serve(scope, receive, send, "livez", "")
                return
        await self.app(scope, receive, send)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, what: str, name: str
    ) -> None:
        scope["route"] = _ROUTES[what]
        _COUNTERS[what].inc()
        try:
            response = await self._answer(scope, receive, what, name)
        except ClientDisconnect:
            return
        await response(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, what: str, name: str) -> Response:
        if what == "livez":
            return await ops.livez()
        models: Registry = scope["app"].state.models
        headers = Headers(scope=scope)
        raw_query = scope["query_string"]
        query = QueryParams(raw_query) if raw_query else _NO_QUERY
        try:
            body = await _read_body(receive)
            content_type = headers.get("content-type")
            if what == "samples":
                return await samples.answer_ingest(
                    models, name, content_type, body, query.get("wait"),
                    headers.get("idempotency-key"),
                )  # fmt: skip
            min_version = parsing.min_version(query.get("min_version"))
            if what == "distance":
                return await queries.answer_distance(
                    models,
                    name,
                    min_version,
                    content_type,
                    body,
                    headers.get("accept"),
                    parsing.restricted(query.get("restricted")),
                )
            if what == "identify":
                return await gallery.answer_identify(
                    models, name, min_version, content_type, body, headers.get("accept"),
                    query.get("k"), query.get("threshold"), query.get("far"), query.get("frr"),
                )  # fmt: skip
            return await queries.answer_verify(models, name, min_version, content_type, body)
        except ClientDisconnect:
            raise
        except Exception as exc:  # outside FastAPI's error layer: answered as it would
            return response_for(exc)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
