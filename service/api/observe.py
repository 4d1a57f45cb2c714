"""What the API exposes for observation, besides the event telemetry of :mod:`service.telemetry`:

* :class:`ModelStateCollector` -- the per-model gauges (version, lag, classes, ``||L||_F``,
  hinge, accuracy, EER, threshold, the divergence monitor and the served step size (opml /
  copml; no sample for the gradient learners, whose ``health`` is null), checkpoint age,
  ownership, step mass, the latest periodic certificate's ``opml_certificate_*``),
  ``opml_model_info`` (value 1, labels ``model``, ``algorithm``, ``step``: join on ``model``
  to break any per-model series down by algorithm or step rule), read from each model's
  :class:`~service.engine.status.ModelStatus` when Prometheus scrapes: nothing is kept in sync,
  ages are computed with the service's own clock, and a deleted model simply stops appearing;
* :class:`HttpTelemetry` -- ASGI middleware for ``opml_http_request_duration_seconds`` (RED by
  method, route template and status).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import telemetry
from service.core.certificates import QUANTITIES, Bound
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
    "opml_stability_step_mass_max": "Largest per-sample step mass max_i S_i "
    "(docs/algorithms/gradient.md): a diagnostic of how much any one sample moved the metric, "
    "not a generalisation bound.",
}
#: Labels of ``opml_model_info`` besides ``model``.
_INFO_LABELS = ["algorithm", "step"]


def _health_gauges(health: dict[str, Any] | None) -> dict[str, float | None]:
    """The divergence monitor's gauges (all None, i.e. not exported, without a monitor)."""
    if health is None:
        return dict.fromkeys(_HEALTH)
    return {
        "opml_model_diverging": float(health["state"] == "diverging"),
        "opml_model_divergence_trips": health["times_tripped"],
        "opml_model_step_scale": health["step_scale"],
        "opml_model_shrunk_step_ratio": health["shrunk_rate"],
        "opml_metric_growth_log10": health["growth"],
    }


_HEALTH = (
    "opml_model_diverging",
    "opml_model_divergence_trips",
    "opml_model_step_scale",
    "opml_model_shrunk_step_ratio",
    "opml_metric_growth_log10",
)


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
        **_health_gauges(health),
        "opml_model_gamma": gamma if isinstance(gamma, float) else None,  # None: not opml
        "opml_checkpoint_seq": status.checkpoint_seq,
        "opml_checkpoint_age_seconds": max(0.0, now - saved_at),
        "opml_model_owner": float(status.owner),
        "opml_stability_step_mass_max": snap.stability.step_mass_max,
    }


#: The latest periodic certificate of a model (OPML_CERTIFICATE_EVERY), per quantity.
_CERTIFICATE_QUANTITY = {
    "opml_certificate_bound": "Certified upper bound on the rate (triplet_error, false_accept, "
    "false_reject) of the served metric, from the held-out reservoir (holds with probability "
    ">= 1 - opml_certificate_delta, all three together).",
    "opml_certificate_empirical": "Empirical rate on the held-out tuples of that certificate.",
    "opml_certificate_tuples": "Disjoint held-out tuples (m) that certificate counted.",
}
#: ... and per model.
_CERTIFICATE_MODEL = {
    "opml_certificate_version": "Version whose metric the latest periodic certificate covers.",
    "opml_certificate_delta": "delta of the latest periodic certificate.",
}
#: The certified operating point of a model configured with ``operating_point`` far / frr.
_OPERATING_POINT = {
    "opml_operating_point_threshold": "Threshold of the model's configured operating point "
    "(plain verify / identify decide with it).",
    "opml_operating_point_far_estimate": "False-accept rate on the held-out negative pairs at it.",
    "opml_operating_point_far_bound": "Certified upper bound on the false-accept rate at it "
    "(with probability >= 1 - delta, held-out samples).",
    "opml_operating_point_frr_estimate": "False-reject rate on the held-out positive pairs at it.",
    "opml_operating_point_frr_bound": "Certified upper bound on the false-reject rate at it.",
    "opml_operating_point_version": "Version whose metric the operating point certifies.",
    "opml_operating_point_certified": "1 while the configured target is certified, 0 when the "
    "held-out samples cannot certify it (verify then answers 409).",
}
_POINT_TARGET = "opml_operating_point_target"
_TARGET = "opml_certificate_false_accept_target"
_TARGET_HELP = (
    "OPML_CERTIFICATE_FALSE_ACCEPT_TARGET: the alert OpmlCertifiedFalseAcceptAboveTarget fires "
    'when a model\'s opml_certificate_bound{quantity="false_accept"} exceeds it.'
)


