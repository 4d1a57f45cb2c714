"""Prometheus metrics of the service, all defined here (``GET /metrics`` renders them).

Names follow Prometheus conventions: ``opml_`` prefix, base units (``_seconds``, ``_ratio``),
``_total`` for counters, histograms for latencies. Labels are bounded: ``model`` (at most
``OPML_MAX_MODELS``), ``transport`` (``rest``, ``ws``), ``outcome``, ``reason``, ``result``,
``route`` (the route *template*, e.g. ``/v1/models/{name}/samples``), never a class label or
a client id.

Two kinds of series:

* **Events** (counters and histograms) are incremented where they happen: ingestion, learner
  batches, checkpoints, verify answers, Redis failures, WebSocket frames, HTTP requests.
* **State** (gauges of each model: version, lag, classes, ``||L||_F``, hinge, accuracy, EER,
  threshold, checkpoint age, ...) is read at scrape time from the live models by
  :class:`ModelStateCollector`. Nothing has to be kept in sync, ages are computed with the
  service's own clock when Prometheus asks, and a deleted model simply stops appearing.

The service runs one process per instance (the learner is the single writer of each model and
its state lives in that process), so the default in-process registry is exact; prometheus-client's
multiprocess mode is neither needed nor wanted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.learner import OUTCOMES

if TYPE_CHECKING:
    from service.models.runtime import ModelRuntime

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
WS_FRAME_DURATION = Histogram(
    "opml_ws_frame_duration_seconds",
    "WebSocket ingestion frame latency, from receipt to its ack or error frame, by outcome.",
    ["outcome"],
    buckets=_FAST_BUCKETS,
)
WS_CONNECTIONS = Gauge(
    "opml_websocket_connections", "Open WebSocket connections by endpoint.", ["endpoint"]
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
    "Checkpoints Redis refused because a newer fencing token was granted (this process had "
    "lost the model's lease; another process owns it).",
    ["model"],
)
REDIS_ERRORS = Counter(
    "opml_redis_errors_total",
    "Failed Redis calls by component (api: HTTP requests, ws: stream frames, writer: log "
    "reads and checkpoints, loader: start-up loading, readyz).",
    ["component"],
)
REDIS_COMPONENTS = ("api", "ws", "writer", "loader", "readyz")
for _component in REDIS_COMPONENTS:  # known label values start at 0 (increase() works at once)
    REDIS_ERRORS.labels(_component)
for _endpoint in ("stream", "events"):
    WS_CONNECTIONS.labels(_endpoint)

_PER_MODEL = (
    SAMPLES_ACCEPTED,
    SAMPLES_REJECTED,
    IDEMPOTENT_REPLAYS,
    BACKPRESSURE_WAIT,
    EVENTS_DROPPED,
    STEPS,
    UPDATE_DURATION,
    VERIFY_DECISIONS,
    CHECKPOINT_DURATION,
    CHECKPOINTS_FENCED,
    REPLAYED,
)


def model_started(name: str, counts: dict[str, int]) -> None:
    """Create a model's step series, starting from its own (possibly restored) counts."""
    for outcome in OUTCOMES:
        STEPS.labels(name, outcome).inc(counts.get(outcome, 0))


def forget_model(name: str) -> None:
    """Remove every labelled series of a deleted model."""
    for metric in _PER_MODEL:
        metric.remove_by_labels({"model": name})
    for key in [k for k in _VERIFY_CHILDREN if k[0] == name]:
        del _VERIFY_CHILDREN[key]


#: ``VERIFY_DECISIONS`` children by (model, same, source): ``.labels()`` (label tuple, lock,
#: lookup) costs microseconds on the hottest query; a dict hit does not.
_VERIFY_CHILDREN: dict[tuple[str, bool, str], Counter] = {}


def verify_decision(name: str, same: bool, source: str) -> None:
    """Count one verify answer."""
    key = (name, same, source)
    child = _VERIFY_CHILDREN.get(key)
    if child is None:
        child = _VERIFY_CHILDREN[key] = VERIFY_DECISIONS.labels(
            name, "same" if same else "different", source
        )
    child.inc()


# -- model state, read at scrape time -------------------------------------------------------

