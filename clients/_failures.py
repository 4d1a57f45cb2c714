"""Reading refusals (problem+json, or a status with no document) into exceptions, and the
retry decision: which failures are worth another attempt, and what the caller sees at the end.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from clients._calls import Call
from clients.errors import APIError, ConnectionFailed, from_problem


def retry_after(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds (the delta-seconds form; an HTTP date counts as absent)."""
    value = headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def problem(response: httpx.Response) -> APIError:
    """The exception for a 4xx/5xx answer."""
    where = f"{response.request.method} {response.request.url.path}"
    return refusal(response.status_code, response.content, where, retry_after(response.headers))


def refusal(
    status: int, body: bytes | bytearray, where: str, retry_after: float | None = None
) -> APIError:
    """The exception for status ``status`` with ``body``: its problem document, or, when the
    body is none (a proxy's empty 403, an HTML error page), a message that names the status
    and ``where`` it came from.

    >>> str(refusal(403, b"", "WebSocket /v1/models/faces/stream"))
    '403 Forbidden: WebSocket /v1/models/faces/stream answered 403 with an empty body'
    """
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("detail" in doc or "title" in doc):
        return from_problem(status, doc, retry_after)
    text = body.decode(errors="replace").strip()
    said = f": {text[:200]}" if text else " with an empty body"
    return from_problem(status, {"detail": f"{where} answered {status}{said}"}, retry_after)


def handshake_refusal(status: int, body: bytes | bytearray, url: str) -> Exception:
    """What a refused WebSocket handshake raises: its :class:`APIError` (401, 403, 404, 422,
    ...), or :class:`ConnectionError` for a 5xx (transient: the stream reconnects)."""
    where = f"WebSocket {httpx.URL(url).path}"
    if status >= 500:
        return ConnectionError(f"{where}: handshake answered {status}")
    return refusal(status, body, where)


#: Failures where the request never reached the service: retrying cannot apply it twice.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def should_retry(call: Call[Any], failure: Exception) -> bool:
    """Whether ``failure`` (a transport error or an :class:`APIError`) is worth a retry (the
    :class:`RetryPolicy` may still give up: :meth:`RetryPolicy.gives_up`)."""
    if isinstance(failure, APIError):
        return failure.status == 503  # a rejected request changed nothing
    if isinstance(failure, NOT_SENT):
        return True
    return call.replay_safe and isinstance(failure, httpx.TransportError)


def give_up(failure: Exception, url: str) -> Exception:
    """What the caller sees once the retries on ``url`` are spent (or none is worth it)."""
    if isinstance(failure, APIError):
        return failure
    if isinstance(failure, (*NOT_SENT, ConnectionRefusedError)):
        return ConnectionFailed(f"cannot connect to {url}: {failure}")
    return ConnectionFailed(f"connection to {url} failed: {type(failure).__name__}: {failure}")
