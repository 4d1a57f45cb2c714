"""Prometheus metrics of the service, all defined here (``GET /metrics`` renders them).

Names follow Prometheus conventions: ``opml_`` prefix, ``_total`` for counters, base units.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest

SAMPLES_INGESTED = Counter(
    "opml_samples_ingested_total", "Samples durably appended to a model's log.", ["model"]
)
INGEST_REQUESTS = Counter(
    "opml_ingest_requests_total",
    "Ingestion requests / frames by transport and result.",
    ["transport", "result"],
)
STEPS = Counter("opml_steps_total", "Learner steps applied, by outcome.", ["model", "outcome"])
MODEL_VERSION = Gauge("opml_model_version", "Seq of the last applied sample.", ["model"])
MODEL_LAG = Gauge("opml_model_lag", "Logged but not yet applied samples.", ["model"])
CHECKPOINT_SEQ = Gauge("opml_checkpoint_seq", "Seq included in the latest checkpoint.", ["model"])
CHECKPOINT_TIME = Gauge(
    "opml_checkpoint_timestamp_seconds",
    "Unix time of the latest checkpoint (age = time() - this).",
    ["model"],
)
EVENTS_DROPPED = Counter(
    "opml_events_dropped_total", "/events frames dropped for slow readers.", ["model"]
)
REDIS_ERRORS = Counter("opml_redis_errors_total", "Failed Redis calls, by place.", ["where"])

_PER_MODEL = (MODEL_VERSION, MODEL_LAG, CHECKPOINT_SEQ, CHECKPOINT_TIME)


def forget_model(name: str) -> None:
    """Drop the per-model gauges of a deleted model (counters keep their history)."""
    for gauge in _PER_MODEL:
        with contextlib.suppress(KeyError):
            gauge.remove(name)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
