"""Ingestion as the API sees it, shared by ``POST .../samples`` and ``WS .../stream``: a
request's samples checked against the model and the limits, handed to the engine, and counted
by transport (``opml_samples_accepted_total``, ``opml_samples_rejected_total``,
``opml_idempotent_replays_total``).

A request goes through :func:`ingest`. A ``/stream`` frame is checked by :func:`validate`,
started by the engine without suspending when there is room (``ModelRuntime.submit``: no task
per frame) and counted by :func:`count_accepted` / :func:`count_refused`, the pieces
:func:`ingest` is made of (a connection adds up its acknowledged frames' samples and counts
them per burst: :func:`service.api.routes.stream._send_acks`).
"""

from __future__ import annotations

from collections.abc import Sequence

from service.api import parsing
from service.api.schemas import SampleFields
from service.core._validation import Array
from service.core.holdout import Flags
from service.engine.runtime import Appended, IngestResult, ModelRuntime
from service.errors import LimitExceeded, NotFound, ServiceError

Items = Sequence[SampleFields] | parsing.Block


async def ingest(
    runtime: ModelRuntime,
    items: Items,
    *,
    loc: list[str | int],
    indexed: bool,
    transport: str,
    idempotency_field: str = "",
    wait: bool = False,
) -> IngestResult:
    """Validate ``items`` (``loc`` locates them in the request; ``indexed``: a list, so items
    add their index) and append them; count the outcome under ``transport``."""
    try:
        X, keys, holdout = validate(runtime, items, loc=loc, indexed=indexed)
        result = await runtime.ingest(
            X, keys, holdout=holdout, idempotency_field=idempotency_field, wait=wait
        )
    except ServiceError as exc:
        count_refused(runtime, transport, len(items), exc)
        raise
    count_accepted(runtime, transport, result)
    return result


def validate(
    runtime: ModelRuntime, items: Items, *, loc: list[str | int], indexed: bool
) -> tuple[Array, list[str], Flags | None]:
    """The rows, class keys and ``holdout`` flags of ``items``, checked against the model and
    the batch limit (LimitExceeded, InvalidInput)."""
    max_batch = runtime.settings.max_batch
    if len(items) > max_batch:
        raise LimitExceeded(
            f"{len(items)} samples in one request; at most {max_batch} (OPML_MAX_BATCH)"
        )
    if isinstance(items, parsing.Block):
        X, keys = parsing.block(items)
    else:
        X, keys = parsing.samples(items, runtime.config.dim, loc, indexed)
    return X, keys, parsing.holdout_flags(items)


def count_accepted(runtime: ModelRuntime, transport: str, result: IngestResult | Appended) -> None:
    """Count an append that went through (a replay as a replay)."""
    if result.replayed:
        runtime.telemetry.replays[transport].inc()
    else:
        runtime.telemetry.accepted[transport].inc(result.last_seq - result.first_seq + 1)


def count_refused(runtime: ModelRuntime, transport: str, samples: int, exc: ServiceError) -> None:
    """Count ``samples`` refused for ``exc``'s reason (a failure of the store as
    unavailable)."""
    reason = exc.slug
    if reason != NotFound.slug:  # a vanished model has no series to count in
        runtime.telemetry.rejected(transport, reason, samples)
