"""GET /metrics after a real workload: every series the dashboard and the alerts use exists, and
the numbers are the workload's (samples sent, the core learner's steps, hinge, accuracy, EER)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from tests.service.support import (
    Launch,
    RedisServer,
    ServiceProcess,
    alert_exprs,
    core_learner,
    dashboard_exprs,
    exported_names,
    make_model,
    promql_metric_names,
    scrape,
    series,
    stream,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

MODEL = "metrics-workload"
CONFIG = {"dim": 4, "gamma": 0.05, "seed": 1}
SAMPLES_ROUTE = "/v1/models/{name}/samples"
#: Series Prometheus itself makes for every target (not exported by the service).
SYNTHETIC = {"up"}


@dataclass
class Workload:
    X: np.ndarray
    y: list[str]
    before: Samples
    after: Samples
    during: Samples  # scraped while a /stream and an /events connection were open
    exposition: str


def one(samples: Samples, name: str, **labels: str) -> float:
    found = series(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(series(samples, name, **labels).values())


@pytest.fixture(scope="module")
def workload(service: ServiceProcess) -> Workload:
    """REST and WebSocket ingestion (with rejections and a resend), queries and verifies."""
    X, y = stream(120, 4, 3, seed=11)
    with service.client() as api:
        before = scrape(api)
        make_model(api, MODEL, **CONFIG)
        for k in range(0, 60, 10):  # 6 REST requests of 10 samples
            body = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 10)]}
            assert api.post(f"/v1/models/{MODEL}/samples", json=body).status_code == 202
        bad = api.post(f"/v1/models/{MODEL}/samples", json={"x": [1, 2, 3], "y": "a"})
        assert bad.status_code == 422
        with (
            connect(f"{service.ws_url}/v1/models/{MODEL}/stream") as ws,
            connect(f"{service.ws_url}/v1/models/{MODEL}/events?interval_ms=10") as events,
        ):
            rows = [{"x": X[i].tolist(), "y": y[i]} for i in range(120)]
            frames = [{"id": f"f{k}", "samples": rows[k : k + 10]} for k in range(60, 120, 10)]
            for frame in [*frames, frames[0]]:  # the last one is a resend: acked, not logged
                ws.send(json.dumps(frame))
            ws.send(json.dumps({"id": "bad", "samples": [{"x": [0, 0, 0, 1], "y": "a"},
                                                         {"x": [1], "y": "a"}]}))  # fmt: skip
            answers = [json.loads(ws.recv(timeout=30)) for _ in range(8)]
            assert [a.get("ack") for a in answers[:7]] == [f"f{k}" for k in range(60, 120, 10)] + [
                "f60"
            ]
            assert answers[7]["id"] == "bad" and "error" in answers[7]
            events.recv(timeout=30)
            during = scrape(api)
        q = api.post(f"/v1/models/{MODEL}/distance", params={"min_version": 120},
                     json={"a": X[0].tolist(), "b": X[1].tolist()})  # fmt: skip
        assert q.json()["version"] == 120
        a, b = X[0].tolist(), X[5].tolist()
        for threshold in (1e9, 1e9, 1e9, 0.0, 0.0):
            api.post(f"/v1/models/{MODEL}/verify", json={"a": a, "b": b, "threshold": threshold})
        api.post(f"/v1/models/{MODEL}/verify", json={"a": a, "b": b})
        after = scrape(api)
        exposition = api.get("/metrics").text
    return Workload(X, y, before, after, during, exposition)


def test_promql_name_extraction_finds_selected_metrics_only() -> None:
    expr = (
        'sum by (le, model) (rate(a_bucket{model=~"$model", x="b_total"}[$__rate_interval]))'
        " / on(model) group_left b offset 1h > 1e6 and c == bool 2 unless d:rule:sum"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b", "c", "d:rule:sum"}


def test_every_metric_of_the_dashboard_and_the_alerts_is_exported(workload: Workload) -> None:
    used = {name for expr in dashboard_exprs() for name in promql_metric_names(expr)}
    used |= {name for expr in alert_exprs().values() for name in promql_metric_names(expr)}
    assert len(used) >= 25  # the extraction found the dashboard's metrics, not nothing
    assert sorted(used - SYNTHETIC - exported_names(workload.exposition)) == []


def test_ingestion_counts_are_the_samples_sent(workload: Workload) -> None:
    after = workload.after
    accepted = "opml_samples_accepted_total"
    assert one(after, accepted, model=MODEL, transport="rest") == 60
    assert one(after, accepted, model=MODEL, transport="ws") == 60  # the resend is not counted
    assert one(after, "opml_idempotent_replays_total", model=MODEL, transport="ws") == 1
    rejected = "opml_samples_rejected_total"
    assert one(after, rejected, model=MODEL, transport="rest", reason="validation") == 1
    assert one(after, rejected, model=MODEL, transport="ws", reason="validation") == 2
    assert one(after, "opml_logged_seq", model=MODEL) == 120
    assert one(after, "opml_ingest_lag", model=MODEL) == 0


def test_request_and_frame_latencies_are_counted_per_route_template(workload: Workload) -> None:
    def delta(name: str, **labels: str) -> float:
        return total(workload.after, name, **labels) - total(workload.before, name, **labels)

    http = "opml_http_request_duration_seconds_count"
    assert delta(http, method="POST", route=SAMPLES_ROUTE, status="202") == 6
    assert delta(http, method="POST", route=SAMPLES_ROUTE, status="422") == 1
    assert delta(http, method="POST", route="/v1/models/{name}/verify", status="200") == 6
    frames = "opml_ws_frame_duration_seconds_count"
    assert delta(frames, outcome="ack") == 7 and delta(frames, outcome="error") == 1
    routes = {dict(lab)["route"] for (n, lab) in workload.after if n == http}
    assert not any(MODEL in route for route in routes)  # templates, never raw paths


def test_open_websocket_connections_are_counted(workload: Workload) -> None:
    during = workload.during
    assert one(during, "opml_websocket_connections", endpoint="stream") >= 1
    assert one(during, "opml_websocket_connections", endpoint="events") >= 1


def test_learning_metrics_equal_the_core_learner(workload: Workload) -> None:
    after = workload.after
    ref = core_learner(workload.X, workload.y, **CONFIG)
    steps = series(after, "opml_steps_total", model=MODEL)
    assert {dict(lab)["outcome"]: v for lab, v in steps.items()} == ref.counts
    assert sum(steps.values()) == one(after, "opml_model_version", model=MODEL) == 120
    assert one(after, "opml_classes", model=MODEL) == 3
    assert one(after, "opml_metric_frobenius_norm", model=MODEL) == pytest.approx(
        float(np.linalg.norm(ref.L)), rel=1e-12
    )
    window, _ = ref.calibrator.to_state()
    # Eq. 4 at the margin in input units (step "scaled": margin 1 times the stream's scale)
    hinge = np.maximum(ref.margin + window[:, 0] - window[:, 1], 0.0).mean()
    assert one(after, "opml_hinge_loss", model=MODEL) == pytest.approx(hinge, rel=1e-12)
    health = ref.health
    assert one(after, "opml_model_divergence_trips", model=MODEL) == health["times_tripped"] == 0
    assert one(after, "opml_model_diverging", model=MODEL) == 0
    assert one(after, "opml_model_step_scale", model=MODEL) == health["step_scale"] == 1
    assert one(after, "opml_model_shrunk_step_ratio", model=MODEL) == health["shrunk_rate"]
    assert one(after, "opml_metric_growth_log10", model=MODEL) == health["growth"]
    assert one(after, "opml_model_gamma", model=MODEL) == CONFIG["gamma"]
    cal = ref.calibrator.calibration()
    assert cal.calibrated and cal.pairs > 0
    assert one(after, "opml_triplet_accuracy_ratio", model=MODEL) == cal.accuracy
    assert one(after, "opml_verification_eer_ratio", model=MODEL) == cal.eer
    assert one(after, "opml_verification_threshold", model=MODEL) == cal.threshold
    assert one(after, "opml_verification_calibrated", model=MODEL) == 1
    assert one(after, "opml_verification_window_pairs", model=MODEL) == cal.pairs
    assert one(after, "opml_update_duration_seconds_count", model=MODEL) >= 1


def test_verify_decisions_are_counted_by_result_and_source(workload: Workload) -> None:
    decisions = "opml_verify_decisions_total"
    after = workload.after
    assert one(after, decisions, model=MODEL, result="same", source="caller") == 3
    assert one(after, decisions, model=MODEL, result="different", source="caller") == 2
    assert total(after, decisions, model=MODEL, source="calibrated") == 1


def test_checkpoint_metrics_follow_the_checkpoints(
    workload: Workload, service: ServiceProcess
) -> None:
    with service.client() as api:
        deadline = time.monotonic() + 20
        # OPML_CHECKPOINT_EVERY=64: one is written right after the batch that passes 64 samples
        while (now := scrape(api)) and one(now, "opml_checkpoint_seq", model=MODEL) < 64:
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.1)
    ckpt = one(now, "opml_checkpoint_seq", model=MODEL)
    assert one(now, "opml_log_entries", model=MODEL) == 120 - ckpt
    assert one(now, "opml_checkpoint_duration_seconds_count", model=MODEL) >= 1
    assert one(now, "opml_checkpoint_age_seconds", model=MODEL) >= 0


def test_deleting_a_model_removes_its_series(api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    api.post(f"/v1/models/{name}/samples?wait=true",
             json={"samples": [{"x": [0, 1], "y": "a"}, {"x": [1, 0], "y": "b"}]})  # fmt: skip
    api.post(f"/v1/models/{name}/verify", json={"a": [0, 1], "b": [1, 0]})
    assert f'model="{name}"' in api.get("/metrics").text
    assert api.delete(f"/v1/models/{name}").status_code == 204
    assert f'model="{name}"' not in api.get("/metrics").text


def test_replayed_samples_and_step_counts_survive_a_crash(tmp_path: Path, launch: Launch) -> None:
    redis_server = RedisServer(tmp_path / "redis").start()
    X, y = stream(40, 3, 2, seed=5)
    svc = launch(tmp_path, redis_server.url, OPML_CHECKPOINT_EVERY="25",
                 OPML_CHECKPOINT_INTERVAL_S="3600").start()  # fmt: skip
    try:
        with svc.client() as api:
            make_model(api, "m", 3)
            for lo, hi in ((0, 30), (30, 40)):  # a checkpoint after 25+ samples, then 10 more
                body = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(lo, hi)]}
                api.post("/v1/models/m/samples?wait=true", json=body)
                deadline = time.monotonic() + 20
                while api.get("/v1/models/m").json()["checkpoint"]["seq"] == 0:
                    assert time.monotonic() < deadline, "no checkpoint written"
                    time.sleep(0.1)
        svc.kill()  # no final checkpoint: the tail after the checkpoint is replayed
        svc.start()
        with svc.client() as api:
            ckpt = api.get("/v1/models/m").json()["checkpoint"]["seq"]
            after = scrape(api)
    finally:
        svc.stop()
        redis_server.stop()
    assert 0 < ckpt < 40
    assert one(after, "opml_replayed_samples_total", model="m") == 40 - ckpt
    steps = series(after, "opml_steps_total", model="m")
    assert {dict(lab)["outcome"]: v for lab, v in steps.items()} == core_learner(
        X, y, dim=3
    ).counts  # restored from the checkpoint, then the replay: the model's own counts
    assert one(after, "opml_model_version", model="m") == 40
