"""Python SDK and command line of opml-service.

* :class:`OPMLClient` (blocking) and :class:`AsyncOPMLClient` (asyncio): every operation of the
  HTTP/WebSocket contract, typed answers (:mod:`clients.types`), numpy in and out.
* ``client.stream(name)``: WebSocket ingestion with a bounded window, reconnect and resend.
* :mod:`clients.errors`: problem+json answers as exceptions; :class:`RetryPolicy` bounds retries.
* ``opml`` (:mod:`clients.cli`): the same from a shell.
"""

from clients.aio import AsyncOPMLClient, AsyncStream
from clients.errors import (
    APIError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    FrameRejected,
    InvalidInput,
    NotFound,
    OPMLError,
    PayloadTooLarge,
    ServerError,
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
    "Unavailable",
    "Verdict",
    "VerificationState",
]