_STATE = {
    "opml_model_version": "Seq of the last sample applied (the version queries answer with).",
    "opml_logged_seq": "Seq of the last sample acknowledged (durably in the log).",
    "opml_ingest_lag": "Samples acknowledged but not yet applied (logged_seq - version).",
    "opml_log_entries": "Samples in the Redis log not yet covered by a checkpoint (the log is "
    "trimmed behind each checkpoint; metric replacements not counted).",
    "opml_classes": "Classes seen (rows of the buffer H).",
    "opml_metric_frobenius_norm": "||L||_F of the published metric (scale-drift signal; "
    "sqrt(d) for the identity).",
    "opml_hinge_loss": "Mean hinge loss max(0, margin + d_pos - d_neg) (Eq. 4) of the "
    "triplets in the calibration window (measured before each update).",
    "opml_triplet_accuracy_ratio": "Prequential triplet accuracy of the calibration window "
    "(share of triplets with d_pos < d_neg, measured before the update).",
    "opml_verification_eer_ratio": "Equal error rate of the calibration window at the "
    "calibrated threshold.",
    "opml_verification_threshold": "Calibrated verification threshold (squared distance).",
    "opml_verification_calibrated": "1 once the window holds enough pairs to calibrate.",
    "opml_verification_window_pairs": "Triplet (positive, negative) pairs in the window.",
    "opml_checkpoint_seq": "Last seq included in the latest checkpoint.",
    "opml_model_owner": "1 while this process holds the model's lease (applies and "
    "checkpoints it), 0 while it follows the log as a read replica.",
    "opml_checkpoint_age_seconds": "Seconds since the latest checkpoint was written (since "
    "the model was created if it has none), computed at scrape time.",
}


class ModelStateCollector(Collector):
    """Gauges of every live model, read from its latest snapshot when Prometheus scrapes."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[ModelRuntime]] = tuple

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        families = [GaugeMetricFamily(n, h, labels=["model"]) for n, h in _STATE.items()]
        families.append(GaugeMetricFamily("opml_models", "Models loaded in this process."))
        return families

    def collect(self) -> Iterator[Metric]:
        families = {f.name: f for f in self._families()}
        runtimes = list(self.source())
        now = time.time()
        for rt in runtimes:
            snap = rt.snapshot
            cal = snap.calibration
            logged = max(rt.logged_seq, snap.version)
            saved_at = rt.checkpoint.at if rt.checkpoint.at is not None else rt.created_at
            values: dict[str, float | None] = {
                "opml_model_version": snap.version,
                "opml_logged_seq": logged,
                "opml_ingest_lag": logged - snap.version,
                "opml_log_entries": logged - rt.checkpoint.seq,
                "opml_classes": snap.classes,
                "opml_metric_frobenius_norm": snap.frobenius_norm,
                "opml_hinge_loss": snap.hinge_loss,
                "opml_triplet_accuracy_ratio": cal.accuracy,
                "opml_verification_eer_ratio": cal.eer,
                "opml_verification_threshold": cal.threshold,
                "opml_verification_calibrated": float(cal.calibrated),
                "opml_verification_window_pairs": cal.pairs,
                "opml_checkpoint_seq": rt.checkpoint.seq,
                "opml_checkpoint_age_seconds": max(0.0, now - saved_at),
                "opml_model_owner": float(rt.owner),
            }
            for metric, value in values.items():
                if value is not None:  # no value yet (e.g. no triplet so far): no sample
                    families[metric].add_metric([rt.name], float(value))
        families["opml_models"].add_metric([], len(runtimes))
        yield from families.values()


MODEL_STATE = ModelStateCollector()
REGISTRY.register(MODEL_STATE)


def watch_models(source: Callable[[], Iterable[ModelRuntime]]) -> None:
    """Scrapes read the model state from ``source`` (the service's live runtimes)."""
    MODEL_STATE.source = source


# -- HTTP RED ----------------------------------------------------------------------------------


def _route_template(scope: Scope) -> str:
    """The matched route's path template (bounded), also for answers given before routing."""
    route = scope.get("route")
    if route is None:
        for candidate in scope["app"].router.routes:
            if candidate.matches(scope)[0] != Match.NONE:
                route = candidate
                break
    return str(getattr(route, "path", "unmatched"))


class HttpMetrics:
    """ASGI middleware: ``opml_http_request_duration_seconds`` by method, route, status.

    The histogram children are kept by (method, route template, status): a bounded set (the
    routes are fixed), and a dict hit instead of ``.labels()`` on every request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._children: dict[tuple[str, str, int], Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception escaping the app becomes a 500 further out

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            key = (scope["method"], _route_template(scope), int(status))
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = HTTP_DURATION.labels(key[0], key[1], str(key[2]))
            child.observe(time.perf_counter() - start)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
