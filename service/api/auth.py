"""Who may call what: the scope each route needs, checked before a body is read.

One table (:data:`ROUTE_SCOPES`, by method and path template) says which scope each route
needs; :class:`Authenticate` (ASGI middleware) checks the caller's key *before* routing, so no
route reads a body for an unauthenticated client (it cannot make the service parse a 32 MiB
body). A ``/v1/`` request missing from the table needs ``admin`` (fail closed); paths outside
``/v1/`` (probes, ``/metrics``, docs) are open.

Where the key comes from:

* ``Authorization: Bearer <key>`` on HTTP and on the WebSocket handshake;
* for browsers, which cannot set headers on a WebSocket: the subprotocol list,
  ``new WebSocket(url, ["opml", "opml.bearer." + key])``; the service then accepts with the
  subprotocol ``opml`` (it never echoes the key). A ``?access_token=`` query parameter was not
  chosen: query strings end up in access logs, proxy logs and browser history.

A refused WebSocket handshake gets an HTTP 401/403 problem+json answer (the ASGI WebSocket
denial response), not an accepted-then-closed socket.

A key limited to some models (:class:`service.security.ModelPatterns`) is checked here too, from
the path alone: ``/v1/models/<name>/...`` for a name outside its patterns is 403 before any
route runs, so the answer cannot depend on whether the model exists; other ``/v1/`` paths than
``/v1/models`` itself are 403 for such a key. Creating (the name is in the body) and listing
read the caller's :class:`~service.security.Grant` from the request's state
(:func:`grant_of`). A request another process answers (:mod:`service.api.forward`) is checked
here before it is forwarded, and again by that process, which receives the same key: neither
side trusts the other's check.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.deps import extend_openapi
from service.api.problems import problem_response
from service.errors import Forbidden, ServiceError, Unauthorized
from service.security import Grant, KeyRing
from service.security import Scope as KeyScope

#: The scope each route needs when keys are configured: (method, path template) -> scope;
#: ``WS`` marks the WebSocket routes.
ROUTE_SCOPES: dict[tuple[str, str], KeyScope] = {
    ("POST", "/v1/models"): KeyScope.ADMIN,
    ("DELETE", "/v1/models/{name}"): KeyScope.ADMIN,
    ("PUT", "/v1/models/{name}/metric"): KeyScope.ADMIN,
    ("POST", "/v1/models/{name}/samples"): KeyScope.INGEST,
    ("POST", "/v1/models/{name}/gallery"): KeyScope.INGEST,
    ("DELETE", "/v1/models/{name}/gallery/{item_id}"): KeyScope.INGEST,
    ("WS", "/v1/models/{name}/stream"): KeyScope.INGEST,
    ("GET", "/v1/models"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}/metric"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}/certificate"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}/roc"): KeyScope.QUERY,
    ("POST", "/v1/models/{name}/distance"): KeyScope.QUERY,
    ("POST", "/v1/models/{name}/verify"): KeyScope.QUERY,
    ("POST", "/v1/models/{name}/transform"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}/gallery"): KeyScope.QUERY,
    ("POST", "/v1/models/{name}/identify"): KeyScope.QUERY,
    ("WS", "/v1/models/{name}/events"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}/recent"): KeyScope.QUERY,
    ("GET", "/v1/models/{name}/calibration"): KeyScope.QUERY,
    ("GET", "/v1/key"): KeyScope.QUERY,
}
#: Everything outside it is open: ``/livez``, ``/readyz``, ``/metrics``, ``/docs``,
#: ``/redoc``, ``/openapi.json``, the console's static files ``/ui/`` (no data: its pages
#: call the API with the viewer's key) and unknown paths, which are 404 anyway.
API_PREFIX = "/v1/"


#: Path parameters that may span several segments (a gallery id may hold ``/``).
_MULTI_SEGMENT = ("{item_id}",)


def _pattern(template: str) -> re.Pattern[str]:
    """A route template as a regex: a ``{parameter}`` is one path segment (or, in
    :data:`_MULTI_SEGMENT`, the rest of the path)."""
    for parameter in _MULTI_SEGMENT:
        template = template.replace(parameter, "(?:.+)")
    return re.compile("^" + re.sub(r"\{\w+\}", "[^/]+", template) + "$")


_PATTERNS = [
    (method, _pattern(template), scope) for (method, template), scope in ROUTE_SCOPES.items()
]


def required_scope(method: str, path: str) -> KeyScope | None:
    """The scope a request needs (``method`` ``WS`` for a WebSocket); None: open.

    >>> required_scope("DELETE", "/v1/models/faces"), required_scope("GET", "/metrics")
    (<Scope.ADMIN: 'admin'>, None)
    >>> required_scope("PATCH", "/v1/models/faces")  # not in the table: fail closed
    <Scope.ADMIN: 'admin'>
    >>> required_scope("DELETE", "/v1/models/faces/gallery/a/b")  # an id may hold a slash
    <Scope.INGEST: 'ingest'>
    """
    for m, pattern, scope in _PATTERNS:
        if m == method and pattern.match(path):
            return scope
    return KeyScope.ADMIN if path.startswith(API_PREFIX) else None


#: The WebSocket subprotocol a browser offers next to ``opml.bearer.<key>``.
SUBPROTOCOL = "opml"
_BEARER_PROTOCOL = "opml.bearer."
REALM = 'Bearer realm="opml"'


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def presented_key(scope: Scope) -> str | None:
    """The key of a request: the Bearer header, or (WebSocket) the ``opml.bearer.`` protocol."""
    authorization = _header(scope, b"authorization")
    if authorization is not None:
        kind, _, key = authorization.strip().partition(" ")
        if kind.lower() == "bearer" and key.strip():
            return key.strip()
    if scope["type"] == "websocket":
        for protocol in scope.get("subprotocols", []):
            if protocol.startswith(_BEARER_PROTOCOL) and len(protocol) > len(_BEARER_PROTOCOL):
                return str(protocol[len(_BEARER_PROTOCOL) :])
    return None


def accept_subprotocol(scope: Scope) -> str | None:
    """The subprotocol to accept a WebSocket with: ``opml`` if the client offered it."""
    return SUBPROTOCOL if SUBPROTOCOL in scope.get("subprotocols", []) else None


MODELS_PATH = "/v1/models"
_MODEL_PREFIX = MODELS_PATH + "/"
#: Where :class:`Authenticate` leaves the caller's grant, in the request's ``state``.
GRANT_STATE = "opml_grant"


def model_of(path: str) -> str | None:
    """The model a ``/v1/models/<name>/...`` path names (``""`` for an empty segment); None
    for a path naming none.

    >>> model_of("/v1/models/cam-1/gallery/a/b"), model_of("/v1/models"), model_of("/livez")
    ('cam-1', None, None)
    """
    if not path.startswith(_MODEL_PREFIX):
        return None
    return path[len(_MODEL_PREFIX) :].partition("/")[0]


def not_covered(name: str) -> Forbidden:
    """The 403 for a model outside the key's patterns (existing or not: the same answer)."""
    del name  # not echoed: the answer is the same byte for byte for every model refused
    return Forbidden(
        "this API key does not cover the model this request names",
        challenge=f'{REALM}, error="insufficient_scope"',
    )


