"""The SDK against a live service (real Redis, HTTP and WebSocket): every call, sync and async."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from clients import (
    AsyncOPMLClient,
    Conflict,
    ConnectionFailed,
    FrameRejected,
    InvalidInput,
    NotFound,
    OPMLClient,
    Progress,
    RetryPolicy,
    Unavailable,
)
from service.core import COPML, OPML, Learner, LearnerConfig
from tests.clients.support import FAST_RETRY, CuttableProxy
from tests.service.support import ServiceProcess, core_learner, stream

HYPER = {"algorithm": "copml", "gamma": 0.01, "gamma_pair": 0.005, "margin": 1.0, "seed": 3}


def test_models_create_list_get_delete(client: OPMLClient, name: str) -> None:
    created = client.create_model(name, 5, algorithm="opml", gamma=0.02, normalize="l2", seed=9)
    assert (created.name, created.dim, created.algorithm) == (name, 5, "opml")
    assert (created.gamma, created.normalize, created.seed, created.version) == (0.02, "l2", 9, 0)
    assert name in [m.name for m in client.list_models()]
    assert client.get_model(name) == created
    with pytest.raises(Conflict) as conflict:
        client.create_model(name, 5)
    assert conflict.value.status == 409 and conflict.value.type and conflict.value.detail
    client.delete_model(name)
    with pytest.raises(NotFound) as missing:
        client.get_model(name)
    assert missing.value.status == 404 and name in missing.value.detail


def test_ingest_and_every_query_match_the_core(client: OPMLClient, name: str) -> None:
    X, y = stream(120, 4, 3, seed=1)
    client.create_model(name, 4, **HYPER)
    reference = core_learner(X, y, dim=4, **HYPER)
    steps = core_learner(X[:0], [], dim=4, **HYPER).learn_many(X[:100], y[:100])

    applied = client.ingest(name, X[:100], np.array(y[:100]), wait=True)
    assert (applied.accepted, applied.first_seq, applied.last_seq, applied.version) == (
        100,
        1,
        100,
        100,
    )
    assert applied.results is not None
    assert [r.outcome for r in applied.results] == [s.outcome for s in steps]
    logged = client.ingest(name, X[100:119], y[100:119])
    assert (logged.first_seq, logged.last_seq, logged.results) == (101, 119, None)
    one = client.ingest_one(name, X[119], y[119], wait=True)
    assert (one.first_seq, one.version) == (120, 120)

    L = client.metric(name, min_version=120)
    np.testing.assert_allclose(L, reference.L, rtol=0, atol=1e-12)
    snap = client.metric_snapshot(name)
    assert snap.version == 120
    np.testing.assert_array_equal(snap.L, L)
    d = client.distance(name, X[0], X[1])
    assert d.version == 120
    assert d.squared_distance == pytest.approx(reference.squared_distance(X[0], X[1]), abs=1e-12)
    assert d.distance == pytest.approx(np.sqrt(d.squared_distance))
    ds = client.distances(name, X[0], X[1:4])
    np.testing.assert_allclose(
        ds.squared_distances, reference.squared_distances(X[0], X[1:4]), atol=1e-12
    )
    verdict = client.verify(name, X[0], X[1], threshold=d.squared_distance)
    assert verdict.same and verdict.threshold == d.squared_distance
    assert not client.verify(name, X[0], X[1], threshold=d.squared_distance / 2).same
    np.testing.assert_allclose(
        client.transform(name, X[:5]).z, reference.transform(X[:5]), atol=1e-12
    )

    estimator = client.to_sklearn(name)
    assert isinstance(estimator, COPML) and estimator.gamma_pair == HYPER["gamma_pair"]
    np.testing.assert_array_equal(estimator.components_, L)
    np.testing.assert_allclose(estimator.transform(X[:5]), reference.transform(X[:5]), atol=1e-12)

    warm = np.diag([2.0, 1.0, 1.0, 0.5])
    assert client.put_metric(name, warm).name == name
    np.testing.assert_array_equal(client.metric(name), warm)


def test_bad_input_raises_the_problem_and_logs_nothing(client: OPMLClient, name: str) -> None:
    client.create_model(name, 3)
    with pytest.raises(InvalidInput) as bad:
        client.ingest(name, [[1.0, 2.0], [3.0, 4.0]], ["a", "b"])  # dim is 3
    assert bad.value.status == 422 and bad.value.errors
    assert client.get_model(name).samples_seen == 0
    with pytest.raises(ValueError, match="NaN"):
        client.ingest(name, [[1.0, np.nan, 3.0]], ["a"])  # refused before sending


def test_retried_ingest_with_same_key_logs_once(client: OPMLClient, name: str) -> None:
    client.create_model(name, 2)
    first = client.ingest(name, [[1.0, 0.0]], ["a"], idempotency_key="k-1")
    again = client.ingest(name, [[1.0, 0.0]], ["a"], idempotency_key="k-1")
    assert (again.first_seq, again.last_seq) == (first.first_seq, first.last_seq) == (1, 1)
    assert client.get_model(name).raw["logged_seq"] == 1


def test_503_is_retried_then_raised_with_retry_after(service: ServiceProcess, name: str) -> None:
    with OPMLClient(service.url, retry=RetryPolicy(attempts=1, max_delay_s=0.05)) as c:
        c.create_model(name, 2)
        with pytest.raises(Unavailable) as unavailable:
            c.distance(name, [0, 0], [1, 1], min_version=10**9)
    assert unavailable.value.status == 503 and unavailable.value.retry_after is not None


def test_unreachable_service_raises_connection_failed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        retry = RetryPolicy(attempts=2, base_delay_s=0.01)
        with (
            OPMLClient(f"http://127.0.0.1:{port}", retry=retry) as c,
            pytest.raises(ConnectionFailed),
        ):
            c.livez()


def test_operations(client: OPMLClient) -> None:
    assert client.livez()["status"] == "ok"
    assert client.readyz()["status"] == "ok"
    assert "# TYPE" in client.prometheus_metrics()
    assert "/v1/models" in client.openapi()["paths"]


def test_events_follow_the_model(client: OPMLClient, name: str) -> None:
    client.create_model(name, 2)
    client.ingest(name, [[0.0, 1.0], [1.0, 0.0], [0.0, 0.9]], ["a", "b", "a"], wait=True)
    event = next(client.events(name, interval_ms=20))
    assert (event.version, event.samples_seen, event.dropped) == (3, 3, 0)
    assert event.updates["triplet"] + event.updates["passive"] == 1


def test_stream_to_a_missing_model_raises_not_found(client: OPMLClient) -> None:
    with pytest.raises(NotFound), client.stream("no-such-model") as s:
        s.send([[0.0, 1.0]], ["a"])
        s.flush()


def test_stream_rejected_frame_names_its_id(client: OPMLClient, name: str) -> None:
    client.create_model(name, 2)
    classes = [f"c{i}" for i in range(21)]  # over the shared service's OPML_MAX_CLASSES=20
    with pytest.raises(FrameRejected) as rejected, client.stream(name) as s:
        s.send(np.ones((21, 2)), classes, frame_id="too-many-classes")
        s.flush()
    assert rejected.value.frame_id == "too-many-classes" and rejected.value.status == 422
    assert "too-many-classes" in str(rejected.value)
    assert client.get_model(name).raw["logged_seq"] == 0


@pytest.mark.parametrize("binary", [None, False])
def test_stream_refuses_a_wrong_width_before_sending(
    client: OPMLClient, name: str, binary: bool | None
) -> None:
    """Rows of the wrong width are a ValueError naming X and the model's dim, raised before
    anything is sent (not the service's 'block: expected ... bytes'); the stream goes on."""
    client.create_model(name, 3)
    with client.stream(name, binary=binary) as s:
        with pytest.raises(ValueError, match=rf"^X: has 4 columns, model {name} has dim 3$"):
            s.send(np.ones((256, 4)), ["a"] * 256)
        with pytest.raises(ValueError, match=rf"^x: has 2 values, model {name} has dim 3$"):
            s.send([1.0, 2.0], "a")
        assert (s.progress.sent_samples, s._window.pending) == (0, {})
        s.send(np.ones((2, 3)), ["a", "b"])
    assert s.progress.acked_samples == 2
    assert client.get_model(name).raw["logged_seq"] == 2


def test_resent_frame_ids_are_acknowledged_not_logged(client: OPMLClient, name: str) -> None:
    X, y = stream(200, 3, 2, seed=2)
    client.create_model(name, 3)
    for _ in range(2):
        with client.stream(name, window=4) as s:
            for lo in range(0, 200, 50):
                s.send(X[lo : lo + 50], y[lo : lo + 50], frame_id=f"{name}:{lo}")
    assert (s.progress.acked_samples, s.progress.replayed_samples) == (200, 200)
    assert s.progress.last_ack is not None and s.progress.last_ack.last_seq == 200
    client.metric(name, min_version=200)
    model = client.get_model(name)
    assert (model.samples_seen, model.raw["logged_seq"]) == (200, 200)


def _cut_at(
    proxy: CuttableProxy, acked_frames: set[int]
) -> tuple[list[int], Callable[[Progress], None]]:
    """An ``on_progress`` that cuts every proxied connection after those acked frame counts."""
    seen: list[int] = []

    def on_progress(p: Progress) -> None:
        seen.append(p.acked_samples)
        if p.acked_frames in acked_frames:
            proxy.cut()

    return seen, on_progress


def test_stream_cut_mid_way_applies_every_sample_once(
    client: OPMLClient, proxy: CuttableProxy, name: str
) -> None:
    X, y = stream(2000, 6, 4, seed=4)
    client.create_model(name, 6, **HYPER)
    seen, on_progress = _cut_at(proxy, {3, 17, 30})
    via_proxy = OPMLClient(proxy.url, retry=FAST_RETRY)
    with via_proxy, via_proxy.stream(name, window=8, on_progress=on_progress) as s:
        for lo in range(0, 2000, 40):
            s.send(X[lo : lo + 40], y[lo : lo + 40])
    assert proxy.cuts == 3 and s.progress.reconnects >= 3
    assert s.progress.acked_samples == 2000 and seen == sorted(seen)
    L = client.metric(name, min_version=2000)  # applied, not only logged
    model = client.get_model(name)
    assert (model.samples_seen, model.raw["logged_seq"]) == (2000, 2000)
    reference = core_learner(X, y, dim=6, **HYPER)
    np.testing.assert_allclose(L, reference.L, rtol=0, atol=1e-12)


def test_async_stream_cut_mid_way_applies_every_sample_once(
    client: OPMLClient, proxy: CuttableProxy, name: str
) -> None:
    X, y = stream(1500, 5, 3, seed=5)
    client.create_model(name, 5, **HYPER)
    _, on_progress = _cut_at(proxy, {2, 20})

    async def run() -> Progress:
        async with AsyncOPMLClient(proxy.url, retry=FAST_RETRY) as via_proxy:
            async with via_proxy.stream(name, window=6, on_progress=on_progress) as s:
                for lo in range(0, 1500, 30):
                    await s.send(X[lo : lo + 30], y[lo : lo + 30])
            return s.progress

    progress = asyncio.run(run())
    assert proxy.cuts == 2 and progress.reconnects >= 2 and progress.acked_samples == 1500
    L = client.metric(name, min_version=1500)  # applied, not only logged
    model = client.get_model(name)
    assert (model.samples_seen, model.raw["logged_seq"]) == (1500, 1500)
    reference = core_learner(X, y, dim=5, **HYPER)
    np.testing.assert_allclose(L, reference.L, rtol=0, atol=1e-12)


def test_async_client_every_call(service: ServiceProcess, name: str) -> None:
    X, y = stream(90, 3, 3, seed=6)
    reference = core_learner(X, y, dim=3, **HYPER)

    async def run() -> None:
        async with AsyncOPMLClient(service.url, retry=FAST_RETRY) as c:
            assert (await c.livez())["status"] == "ok"
            assert (await c.readyz())["status"] == "ok"
            assert "# TYPE" in await c.prometheus_metrics()
            assert "/v1/models" in (await c.openapi())["paths"]
            created = await c.create_model(name, 3, **HYPER)
            assert created == await c.get_model(name)
            assert name in [m.name for m in await c.list_models()]
            with pytest.raises(Conflict):
                await c.create_model(name, 3)
            assert (await c.ingest(name, X[:40], y[:40], wait=True)).version == 40
            assert (await c.ingest_one(name, X[40], y[40])).last_seq == 41
            async with c.stream(name, window=2) as s:
                for lo in range(41, 90, 7):
                    await s.send(X[lo : lo + 7], y[lo : lo + 7])
            assert s.progress.last_ack is not None and s.progress.last_ack.last_seq == 90
            L = await c.metric(name, min_version=90)
            np.testing.assert_allclose(L, reference.L, atol=1e-12)
            assert (await c.metric_snapshot(name)).version == 90
            d = await c.distance(name, X[0], X[1])
            assert d.squared_distance == pytest.approx(
                reference.squared_distance(X[0], X[1]), abs=1e-12
            )
            ds = await c.distances(name, X[0], X[:2])
            assert ds.distances[0] == 0.0 and ds.distances[1] == pytest.approx(d.distance)
            assert (await c.verify(name, X[0], X[0], threshold=0.0)).same
            z = (await c.transform(name, X[:3])).z
            np.testing.assert_allclose(z, reference.transform(X[:3]), atol=1e-12)
            estimator = await c.to_sklearn(name)
            np.testing.assert_array_equal(estimator.components_, L)
            async for event in c.events(name, interval_ms=20):
                assert event.samples_seen == 90
                break
            await c.put_metric(name, np.eye(3) * 2)
            np.testing.assert_array_equal(await c.metric(name), np.eye(3) * 2)
            await c.delete_model(name)
            with pytest.raises(NotFound):
                await c.get_model(name)

    asyncio.run(run())


def test_to_sklearn_of_an_opml_model(client: OPMLClient, name: str) -> None:
    client.create_model(name, 2, algorithm="opml", gamma=0.05, seed=1)
    assert type(client.to_sklearn(name)) is OPML


@pytest.mark.parametrize("binary", [None, False])
def test_stream_binary_by_default_and_json_on_request(
    client: OPMLClient, name: str, binary: bool | None
) -> None:
    X, y = stream(300, 4, 3, seed=7)
    client.create_model(name, 4, **HYPER)
    with client.stream(name, window=4, binary=binary) as s:
        assert s._window.use_binary is (binary is None)  # the service reads binary frames
        for lo in range(0, 300, 50):
            s.send(X[lo : lo + 50], y[lo : lo + 50], frame_id=f"f{lo}")
        s.send(X[0], y[0], frame_id="single")
    with client.stream(name, binary=not binary) as s:  # resend in the other encoding
        s.send(X[:50], y[:50], frame_id="f0")
    assert s.progress.replayed_samples == 50
    L = client.metric(name, min_version=301)
    reference = core_learner(np.vstack([X, X[:1]]), [*y, y[0]], dim=4, **HYPER)
    np.testing.assert_allclose(L, reference.L, rtol=0, atol=1e-12)


def test_binary_frame_goes_as_json_to_a_service_without_binary_frames() -> None:
    from clients import _wire

    window = _wire.Window(4, RetryPolicy(), None)
    window.connected("json, binary")
    frame = window.frame(np.array([[1.0, 0.5], [2.0, -1.0]]), ["a", 3], "f")
    assert isinstance(frame.text, bytes) and window.payload(frame) is frame.text
    window.connected(None)  # reconnected to an older service
    assert json.loads(window.payload(frame)) == {
        "id": "f", "samples": [{"x": [1.0, 0.5], "y": "a"}, {"x": [2.0, -1.0], "y": 3}]
    }  # fmt: skip
    with pytest.raises(ValueError, match="row 1 contains NaN"):
        _wire.Window(4, RetryPolicy(), None, binary=True).frame([[1, 2], [np.nan, 1]], [1, 2], 1)


def _content_types(client: OPMLClient | AsyncOPMLClient) -> list[str]:
    """Record the Content-Type of every request the client sends from now on."""
    seen: list[str] = []

    def hook(request: httpx.Request) -> None:
        seen.append(request.headers.get("content-type", ""))

    async def ahook(request: httpx.Request) -> None:
        hook(request)

    client._http.event_hooks["request"].append(  # type: ignore[arg-type]
        ahook if isinstance(client, AsyncOPMLClient) else hook
    )
    return seen


def test_a_numpy_gallery_goes_binary_and_equals_json(client: OPMLClient, name: str) -> None:
    d = 16
    X, y = stream(200, d, 4, seed=8)
    client.create_model(name, d, **HYPER)
    client.ingest(name, X, y, wait=True)
    reference = core_learner(X, y, dim=d, **HYPER)
    rng = np.random.default_rng(1)
    B = rng.normal(size=(300, d))  # 4,800 values: over BINARY_MATRIX_VALUES
    B[5] = X[0]
    sent = _content_types(client)
    binary = client.distances(name, X[0], B)
    assert sent == ["application/x-npz"]
    as_json = client.distances(name, X[0], B, binary=False)
    small = client.distances(name, X[0], B[:3])  # a small gallery stays JSON
    assert sent == ["application/x-npz", "application/json", "application/json"]
    assert isinstance(binary.distances, np.ndarray) and binary.distances.dtype == np.float64
    assert binary.version == as_json.version == 200 and binary.distances[5] == 0.0
    np.testing.assert_array_equal(binary.squared_distances, as_json.squared_distances)
    np.testing.assert_array_equal(binary.distances, as_json.distances)
    # 3 rows (< 4d) are mapped by L, 300 by its QR factor R: equal up to rounding
    np.testing.assert_allclose(small.squared_distances, as_json.squared_distances[:3], rtol=1e-12)
    np.testing.assert_allclose(
        binary.squared_distances, reference.squared_distances(X[0], B), rtol=1e-12
    )
    forced = client.distances(name, X[0].tolist(), B[:3].tolist(), binary=True)
    np.testing.assert_array_equal(forced.squared_distances, small.squared_distances)
    B32 = B.astype(np.float32)  # float32 goes as float32: the values it holds, exactly
    np.testing.assert_array_equal(
        client.distances(name, X[0], B32).squared_distances,
        client.distances(name, X[0], B32.astype(np.float64), binary=False).squared_distances,
    )
    with pytest.raises(ValueError, match="row 2"):
        client.distances(name, X[0], np.where(np.arange(300)[:, None] == 2, np.nan, B))
    with pytest.raises(InvalidInput) as wrong_dim:
        client.distances(name, X[0], rng.normal(size=(300, d + 1)))
    assert wrong_dim.value.status == 422


def test_async_numpy_gallery_goes_binary(service: ServiceProcess, name: str) -> None:
    X, y = stream(60, 8, 3, seed=2)

    async def run() -> None:
        async with AsyncOPMLClient(service.url, retry=FAST_RETRY) as c:
            await c.create_model(name, 8, **HYPER)
            await c.ingest(name, X, y, wait=True)
            B = np.random.default_rng(3).normal(size=(600, 8))
            sent = _content_types(c)
            binary = await c.distances(name, X[0], B)
            as_json = await c.distances(name, X[0], B, binary=False)
            assert sent == ["application/x-npz", "application/json"]
            assert binary.version == as_json.version == 60
            np.testing.assert_array_equal(binary.distances, as_json.distances)
            np.testing.assert_array_equal(binary.squared_distances, as_json.squared_distances)
            await c.delete_model(name)

    asyncio.run(run())


def test_stream_collects_acks_between_sends(client: OPMLClient, name: str) -> None:
    """``on_progress`` follows the service while frames are sent, not only once the window is
    full or on flush: each send collects the acks already received."""
    client.create_model(name, 2)
    with client.stream(name, window=64) as s:  # the window never fills below
        for k in range(1, 61):
            s.send([[float(k), 1.0]], [f"c{k % 3}"])
            if s.progress.acked_frames:
                break
            client.metric(name, min_version=k)  # frame k is logged and applied: its ack is out
        assert s.progress.acked_frames >= 1 and s.progress.pending_frames < k


def test_async_stream_collects_acks_between_sends(service: ServiceProcess, name: str) -> None:
    """The same for the asyncio stream (it used to read acks only when its window was full)."""

    async def run() -> tuple[int, int]:
        async with AsyncOPMLClient(service.url, retry=FAST_RETRY) as c:
            await c.create_model(name, 2)
            async with c.stream(name, window=64) as s:
                for k in range(1, 61):
                    await s.send([[float(k), 1.0]], [f"c{k % 3}"])
                    if s.progress.acked_frames:
                        break
                    await c.metric(name, min_version=k)
                return s.progress.acked_frames, k

    acked, sent = asyncio.run(run())
    assert acked >= 1 and sent < 60


def test_certificate_sync_and_async_equal_the_core(
    client: OPMLClient, service: ServiceProcess, name: str
) -> None:
    X, y = stream(900, 3, 3, seed=21)
    flags = np.arange(900) % 9 == 0  # a validation set of the caller's, besides the routed
    client.create_model(name, 3, gamma=0.01, seed=2, holdout=0.2, holdout_window=400)
    with pytest.raises(Conflict) as early:
        client.certificate(name)
    assert early.value.extra["needed"] > 0 and early.value.extra["have"] == 0
    client.ingest(name, X[:450], y[:450], holdout=flags[:450])
    applied = client.ingest(name, X[450:], y[450:], holdout=flags[450:], wait=True)
    assert applied.results is not None
    assert all(applied.results[i].outcome == "held_out" for i in np.flatnonzero(flags[450:]))
    reference = Learner(LearnerConfig(dim=3, gamma=0.01, seed=2, holdout=0.2, holdout_window=400))
    reference.learn_many(X, y, holdout=flags)
    want = reference.certificate(delta=0.1, threshold=3.0)
    got = client.certificate(name, delta=0.1, threshold=3.0, min_version=900)
    assert got.raw == json.loads(json.dumps(want.to_dict()))
    assert got.false_accept.bound == want.false_accept.bound and got.version == 900
    with pytest.raises(InvalidInput):
        client.certificate(name, delta=1.5)

    async def run() -> float:
        async with AsyncOPMLClient(service.url, retry=FAST_RETRY) as c:
            return (await c.certificate(name, method="kl")).triplet_error.bound

    kl = reference.certificate(method="kl").triplet_error.bound
    assert asyncio.run(run()) == kl


@pytest.mark.parametrize("binary", [True, False])
def test_stream_frames_carry_holdout_flags(client: OPMLClient, name: str, binary: bool) -> None:
    X, y = stream(300, 3, 3, seed=22)
    flags = np.arange(300) % 4 == 0
    client.create_model(name, 3, gamma=0.01, seed=5)
    with client.stream(name, binary=binary) as s:
        for lo in range(0, 290, 58):
            s.send(X[lo : lo + 58], y[lo : lo + 58], holdout=flags[lo : lo + 58])
        for i in range(290, 300):  # single-sample frames
            s.send(X[i], y[i], holdout=bool(flags[i]))
    reference = Learner(LearnerConfig(dim=3, gamma=0.01, seed=5))
    reference.learn_many(X, y, holdout=flags)
    np.testing.assert_array_equal(client.metric(name, min_version=300), reference.L)
    model = client.get_model(name)  # logged when the stream closed; applied now (min_version)
    assert model.updates["held_out"] == flags.sum() == reference.counts["held_out"]


@pytest.mark.parametrize(
    ("algorithm", "hyper", "estimator"),
    [
        ("sgd", {"eta": 0.003, "mu": 0.1, "step": "invsqrt", "lam": 0.01}, "SGD"),
        ("sgd_psd", {"eta": 0.01, "kappa": 0.3}, "SGDPSD"),
        ("brm", {"eta": 0.2, "margin": 0.2, "step": "constant"}, "BRM"),
    ],
)
def test_gradient_learners_hyperparameters_restricted_distances_and_to_sklearn(
    client: OPMLClient, name: str, algorithm: str, hyper: dict[str, Any], estimator: str
) -> None:
    X, y = stream(150, 3, 3, seed=6)
    created = client.create_model(name, 3, algorithm=algorithm, seed=2, **hyper)
    assert created.algorithm == algorithm and created.gamma is None
    assert {k: getattr(created, k) for k in hyper} == hyper
    client.ingest(name, X, y, wait=True)
    ref = core_learner(X, y, dim=3, algorithm=algorithm, seed=2, **hyper)
    model = client.get_model(name)
    assert model.stability == ref.stability().to_dict()
    assert model.updates["gradient"] == ref.counts["sgd_update"] > 0
    d = client.distance(name, X[0], X[1], restricted=True)
    assert d.restricted_squared_distance == ref.restricted_squared_distance(X[0], X[1])
    assert d.restricted_distance == ref.restricted_distance(X[0], X[1])
    for binary in (False, True):  # the restricted answer is JSON either way
        many = client.distances(name, X[0], X[1:4], restricted=True, binary=binary)
        assert many.restricted_squared_distances is not None
        np.testing.assert_array_equal(
            many.restricted_squared_distances, ref.restricted_squared_distances(X[0], X[1:4])
        )
    est = client.to_sklearn(name)
    assert type(est).__name__ == estimator
    np.testing.assert_array_equal(est.transform(X[:5]), ref.transform(X[:5]))
    assert est.get_params()["random_state"] == 2


def test_a_hyperparameter_the_algorithm_does_not_use_is_refused(
    client: OPMLClient, name: str
) -> None:
    with pytest.raises(InvalidInput) as bad:
        client.create_model(name, 3, algorithm="brm", mu=0.1)
    assert bad.value.errors[0]["loc"] == ["body", "mu"]
    with pytest.raises(NotFound):
        client.get_model(name)


def test_step_rules_gamma_auto_and_their_race(client: OPMLClient, name: str) -> None:
    paper = client.create_model(f"{name}-p", 3, step="paper", gamma=0.002)
    assert (paper.step, paper.gamma, paper.race) == ("paper", 0.002, None)
    assert paper.health is not None and paper.health["state"] == "ok"
    with pytest.raises(InvalidInput) as bad:
        client.create_model(f"{name}-x", 3, gamma=2.0)  # the scaled rule's gamma is in (0, 1]
    assert bad.value.errors[0]["loc"] == ["body", "gamma"]
    with pytest.raises(InvalidInput) as bad:  # one step field: its values by algorithm
        client.create_model(f"{name}-y", 3, algorithm="sgd", step="scaled")
    assert bad.value.errors[0]["loc"] == ["body", "step"]
    sgd = client.create_model(f"{name}-s", 3, algorithm="sgd")
    assert (sgd.step, sgd.gamma, sgd.health, sgd.race) == ("descent", None, None, None)
    X, y = stream(400, 3, 4, seed=6)
    config = {"gamma": "auto", "auto_warmup": 100, "seed": 2}
    auto = client.create_model(name, 3, gamma="auto", auto_warmup=100, seed=2)
    assert (auto.step, auto.gamma) == ("scaled", "auto")
    client.ingest(name, X, y)
    L = client.metric(name, min_version=400)
    model = client.get_model(name)
    reference = core_learner(X, y, dim=3, **config)
    assert model.race is not None and reference.race is not None
    assert model.race["serving"] == reference.race["serving"] is not None
    assert model.race["rounds"] == reference.race["rounds"] != []
    np.testing.assert_array_equal(L, reference.L)
    # offline, the estimator continues with the step size the race serves
    estimator = client.to_sklearn(name)
    assert (estimator.step, estimator.gamma) == ("scaled", model.race["serving"])
    np.testing.assert_array_equal(estimator.components_, L)


def test_rehearsal_is_model_config_and_learns_as_the_core_does(
    client: OPMLClient, name: str
) -> None:
    X, y = stream(300, 3, 4, seed=8)
    model = client.create_model(name, 3, rehearsal=3, rehearsal_memory=40, seed=4)
    assert (model.raw["rehearsal"], model.raw["rehearsal_memory"]) == (3, 40)
    client.ingest(name, X, y)
    L = client.metric(name, min_version=300)
    np.testing.assert_array_equal(
        L, core_learner(X, y, dim=3, rehearsal=3, rehearsal_memory=40, seed=4).L
    )
    estimator = client.to_sklearn(name)  # offline it keeps rehearsing
    assert (estimator.rehearsal, estimator.rehearsal_memory) == (3, 40)
    with pytest.raises(InvalidInput) as bad:
        client.create_model(f"{name}-s", 3, algorithm="sgd", rehearsal=1)
    assert bad.value.errors[0]["loc"] == ["body", "rehearsal"]
