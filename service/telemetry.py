"""The service's telemetry: its Prometheus series, all defined here (``GET /metrics`` renders
them).

Names follow Prometheus conventions: ``opml_`` prefix, base units (``_seconds``, ``_ratio``),
``_total`` for counters, histograms for latencies. Labels are bounded: ``model`` (at most
``OPML_MAX_MODELS``), ``transport`` (``rest``, ``ws``), ``outcome``, ``reason``, ``result``,
``route`` (the route *template*, e.g. ``/v1/models/{name}/samples``), never a class label or
a client id.

Two kinds of series:

* **Events** (counters and histograms) are incremented where they happen: ingestion, learner
  batches, checkpoints, verify answers, Redis failures, WebSocket frames, HTTP requests.
* **State** (gauges of each model: version, lag, classes, ``||L||_F``, hinge, accuracy, EER,
  threshold, the divergence monitor, the served step size, checkpoint age, ...) is read at
  scrape time from each model's status (the engine's one read model,
  :class:`~service.engine.status.ModelStatus`) by the collector of :mod:`service.api.observe`.
  Nothing has to be kept in sync, ages are computed with the service's own clock when
  Prometheus asks, and a deleted model simply stops appearing.

This module imports nothing of the engine or the API: they import it.

The service runs one process per instance (the learner is the single writer of each model and
its state lives in that process), so the default in-process registry is exact; prometheus-client's
multiprocess mode is neither needed nor wanted.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from service.core import OUTCOMES

# ``*_created`` series double the exposition and no dashboard here uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]

_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# -- ingestion ---------------------------------------------------------------------------------

SAMPLES_ACCEPTED = Counter(
    "opml_samples_accepted_total",
    "Samples durably appended to a model's log (idempotent replays not counted again).",
    ["model", "transport"],
)
SAMPLES_REJECTED = Counter(
    "opml_samples_rejected_total",
    "Samples of ingestion requests/frames that were refused, nothing logged, by reason "
    "(the problem type: validation, limit-exceeded, conflict, unavailable).",
    ["model", "transport", "reason"],
)
IDEMPOTENT_REPLAYS = Counter(
    "opml_idempotent_replays_total",
    "Ingestion requests/frames answered from their Idempotency-Key / frame-id record.",
    ["model", "transport"],
)
IDEMPOTENCY_DROPPED = Counter(
    "opml_idempotency_records_dropped_total",
    "Idempotency-Key / frame-id / enrol-key records removed before their retention ended, "
    "to keep a model under OPML_IDEMPOTENCY_MAX_RECORDS: a retry of theirs is logged again.",
    ["model"],
)
BACKPRESSURE_WAIT = Histogram(
    "opml_ingest_backpressure_wait_seconds",
    "Time an ingestion request/frame waited for the learner before being appended (only those "
    "that had to wait: more than OPML_MAX_UNAPPLIED samples were unapplied).",
    ["model"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
HTTP_DURATION = Histogram(
    "opml_http_request_duration_seconds",
    "HTTP request latency by method, route template and status code (RED: rate, errors, duration).",
    ["method", "route", "status"],
    buckets=_FAST_BUCKETS,
)
LEAN_REQUESTS = Counter(
    "opml_http_lean_requests_total",
    "HTTP requests answered by the lean path (OPML_LEAN_PATH) instead of the FastAPI route, by "
    "route template (the answers are the same; this says which path served them).",
    ["route"],
)
WS_FRAME_DURATION = Histogram(
    "opml_ws_frame_duration_seconds",
    "WebSocket ingestion frame latency, from receipt to its ack or error frame, by outcome.",
    ["outcome"],
    buckets=_FAST_BUCKETS,
)
WS_CONNECTIONS = Gauge(
    "opml_websocket_connections", "Open WebSocket connections by endpoint.", ["endpoint"]
)
SLOW_CLIENTS_CLOSED = Counter(
    "opml_http_slow_clients_closed_total",
    "HTTP connections closed because the request head (phase head) or body (phase body) came "
    "slower than OPML_HEAD_TIMEOUT_S / OPML_BODY_MIN_RATE allow.",
    ["phase"],
)
EVENTS_DROPPED = Counter(
    "opml_events_dropped_total", "/events frames dropped for slow readers.", ["model"]
)

# -- learning ----------------------------------------------------------------------------------

STEPS = Counter(
    "opml_steps_total",
    "Learner steps by outcome; continues the model's own counts across restarts, so the sum "
    "over outcomes equals opml_model_version.",
    ["model", "outcome"],
)
UPDATE_DURATION = Histogram(
    "opml_update_duration_seconds",
    "Time to apply one batch of log entries to a model (learner steps + publishing).",
    ["model"],
    buckets=_FAST_BUCKETS,
)
GALLERY_REFRESH = Histogram(
    "opml_gallery_refresh_seconds",
    "Time to bring a model's transformed gallery (Z = G L^T) up to a new version of L, by "
    "method (full: the whole product; incremental: the low-rank update of the steps since).",
    ["model", "method"],
    buckets=_FAST_BUCKETS,
)
VERIFY_DECISIONS = Counter(
    "opml_verify_decisions_total",
    "Verify answers by result (same/different) and threshold source (caller, calibrated, "
    "fallback:window, fallback:margin).",
    ["model", "result", "source"],
)

# -- durability --------------------------------------------------------------------------------

CHECKPOINT_DURATION = Histogram(
    "opml_checkpoint_duration_seconds",
    "Time to write one checkpoint (state serialisation + the Redis script).",
    ["model"],
    buckets=_FAST_BUCKETS,
)
REPLAYED = Counter(
    "opml_replayed_samples_total",
    "Samples replayed from the log tail when the model was loaded at start-up.",
    ["model"],
)
CHECKPOINTS_FENCED = Counter(
    "opml_checkpoints_fenced_total",
    "Checkpoints Redis refused because a newer fencing token was granted, or because the "
    "stored checkpoint covers a later log position (this process had lost the model's lease; "
    "another process owns it).",
    ["model"],
)
REDIS_ERRORS = Counter(
    "opml_redis_errors_total",
    "Failed Redis calls by component (api: HTTP requests, ws: stream frames, writer: log "
    "reads and checkpoints, loader: start-up loading, readyz).",
    ["component"],
)
REDIS_COMPONENTS = ("api", "ws", "writer", "loader", "readyz")
#: Values of the ``transport`` label.
TRANSPORTS = ("rest", "ws")
#: Values of the ``method`` label of ``opml_gallery_refresh_seconds``.
REFRESH_METHODS = ("full", "incremental")

# The series without a model label, bound once (known label values start at 0, so increase()
# works at once): failed Redis calls by component, open WebSockets and frame latency.
REDIS_ERROR = {component: REDIS_ERRORS.labels(component) for component in REDIS_COMPONENTS}
WS_OPEN = {endpoint: WS_CONNECTIONS.labels(endpoint) for endpoint in ("stream", "events")}
WS_FRAME = {outcome: WS_FRAME_DURATION.labels(outcome) for outcome in ("ack", "error")}

_PER_MODEL = (
    SAMPLES_ACCEPTED,
    SAMPLES_REJECTED,
    IDEMPOTENT_REPLAYS,
    IDEMPOTENCY_DROPPED,
    BACKPRESSURE_WAIT,
    EVENTS_DROPPED,
    STEPS,
    UPDATE_DURATION,
    GALLERY_REFRESH,
    VERIFY_DECISIONS,
    CHECKPOINT_DURATION,
    CHECKPOINTS_FENCED,
    REPLAYED,
)


class ModelTelemetry:
    """The labelled series of one model, bound once (``.labels()`` costs a label tuple, a lock
    and a lookup per call; these are attribute reads on the hot paths).

    Every process that knows a model counts what it ingests for it; the steps are counted only
    by the process that learns it (its owner): :meth:`learning` binds them, starting from the
    model's own (possibly restored) counts, so the sum over outcomes of ``opml_steps_total``
    equals ``opml_model_version``, and :meth:`not_learning` removes them when the model moves
    to another process. :meth:`forget` removes every series of the model (it was deleted).

    >>> m = ModelTelemetry("doctest-model")
    >>> m.learning({"passive": 2})
    >>> m.steps["passive"]._value.get()
    2.0
    >>> m.forget()
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: dict[str, Counter] = {}
        self.update_duration = UPDATE_DURATION.labels(name)
        self.gallery_refresh = {m: GALLERY_REFRESH.labels(name, m) for m in REFRESH_METHODS}
        self.checkpoint_duration = CHECKPOINT_DURATION.labels(name)
        self.checkpoints_fenced = CHECKPOINTS_FENCED.labels(name)
        self.replayed = REPLAYED.labels(name)
        self.backpressure_wait = BACKPRESSURE_WAIT.labels(name)
        self.events_dropped = EVENTS_DROPPED.labels(name)
        self.accepted = {t: SAMPLES_ACCEPTED.labels(name, t) for t in TRANSPORTS}
        self.replays = {t: IDEMPOTENT_REPLAYS.labels(name, t) for t in TRANSPORTS}
        self.records_dropped = IDEMPOTENCY_DROPPED.labels(name)
        self._rejected: dict[tuple[str, str], Counter] = {}
        self._verify: dict[tuple[bool, str], Counter] = {}

    def learning(self, counts: dict[str, int]) -> None:
        """This process learns the model from now on, whose steps so far are ``counts``."""
        self.not_learning()
        self.steps = {outcome: STEPS.labels(self.name, outcome) for outcome in OUTCOMES}
        self.count_steps(counts)

    def not_learning(self) -> None:
        """Another process learns the model: its step series are not ours to export."""
        for outcome in self.steps:
            STEPS.remove(self.name, outcome)
        self.steps = {}

    def count_steps(self, counts: dict[str, int]) -> None:
        """Add a batch's steps by outcome."""
        for outcome, n in counts.items():
            if n:
                self.steps[outcome].inc(n)

    def rejected(self, transport: str, reason: str, samples: int) -> None:
        """Count the samples of a refused request/frame (``reason``: the problem type)."""
        key = (transport, reason)
        child = self._rejected.get(key)
        if child is None:
            child = self._rejected[key] = SAMPLES_REJECTED.labels(self.name, transport, reason)
        child.inc(samples)

    def verify_decision(self, same: bool, source: str) -> None:
        """Count one verify answer."""
        key = (same, source)
        child = self._verify.get(key)
        if child is None:
            child = self._verify[key] = VERIFY_DECISIONS.labels(
                self.name, "same" if same else "different", source
            )
        child.inc()

    def forget(self) -> None:
        """Remove every labelled series of this model."""
        for family in _PER_MODEL:
            family.remove_by_labels({"model": self.name})


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