def forbid_path(grant: Grant, path: str) -> ServiceError | None:
    """The 403 for a key limited to some models on a path outside them; None: allowed."""
    if not grant.limited or path == MODELS_PATH or not path.startswith(API_PREFIX):
        return None
    name = model_of(path)
    if name is None:
        return Forbidden(
            "this API key is limited to some models; this route is for keys covering every model",
            challenge=f'{REALM}, error="insufficient_scope"',
        )
    return None if grant.covers(name) else not_covered(name)


def check(
    keys: KeyRing, key: str | None, needed: KeyScope, path: str = MODELS_PATH
) -> ServiceError | Grant:
    """The key's grant if ``key`` may use a route needing ``needed`` at ``path``; else the
    401/403 to answer."""
    if key is None:
        return Unauthorized(
            "an API key is required: send 'Authorization: Bearer <key>'", challenge=REALM
        )
    grant = keys.grant_of(key)
    if grant is None:
        return Unauthorized("the API key is not valid", challenge=f'{REALM}, error="invalid_token"')
    if needed not in grant.scopes:
        return Forbidden(
            f"this API key lacks the '{needed}' scope this route needs",
            challenge=f'{REALM}, error="insufficient_scope", scope="{needed}"',
            required_scope=needed.value,
        )
    return forbid_path(grant, path) or grant


def grant_of(scope: Scope) -> Grant | None:
    """The grant :class:`Authenticate` found for this request; None: keys are off (or the
    path is open), every model is covered."""
    state = scope.get("state")
    return None if state is None else state.get(GRANT_STATE)


class Authenticate:
    """ASGI middleware: route -> needed scope -> 401/403 before the route runs."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.keys.enabled:
            await self.app(scope, receive, send)
            return
        method = "WS" if scope["type"] == "websocket" else scope["method"]
        path = scope["path"]
        needed = required_scope(method, path)
        if needed is None:
            await self.app(scope, receive, send)
            return
        outcome = check(self.keys, presented_key(scope), needed, path)
        if isinstance(outcome, Grant):
            # a copy: the server's state dict is shared by its requests' scopes
            scope["state"] = {**scope.get("state", {}), GRANT_STATE: outcome}
            await self.app(scope, receive, send)
            return
        # On a WebSocket scope Starlette sends this as the handshake's HTTP denial response.
        await problem_response(outcome)(scope, receive, send)


def document(app: FastAPI, keys: KeyRing) -> None:
    """Add each operation's scope (``x-required-scope``) to OpenAPI and, when ``keys`` are
    configured, the Bearer scheme, each operation's ``security`` and its 401/403 answers.
    Without keys nothing is asked for, so the schema declares no scheme: Swagger UI then shows
    no Authorize button, which would only suggest a key is needed."""

    def edit(schema: dict[str, Any]) -> None:
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                needed = required_scope(method.upper(), path)
                if needed is not None:
                    operation["x-required-scope"] = needed.value
                    if keys.enabled:
                        _secured(operation, needed)
        if not keys.enabled:
            return
        schema.setdefault("components", {})["securitySchemes"] = {
            "apiKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key (OPML_API_KEYS); scopes: query, ingest, admin "
                "(admin includes the others), optionally limited to some models (403 for "
                "others).",
            }
        }

    extend_openapi(app, edit)


def _secured(operation: dict[str, Any], needed: KeyScope) -> None:
    """Mark an OpenAPI ``operation`` as needing a key with scope ``needed``."""
    operation["security"] = [{"apiKey": []}]
    responses = operation.setdefault("responses", {})
    responses.setdefault("401", {"description": "No or unknown API key."})
    responses.setdefault(
        "403", {"description": f"Key lacks '{needed}', or does not cover the model."}
    )
