"""Ingestion as the API sees it, shared by ``POST .../samples`` and ``WS .../stream``: a
request's samples checked against the model and the limits, handed to the engine, and counted
by transport (``opml_samples_accepted_total``, ``opml_samples_rejected_total``,
``opml_idempotent_replays_total``).
"""

from __future__ import annotations

from redis.exceptions import RedisError

from service.api import parsing
from service.api.schemas import Sample
from service.engine.runtime import IngestResult, ModelRuntime
from service.errors import LimitExceeded, NotFound, ServiceError, Unavailable


async def ingest(
    runtime: ModelRuntime,
    items: list[Sample] | parsing.Block,
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
        max_batch = runtime.settings.max_batch
        if len(items) > max_batch:
            raise LimitExceeded(
                f"{len(items)} samples in one request; at most {max_batch} (OPML_MAX_BATCH)"
            )
        if isinstance(items, parsing.Block):
            X, keys = parsing.block(items)
        else:
            X, keys = parsing.samples(items, runtime.config.dim, loc, indexed)
        result = await runtime.ingest(X, keys, idempotency_field=idempotency_field, wait=wait)
    except (ServiceError, RedisError) as exc:
        reason = exc.slug if isinstance(exc, ServiceError) else Unavailable.slug
        if reason != NotFound.slug:  # a vanished model has no series to count in
            runtime.metrics.rejected(transport, reason, len(items))
        raise
    if result.replayed:
        runtime.metrics.replays[transport].inc()
    else:
        runtime.metrics.accepted[transport].inc(result.accepted)
    return result
