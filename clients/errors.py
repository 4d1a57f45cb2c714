"""Exceptions of the SDK: one per problem+json status the contract names, plus transport failures.

Every answer of the service that is not 2xx is an RFC 9457 problem document; :func:`from_problem`
turns it into the matching :class:`APIError` subclass, which keeps every member of the document.

>>> err = from_problem(404, {"type": "/problems/not-found", "title": "Not found",
...                          "status": 404, "detail": "model 'x' does not exist"})
>>> isinstance(err, NotFound), err.status, err.detail
(True, 404, "model 'x' does not exist")
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class OPMLError(Exception):
    """Base of every exception the SDK raises."""


class ConnectionFailed(OPMLError):
    """The service could not be reached (or kept dropping the connection) within the retries."""


class APIError(OPMLError):
    """A problem+json answer: ``type``, ``title``, ``status``, ``detail``, ``errors``, ``extra``.

    ``extra`` holds every member beyond the four of RFC 9457 (``errors`` included);
    ``retry_after`` is the ``Retry-After`` header in seconds, when there was one.
    """

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        type: str = "about:blank",
        extra: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.extra: dict[str, Any] = extra or {}
        self.retry_after = retry_after

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Validation items ``{loc, msg, type}`` (empty unless the service sent some)."""
        items = self.extra.get("errors")
        return list(items) if isinstance(items, list) else []


class BadRequest(APIError):
    """400 (and any other 4xx without a class of its own)."""


class Unauthorized(APIError):
    """401: no API key, or an unknown one (the client's ``api_key``)."""


class Forbidden(APIError):
    """403: the API key lacks the scope the operation needs (``extra["required_scope"]``)."""


class NotFound(APIError):
    """404: no such model."""


class Conflict(APIError):
    """409: the model name exists, or an idempotency key was reused with another body."""


class PayloadTooLarge(APIError):
    """413: the body or frame is larger than the service accepts."""


class InvalidInput(APIError):
    """422: well-formed but unacceptable values (``errors`` says which)."""


class Unavailable(APIError):
    """503: Redis unreachable, models loading, or a ``min_version`` wait ran out."""


class ServerError(APIError):
    """500 and any other 5xx."""


class FrameRejected(APIError):
    """A WebSocket ingestion frame answered with ``{"error": ..., "id": frame_id}``."""

    def __init__(self, frame_id: object, problem: APIError) -> None:
        super().__init__(
            problem.status,
            problem.title,
            f"frame {frame_id!r}: {problem.detail}",
            type=problem.type,
            extra=problem.extra,
            retry_after=problem.retry_after,
        )
        self.frame_id = frame_id


_BY_STATUS: dict[int, type[APIError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidInput,
    503: Unavailable,
}


def from_problem(status: int, body: Any, retry_after: float | None = None) -> APIError:
    """The exception for a problem document (or for a body that is not one); without a
    ``title`` the status's reason phrase stands in.

    >>> str(from_problem(403, {"detail": "this API key lacks the scope 'admin'"}))
    "403 Forbidden: this API key lacks the scope 'admin'"
    """
    doc: dict[str, Any] = body if isinstance(body, dict) else {}
    status = int(doc.get("status", status)) if isinstance(doc.get("status"), int) else status
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else BadRequest)
    extra = {k: v for k, v in doc.items() if k not in ("type", "title", "status", "detail")}
    return cls(
        status,
        str(doc.get("title") or _reason(status)),
        str(doc.get("detail", body if isinstance(body, str) else "")),
        type=str(doc.get("type", "about:blank")),
        extra=extra,
        retry_after=retry_after,
    )


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"