class ModelStateCollector(Collector):
    """Gauges of every live model, read from its status when Prometheus scrapes."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[ModelStatus]] = tuple
        self.false_accept_target: float | None = None

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        families = [GaugeMetricFamily(n, h, labels=["model"]) for n, h in _STATE.items()]
        families.append(GaugeMetricFamily("opml_models", "Models loaded in this process."))
        families += [
            GaugeMetricFamily(n, h, labels=["model", "quantity"])
            for n, h in _CERTIFICATE_QUANTITY.items()
        ]
        per_model = _CERTIFICATE_MODEL.items()
        families += [GaugeMetricFamily(n, h, labels=["model"]) for n, h in per_model]
        families.append(GaugeMetricFamily(_TARGET, _TARGET_HELP))
        families += [GaugeMetricFamily(n, h, labels=["model"]) for n, h in _OPERATING_POINT.items()]
        families.append(
            GaugeMetricFamily(
                _POINT_TARGET,
                "The model's configured target rate (rate: far or frr).",
                labels=["model", "rate"],
            )
        )
        families.append(
            GaugeMetricFamily(
                "opml_model_info",
                "1 for each model loaded here; its labels say how it learns (algorithm, and "
                "the step rule of sgd / sgd_psd / brm, empty for opml / copml).",
                labels=["model", *_INFO_LABELS],
            )
        )
        return families

    def collect(self) -> Iterator[Metric]:
        families = {f.name: f for f in self._families()}
        statuses = list(self.source())
        now = time.time()
        for status in statuses:
            for metric, value in gauges(status, now).items():
                if value is not None:
                    families[metric].add_metric([status.name], float(value))
            cert = status.certificate
            if cert is not None:
                for quantity in QUANTITIES:
                    bound: Bound = getattr(cert, quantity)
                    labels = [status.name, quantity]
                    families["opml_certificate_bound"].add_metric(labels, bound.bound)
                    families["opml_certificate_empirical"].add_metric(labels, bound.empirical)
                    families["opml_certificate_tuples"].add_metric(labels, bound.m)
                families["opml_certificate_version"].add_metric([status.name], cert.version or 0)
                families["opml_certificate_delta"].add_metric([status.name], cert.delta)
            self._operating_point(families, status)
            config = status.config
            families["opml_model_info"].add_metric(
                [status.name, config.algorithm, config.step or ""], 1.0
            )
        families["opml_models"].add_metric([], len(statuses))
        if self.false_accept_target is not None:
            families[_TARGET].add_metric([], self.false_accept_target)
        yield from families.values()

    @staticmethod
    def _operating_point(families: dict[str, GaugeMetricFamily], status: ModelStatus) -> None:
        configured = status.config.operating_point
        if not isinstance(configured, dict):
            return
        ((rate, target),) = configured.items()
        families[_POINT_TARGET].add_metric([status.name, rate], float(target))
        if status.certifiable is not None:
            certified = families["opml_operating_point_certified"]
            certified.add_metric([status.name], float(status.certifiable))
        point = status.operating_point
        if point is None:
            return
        for name, value in (
            ("opml_operating_point_threshold", point.threshold),
            ("opml_operating_point_far_estimate", point.far_estimate),
            ("opml_operating_point_far_bound", point.far_bound),
            ("opml_operating_point_frr_estimate", point.frr_estimate),
            ("opml_operating_point_frr_bound", point.frr_bound),
            ("opml_operating_point_version", point.version or 0),
        ):
            families[name].add_metric([status.name], float(value))


MODEL_STATE = ModelStateCollector()
REGISTRY.register(MODEL_STATE)


def watch(
    source: Callable[[], Iterable[ModelStatus]], false_accept_target: float | None = None
) -> None:
    """Scrapes read the model state from ``source`` (the statuses of the live models), and
    export ``false_accept_target`` (OPML_CERTIFICATE_FALSE_ACCEPT_TARGET) when set."""
    MODEL_STATE.source = source
    MODEL_STATE.false_accept_target = false_accept_target


def _route_template(scope: Scope) -> str:
    """The matched route's path template (bounded), also for answers given before routing."""
    route = scope.get("route")
    if route is None:
        for candidate in scope["app"].router.routes:
            if candidate.matches(scope)[0] != Match.NONE:
                route = candidate
                break
    return str(getattr(route, "path", "unmatched"))


class HttpTelemetry:
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
