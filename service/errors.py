"""One error hierarchy, mapped to RFC 9457 ``application/problem+json`` in one place.

Service code raises a :class:`ServiceError` subclass; :func:`install` maps it, FastAPI's own
validation errors, Starlette's HTTP errors (unknown route, wrong method), Redis failures (503)
and anything unexpected (500, no traceback in the body) to a problem document.

>>> NotFound("model 'x' does not exist").problem()["status"]
404
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import telemetry

PROBLEM_MEDIA_TYPE = "application/problem+json"
#: Base of the ``type`` URIs (relative references, RFC 9457 Sec. 3.1.1).
TYPE_BASE = "/problems/"

log = logging.getLogger("service.errors")


class ServiceError(Exception):
    """Base of every error the API reports; ``slug``/``title``/``status`` per subclass."""

    status: int = 500
    title: str = "Internal error"
    slug: str = "internal"

    def __init__(
        self,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra

    def problem(self) -> dict[str, Any]:
        """The problem document (JSON-safe)."""
        body: dict[str, Any] = {
            "type": TYPE_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        body.update(jsonable_encoder(self.extra))
        return body


class InvalidInput(ServiceError):
    """422: the request is well-formed JSON but its values are not acceptable.

    ``errors`` lists ``{loc, msg, type}`` items like FastAPI's validation errors.
    """

    status = 422
    title = "Invalid input"
    slug = "validation"

    def __init__(self, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail, errors=errors or [])


class Unauthorized(ServiceError):
    """401 with ``WWW-Authenticate``: no API key, or one that is not configured."""

    status = 401
    title = "Unauthorized"
    slug = "unauthorized"

    def __init__(self, detail: str, *, challenge: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": challenge})


class Forbidden(ServiceError):
    """403: the API key is valid but lacks the scope the route needs (``required_scope``)."""

    status = 403
    title = "Forbidden"
    slug = "forbidden"

    def __init__(self, detail: str, *, challenge: str, required_scope: str) -> None:
        super().__init__(
            detail, headers={"WWW-Authenticate": challenge}, required_scope=required_scope
        )


class NotFound(ServiceError):
    """404: no such model (or route)."""

    status = 404
    title = "Not found"
    slug = "not-found"


class Conflict(ServiceError):
    """409: the name exists, or an idempotency key was reused with a different body."""

    status = 409
    title = "Conflict"
    slug = "conflict"


class PayloadTooLarge(ServiceError):
    """413: the body (or WS frame) is larger than ``OPML_MAX_BODY_BYTES``."""

    status = 413
    title = "Payload too large"
    slug = "payload-too-large"


class LimitExceeded(ServiceError):
    """422: a documented limit (batch length, classes per model, models) would be exceeded."""

    status = 422
    title = "Limit exceeded"
    slug = "limit-exceeded"


class Unavailable(ServiceError):
    """503 with ``Retry-After``: Redis unreachable, state not loaded, or a bounded wait ran out."""

    status = 503
    title = "Service unavailable"
    slug = "unavailable"

    def __init__(self, detail: str, *, retry_after: int = 1, **extra: Any) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)}, **extra)


def from_redis(exc: RedisError) -> Unavailable:
    """The 503 a failed Redis call turns into."""
    return Unavailable(f"Redis is unavailable ({type(exc).__name__}); retry shortly")


def problem_response(error: ServiceError) -> JSONResponse:
    """The HTTP answer for ``error``."""
    return JSONResponse(
        error.problem(),
        status_code=error.status,
        headers=error.headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


_HTTP_TITLES = {
    400: ("Bad request", "bad-request"),
    404: ("Not found", "not-found"),
    405: ("Method not allowed", "method-not-allowed"),
    413: ("Payload too large", "payload-too-large"),
}


def http_error(status: int, detail: str) -> ServiceError:
    """The problem for a Starlette ``HTTPException`` (unknown route, wrong method, 413)."""
    error = ServiceError(detail)
    error.status = status
    error.title, error.slug = _HTTP_TITLES.get(status, ("HTTP error", f"http-{status}"))
    return error


def validation_errors(errors: Any) -> list[dict[str, Any]]:
    """FastAPI/pydantic error items reduced to ``{loc, msg, type}`` (no input echo)."""
    return [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
        for e in errors
    ]


def install(app: FastAPI) -> None:
    """Register the one mapping from exceptions to problem+json answers."""

    async def on_service_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return problem_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        items = validation_errors(exc.errors())
        first = items[0] if items else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return problem_response(InvalidInput(f"{where}: {first['msg']}", items))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return problem_response(http_error(exc.status_code, str(exc.detail)))

    async def on_redis(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RedisError)
        telemetry.REDIS_ERRORS.labels("api").inc()
        return problem_response(from_redis(exc))

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(ServiceError("an unexpected error occurred; see the service log"))

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RedisError, on_redis)
    app.add_exception_handler(Exception, on_unexpected)
