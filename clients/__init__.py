"""Python SDK and command line of opml-service.

* :class:`OPMLClient` (blocking) and :class:`AsyncOPMLClient` (asyncio): every operation of the
  HTTP/WebSocket contract, typed answers (:mod:`clients.types`), numpy in and out.
* ``client.stream(name)``: WebSocket ingestion with a bounded window, reconnect and resend.
* :mod:`clients.errors`: problem+json answers as exceptions; :class:`RetryPolicy` bounds retries.
* ``opml`` (:mod:`clients.cli`): the same from a shell.

Each name is imported from its module on first use (PEP 562), so ``import clients`` and the
``opml`` command start without httpx, websockets and numpy (~0.5 s) until a client is made, and
the algorithm core (numba, scipy) loads only for ``to_sklearn``.

>>> import clients
>>> clients.RetryPolicy.none().attempts
0
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clients.aio import AsyncOPMLClient, AsyncStream
    from clients.errors import (
        APIError,
        BadRequest,
        Conflict,
        ConnectionFailed,
        Forbidden,
        FrameRejected,
        InvalidInput,
        NotFound,
        OPMLError,
        PayloadTooLarge,
        ServerError,
        Unauthorized,
        Unavailable,
    )
    from clients.retry import RetryPolicy
    from clients.sync import OPMLClient, Stream
    from clients.types import (
        Ack,
        Distance,
        Distances,
        Event,
        Ingested,
        MetricSnapshot,
        Model,
        Progress,
        StepOutcome,
        Transformed,
        Verdict,
        VerificationState,
    )

__all__ = [
    "APIError",
    "Ack",
    "AsyncOPMLClient",
    "AsyncStream",
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "Distance",
    "Distances",
    "Event",
    "Forbidden",
    "FrameRejected",
    "Ingested",
    "InvalidInput",
    "MetricSnapshot",
    "Model",
    "NotFound",
    "OPMLClient",
    "OPMLError",
    "PayloadTooLarge",
    "Progress",
    "RetryPolicy",
    "ServerError",
    "StepOutcome",
    "Stream",
    "Transformed",
    "Unauthorized",
    "Unavailable",
    "Verdict",
    "VerificationState",
]

#: The module of each name that is not in :mod:`clients.errors`.
_MODULE_OF = {
    "AsyncOPMLClient": "aio",
    "AsyncStream": "aio",
    "OPMLClient": "sync",
    "Stream": "sync",
    "RetryPolicy": "retry",
    "Ack": "types",
    "Distance": "types",
    "Distances": "types",
    "Event": "types",
    "Ingested": "types",
    "MetricSnapshot": "types",
    "Model": "types",
    "Progress": "types",
    "StepOutcome": "types",
    "Transformed": "types",
    "Verdict": "types",
    "VerificationState": "types",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    module = importlib.import_module(f"clients.{_MODULE_OF.get(name, 'errors')}")
    value = getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
