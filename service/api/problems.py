"""Every error answer of the API as RFC 9457 ``application/problem+json``, decided here once.

A :class:`~service.errors.ServiceError` (the domain's errors, among them the store's failures:
503 with ``Retry-After``), FastAPI's request validation errors, Starlette's HTTP errors (unknown
route, wrong method, a body over the limit) and anything unexpected (500, no traceback in the
body) all become a problem
document: ``type`` (``/problems/<slug>``), ``title``, ``status``, ``detail`` and the error's
own members (``errors``, ``retry_after`` ...).

>>> from service.errors import NotFound
>>> problem(NotFound("model 'x' does not exist"))["status"]
404
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError, WebSocketRequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import telemetry
from service.api.parsing import invalid_request
from service.engine.runtime import NotAppliedYet
from service.errors import (
    Forbidden,
    ServiceError,
    StorageUnavailable,
    Unauthorized,
    Unavailable,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
#: Base of the ``type`` URIs (relative references, RFC 9457 Sec. 3.1.1).
TYPE_BASE = "/problems/"

#: Status code and title of each problem type.
STATUS: dict[str, tuple[int, str]] = {
    "validation": (422, "Invalid input"),
    "unauthorized": (401, "Unauthorized"),
    "forbidden": (403, "Forbidden"),
    "not-found": (404, "Not found"),
    "conflict": (409, "Conflict"),
    "not-certifiable": (409, "Not certifiable yet"),
    "payload-too-large": (413, "Payload too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "limit-exceeded": (422, "Limit exceeded"),
    "unavailable": (503, "Service unavailable"),
    "internal": (500, "Internal error"),
    "bad-request": (400, "Bad request"),
    "method-not-allowed": (405, "Method not allowed"),
    "request-timeout": (408, "Request timeout"),
}

log = logging.getLogger("service.errors")


class HttpError(ServiceError):
    """An error the HTTP layer itself raises (unknown route, wrong method, ...) with its
    status code; a status without a problem type of its own is ``http-<status>``."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.headers = dict(headers or {})
        self.slug = next((s for s, (code, _) in STATUS.items() if code == status), f"http-{status}")


def status_of(error: ServiceError) -> int:
    if isinstance(error, HttpError):
        return error.status
    return STATUS.get(error.slug, STATUS["internal"])[0]


def problem(error: ServiceError) -> dict[str, Any]:
    """The problem document of ``error`` (JSON-safe)."""
    status = status_of(error)
    title = STATUS.get(error.slug, (status, "HTTP error"))[1]
    detail = error.detail
    if isinstance(error, NotAppliedYet):  # how to read them once applied, in the API's terms
        detail += f"; query with min_version={error.last_seq}"
    body: dict[str, Any] = {
        "type": TYPE_BASE + error.slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    body.update(jsonable_encoder(error.extra))
    return body


def headers_of(error: ServiceError) -> dict[str, str]:
    """The HTTP headers an error's answer carries (``Retry-After``, ``WWW-Authenticate``)."""
    if isinstance(error, Unavailable):
        return {"Retry-After": str(error.retry_after)}
    if isinstance(error, Unauthorized | Forbidden):
        return {"WWW-Authenticate": error.challenge}
    if isinstance(error, HttpError):
        return error.headers
    return {}


def problem_response(error: ServiceError) -> JSONResponse:
    """The HTTP answer for ``error`` (a failure of the store counted, :func:`count`)."""
    count(error)
    return JSONResponse(
        problem(error),
        status_code=status_of(error),
        headers=headers_of(error),
        media_type=PROBLEM_MEDIA_TYPE,
    )


def count(error: ServiceError, where: str = "api") -> None:
    """Count a failure of the store (``opml_redis_errors_total``) that an answer reports."""
    if isinstance(error, StorageUnavailable):
        telemetry.REDIS_ERROR[where].inc()


def response_for(exc: Exception) -> JSONResponse:
    """The answer for any exception raised outside FastAPI's error layer (the ASGI
    middleware: forwarding, the lean routes), exactly as the app's handlers would give it."""
    if isinstance(exc, ServiceError):
        return problem_response(exc)
    if isinstance(exc, StarletteHTTPException):  # BodyLimit: a body over OPML_MAX_BODY_BYTES
        return problem_response(HttpError(exc.status_code, str(exc.detail), exc.headers))
    return unexpected(exc)


def unexpected(exc: Exception) -> JSONResponse:
    """The 500 of an unexpected error (logged with its traceback, which the answer never holds)."""
    log.exception("unhandled error", exc_info=exc)
    return problem_response(ServiceError("an unexpected error occurred; see the service log"))


async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    """The handler of any other exception (the app's, and the one around the service's own
    ASGI layers, :func:`service.app.create_app`)."""
    return unexpected(exc)


def validation_errors(errors: Any) -> list[dict[str, Any]]:
    """FastAPI/pydantic error items reduced to ``{loc, msg, type}`` (no input echo)."""
    return [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
        for e in errors
    ]


_HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def allowed_methods(request: Request) -> list[str]:
    """Every method the API serves at the request's path (RFC 9110 ``Allow``), from the
    OpenAPI description of the routes.

    Starlette's own 405 names only the first route that matches the path, but one path may
    have several (``GET`` and ``POST /v1/models``). Empty for a path outside the description
    (``/docs``): Starlette's header is right there."""
    path = request.url.path
    return sorted(
        method.upper()
        for template, operations in request.app.openapi()["paths"].items()
        if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", template), path)
        for method in operations
        if method in _HTTP_METHODS
    )


def install(app: FastAPI) -> None:
    """Register the one mapping from exceptions to problem+json answers."""

    async def on_service_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return problem_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(invalid_request(validation_errors(exc.errors())))

    async def on_ws_validation(websocket: WebSocket, exc: Exception) -> None:
        # A bad query parameter of a WebSocket route: the handshake's HTTP answer is the 422
        # problem (ASGI WebSocket denial response), like a refused key's 401/403, rather than
        # FastAPI's close before accepting, which a client sees as an empty 403.
        assert isinstance(exc, WebSocketRequestValidationError)
        error = invalid_request(validation_errors(exc.errors()))
        await websocket.send_denial_response(problem_response(error))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        allowed = ", ".join(allowed_methods(request)) if exc.status_code == 405 else ""
        if allowed:
            detail = f"{request.method} is not allowed here; allowed: {allowed}"
            return problem_response(HttpError(405, detail, {"Allow": allowed}))
        return problem_response(HttpError(exc.status_code, str(exc.detail), exc.headers))

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(WebSocketRequestValidationError, on_ws_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
