"""The errors of the service's domain: one hierarchy, no web imports.

The engine, the storage layer and the API raise a :class:`ServiceError` subclass; each has a
``slug`` naming what went wrong (the problem ``type`` on the wire, and the ``reason`` label of
``opml_samples_rejected_total``) and a ``detail`` sentence written for the caller. How an error
becomes an HTTP answer (status code, title, headers, RFC 9457 ``application/problem+json``) is
decided in one place of the API layer, :mod:`service.api.problems`.

>>> err = Unavailable("Redis is unreachable", retry_after=2)
>>> err.slug, err.detail, err.retry_after
('unavailable', 'Redis is unreachable', 2)
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """Base of every error the service reports; ``extra`` becomes members of the problem."""

    slug: str = "internal"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidInput(ServiceError):
    """The request is well-formed but a value is not acceptable; ``errors`` lists
    ``{loc, msg, type}`` items (as FastAPI's validation errors do)."""

    slug = "validation"

    def __init__(self, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail, errors=errors or [])


class Unauthorized(ServiceError):
    """No API key, or one that is not configured; ``challenge`` is the ``WWW-Authenticate``."""

    slug = "unauthorized"

    def __init__(self, detail: str, *, challenge: str) -> None:
        super().__init__(detail)
        self.challenge = challenge


class Forbidden(ServiceError):
    """The API key is valid but lacks the scope the route needs (``required_scope``), or does
    not cover the model the request names (no ``required_scope``)."""

    slug = "forbidden"

    def __init__(self, detail: str, *, challenge: str, required_scope: str | None = None) -> None:
        if required_scope is None:
            super().__init__(detail)
        else:
            super().__init__(detail, required_scope=required_scope)
        self.challenge = challenge


class NotFound(ServiceError):
    """No such model (or route)."""

    slug = "not-found"


class Conflict(ServiceError):
    """The name exists, or an idempotency key was reused with a different body."""

    slug = "conflict"


class NotCertifiable(ServiceError):
    """No certificate can be given for the model as it is: too few held-out samples yet
    (``needed`` more on top of the ``have`` there are), or the model was not configured for
    the method asked (``holdout = 0``, ``pac_bayes_window = 0``)."""

    slug = "not-certifiable"


class PayloadTooLarge(ServiceError):
    """The body (or WebSocket frame) is larger than ``OPML_MAX_BODY_BYTES``."""

    slug = "payload-too-large"


class UnsupportedMediaType(ServiceError):
    """The body's ``Content-Type`` is not one the route reads (``accepted`` lists them)."""

    slug = "unsupported-media-type"


class LimitExceeded(ServiceError):
    """A documented limit (batch length, classes per model, models) would be exceeded."""

    slug = "limit-exceeded"


class Unavailable(ServiceError):
    """Redis unreachable, state not loaded, or a bounded wait ran out: retry after
    ``retry_after`` seconds."""

    slug = "unavailable"

    def __init__(self, detail: str, *, retry_after: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class StorageUnavailable(Unavailable):
    """A call to the store failed (Redis or the network to it: unreachable, timed out, a
    cluster failover under way); nothing is known to have changed unless the detail says so."""
