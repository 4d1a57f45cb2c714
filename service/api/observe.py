"""What the API exposes for observation, besides the event metrics of :mod:`service.telemetry`:

* :class:`ModelStateCollector` -- the per-model gauges (version, lag, classes, ``||L||_F``,
  hinge, accuracy, EER, threshold, the divergence monitor and the served step size, checkpoint
  age, ownership), read from each model's
  :class:`~service.engine.status.ModelStatus` when Prometheus scrapes: nothing is kept in sync,
  ages are computed with the service's own clock, and a deleted model simply stops appearing;
* :class:`HttpMetrics` -- ASGI middleware for ``opml_http_request_duration_seconds`` (RED by
  method, route template and status).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import telemetry
from service.engine.status import ModelStatus

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
    "opml_model_diverging": "1 while the divergence monitor of the served metric is in state "
    "diverging (it tripped within the last 100 steps: too many shrunk steps or ||L||_F grew "
    "10x within 100 updates), else 0.",
    "opml_model_divergence_trips": "Times the divergence monitor tripped since the model was "
    "created (each trip cut the step size; kept across restarts).",
    "opml_model_step_scale": "Factor the divergence monitor's trips left on the step sizes "
    "(1: never tripped).",
    "opml_model_shrunk_step_ratio": "Running share of recent triplet updates that needed the "
    "shrink guard (0 in the paper's regime).",
    "opml_metric_growth_log10": "log10(||L||_F / ||L_0||_F): growth of the metric against the "
    "one the model started from (the identity, or the last PUT metric).",
    "opml_model_gamma": "Triplet step size the served metric runs with, in its step rule's "
    'units (gamma "auto": the raced step serving now, absent before the first sample; '
    "step_scale not applied).",
    "opml_checkpoint_seq": "Last seq included in the latest checkpoint.",
    "opml_model_owner": "1 on the process that owns (learns and checkpoints) the model; the "
    "other processes export no state gauges for it.",
    "opml_checkpoint_age_seconds": "Seconds since the latest checkpoint was written (since "
    "the model was created if it has none), computed at scrape time.",
}


def gauges(status: ModelStatus, now: float) -> dict[str, float | None]:
    """The per-model gauges of one status (None: no value yet, no sample exported)."""
    snap = status.snapshot
    cal = snap.calibration
    health = snap.health
    gamma = status.config.gamma if snap.race is None else snap.race.get("serving")
    saved_at = status.checkpoint_at if status.checkpoint_at is not None else status.created_at
    return {
        "opml_model_version": snap.version,
        "opml_logged_seq": status.logged_seq,
        "opml_ingest_lag": status.lag,
        "opml_log_entries": status.logged_seq - status.checkpoint_seq,
        "opml_classes": snap.classes,
        "opml_metric_frobenius_norm": snap.frobenius_norm,
        "opml_hinge_loss": snap.hinge_loss,
        "opml_triplet_accuracy_ratio": cal.accuracy,
        "opml_verification_eer_ratio": cal.eer,
        "opml_verification_threshold": cal.threshold,
        "opml_verification_calibrated": float(cal.calibrated),
        "opml_verification_window_pairs": cal.pairs,
        "opml_model_diverging": float(health["state"] == "diverging"),
        "opml_model_divergence_trips": health["times_tripped"],
        "opml_model_step_scale": health["step_scale"],
        "opml_model_shrunk_step_ratio": health["shrunk_rate"],
        "opml_metric_growth_log10": health["growth"],
        "opml_model_gamma": gamma,
        "opml_checkpoint_seq": status.checkpoint_seq,
        "opml_checkpoint_age_seconds": max(0.0, now - saved_at),
        "opml_model_owner": float(status.owner),
    }


class ModelStateCollector(Collector):
    """Gauges of every live model, read from its status when Prometheus scrapes."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[ModelStatus]] = tuple

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        families = [GaugeMetricFamily(n, h, labels=["model"]) for n, h in _STATE.items()]
        families.append(GaugeMetricFamily("opml_models", "Models loaded in this process."))
        return families

    def collect(self) -> Iterator[Metric]:
        families = {f.name: f for f in self._families()}
        statuses = list(self.source())
        now = time.time()
        for status in statuses:
            for metric, value in gauges(status, now).items():
                if value is not None:
                    families[metric].add_metric([status.name], float(value))
        families["opml_models"].add_metric([], len(statuses))
        yield from families.values()


MODEL_STATE = ModelStateCollector()
REGISTRY.register(MODEL_STATE)


def watch(source: Callable[[], Iterable[ModelStatus]]) -> None:
    """Scrapes read the model state from ``source`` (the statuses of the live models)."""
    MODEL_STATE.source = source


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
                child = self._children[key] = telemetry.HTTP_DURATION.labels(*key[:2], str(key[2]))
            child.observe(time.perf_counter() - start)
