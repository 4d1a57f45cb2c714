"""WS /stream (acks, errors, resends) and WS /events (push)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.service.support import (
    SHARED_ENV,
    Launch,
    ServiceProcess,
    assert_problem,
    core_learner,
    make_model,
    scrape,
    series,
    stream,
)


def test_stream_acks_in_frame_order_and_equals_the_core(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    X, y = stream(300, 4, 3, seed=4)
    make_model(api, name, 4, gamma=0.05)
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for k in range(0, 300, 10):  # pipelined: send everything, then read
            samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 10)]
            ws.send(json.dumps({"id": f"f{k}", "samples": samples}))
        ws.send(json.dumps({"id": 999, "x": [1, 2, 3, 4], "y": "single"}))
        acks = [json.loads(ws.recv(timeout=30)) for _ in range(31)]
    assert [a["ack"] for a in acks] == [f"f{k}" for k in range(0, 300, 10)] + [999]
    assert [(a["first_seq"], a["last_seq"]) for a in acks[:-1]] == [
        (k + 1, k + 10) for k in range(0, 300, 10)
    ]
    assert (acks[-1]["first_seq"], acks[-1]["last_seq"]) == (301, 301)
    ref = core_learner(np.vstack([X, [[1, 2, 3, 4]]]), [*y, "single"], dim=4, gamma=0.05)
    got = api.get(f"/v1/models/{name}/metric", params={"min_version": 301}).json()
    np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)


def test_every_acknowledged_frame_is_counted_once_its_acks_are_read(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    """Frames in flight are counted together: after the last ack, all of them are counted
    (more frames than one count covers, with a replay and an error among them)."""
    make_model(api, name, 2)
    frames = [json.dumps({"id": k, "x": [k, 1], "y": k % 3}) for k in range(150)]
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for k, frame in enumerate(frames):
            ws.send(frame)
            if k == 100:
                ws.send(frames[0])  # a resend: replayed, not counted again
                ws.send(json.dumps({"id": "bad", "x": [1], "y": 1}))
        answers = [json.loads(ws.recv(timeout=30)) for _ in range(152)]
        assert sum("ack" in a for a in answers) == 151
        counts = scrape(api)
    labels = {"model": name, "transport": "ws"}
    assert sum(series(counts, "opml_samples_accepted_total", **labels).values()) == 150
    assert sum(series(counts, "opml_idempotent_replays_total", **labels).values()) == 1


def test_bad_frames_get_error_frames_and_the_connection_survives(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        ws.send("{not json")
        ws.send(json.dumps({"x": [1, 2], "y": "a"}))  # no id
        ws.send(json.dumps({"id": "wrong-dim", "x": [1, 2, 3], "y": "a"}))
        ws.send(json.dumps({"id": "nan", "samples": [{"x": [1, 2], "y": "a"}, {"x": [1], "y": 1}]}))
        ws.send(json.dumps({"id": "ok", "x": [1, 2], "y": "a"}))
        frames = [json.loads(ws.recv(timeout=10)) for _ in range(5)]
    for frame in frames[:4]:
        assert frame["error"]["status"] == 422 and frame["error"]["detail"]
        assert frame["error"]["errors"], frame  # every refusal says where
    assert [f.get("id") for f in frames[:4]] == [None, None, "wrong-dim", "nan"]
    assert frames[1]["error"]["errors"] == [
        {"loc": ["id"], "msg": "a frame needs an id", "type": "value_error"}
    ]
    assert frames[4] == {"ack": "ok", "first_seq": 1, "last_seq": 1}


def test_a_resent_frame_id_is_acked_with_its_original_seqs(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    frame = {"id": "batch-1", "samples": [{"x": [1, 2], "y": "a"}, {"x": [2, 2], "y": "b"}]}
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        ws.send(json.dumps(frame))
        first = json.loads(ws.recv(timeout=10))
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:  # reconnect, resend
        ws.send(json.dumps(frame))
        again = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({**frame, "samples": frame["samples"][:1]}))
        conflict = json.loads(ws.recv(timeout=10))
    assert first == {"ack": "batch-1", "first_seq": 1, "last_seq": 2}
    assert again == {**first, "replayed": True}
    assert conflict["error"]["status"] == 409 and conflict["id"] == "batch-1"
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 2


def closed_with(ws: ClientConnection) -> int | None:
    """The close code the server sent, once the connection has ended (its next frame)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    return None if closed.value.rcvd is None else closed.value.rcvd.code


def test_stream_to_an_unknown_model_gets_a_404_error_frame(service: ServiceProcess) -> None:
    with connect(f"{service.ws_url}/v1/models/ghost/stream") as ws:
        frame = json.loads(ws.recv(timeout=10))
        code = closed_with(ws)
    assert frame["error"]["status"] == 404 and frame["id"] is None
    assert code == 4404


def test_events_push_the_model_state(service: ServiceProcess, api: httpx.Client, name: str) -> None:
    make_model(api, name, 2)
    with connect(f"{service.ws_url}/v1/models/{name}/events?interval_ms=50") as ws:
        initial = json.loads(ws.recv(timeout=10))
        assert initial["version"] == 0 and initial["dropped"] == 0
        samples = [{"x": [i, 1], "y": i % 2} for i in range(30)]
        api.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples})
        frame = json.loads(ws.recv(timeout=10))
        while frame["version"] < 30:
            frame = json.loads(ws.recv(timeout=10))
    assert frame["samples_seen"] == 30 and frame["classes"] == 2
    assert {"triplet", "pair", "passive"} <= frame["updates"].keys()
    assert {"threshold", "calibrated"} <= frame["verification"].keys()


def test_events_of_an_unknown_model(service: ServiceProcess) -> None:
    with connect(f"{service.ws_url}/v1/models/ghost/events") as ws:
        assert json.loads(ws.recv(timeout=10))["error"]["status"] == 404
        assert closed_with(ws) == 4404


def test_events_of_a_model_deleted_while_connected_end_with_404_and_4404(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    with connect(f"{service.ws_url}/v1/models/{name}/events?interval_ms=10") as ws:
        assert json.loads(ws.recv(timeout=10))["version"] == 0
        assert api.delete(f"/v1/models/{name}").status_code == 204
        frame = json.loads(ws.recv(timeout=10))
        code = closed_with(ws)
    assert frame["error"]["status"] == 404 and frame["id"] is None
    assert f"model {name!r} was deleted" in frame["error"]["detail"]
    assert code == 4404


def test_stream_to_a_model_deleted_while_connected_answers_404_per_frame(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    """A frame for a model deleted meanwhile is a bad frame: an ``error`` frame with its id
    (the contract: the connection stays open), and nothing is logged under that name."""
    make_model(api, name, 2)
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        ws.send(json.dumps({"id": 1, "x": [1, 0], "y": "a"}))
        assert json.loads(ws.recv(timeout=10)) == {"ack": 1, "first_seq": 1, "last_seq": 1}
        assert api.delete(f"/v1/models/{name}").status_code == 204
        answers = []
        for frame_id in (2, 3):
            ws.send(json.dumps({"id": frame_id, "x": [1, 0], "y": "a"}))
            answers.append(json.loads(ws.recv(timeout=10)))
    assert [(a["id"], a["error"]["status"]) for a in answers] == [(2, 404), (3, 404)]
    assert_problem(api.get(f"/v1/models/{name}"), 404)


@pytest.mark.parametrize(
    ("interval", "msg"),
    [
        ("1", "Input should be greater than or equal to 10"),
        ("5000000", "Input should be less than or equal to 3600000"),
        ("abc", "Input should be a valid integer, unable to parse string as an integer"),
    ],
)
def test_a_bad_query_parameter_is_the_handshakes_422_problem(
    service: ServiceProcess, api: httpx.Client, name: str, interval: str, msg: str
) -> None:
    """The handshake's HTTP answer is the problem naming the parameter (no socket is opened),
    not an empty 403."""
    make_model(api, name, 2)
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{service.ws_url}/v1/models/{name}/events?interval_ms={interval}")
    answer = refused.value.response
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/problem+json"
    problem = json.loads(answer.body or b"")
    assert problem["errors"] == [
        {"loc": ["query", "interval_ms"], "msg": msg, "type": problem["errors"][0]["type"]}
    ]
    assert problem["detail"] == f"query.interval_ms: {msg}"


def negotiated_extensions(ws_url: str, name: str) -> str | None:
    """The Sec-WebSocket-Extensions the service answers to a client offering
    permessage-deflate (as Python's websockets and browsers do by default)."""
    with connect(f"{ws_url}/v1/models/{name}/stream", compression="deflate") as ws:
        ws.send(json.dumps({"id": "one", "x": [1, 2], "y": "a"}))
        assert json.loads(ws.recv(timeout=10))["ack"] == "one"
        assert ws.response is not None
        return ws.response.headers.get("Sec-WebSocket-Extensions")


def test_permessage_deflate_is_declined_unless_a_setting_turns_it_on(
    service: ServiceProcess, api: httpx.Client, name: str, launch: Launch, tmp_path: Path
) -> None:
    make_model(api, name, 2)
    assert negotiated_extensions(service.ws_url, name) is None
    # its own embedded Redis: the model is this process's to learn, nothing to forward
    with launch(tmp_path, None, **SHARED_ENV, OPML_WS_PER_MESSAGE_DEFLATE="true") as on:
        with on.client() as other:
            make_model(other, name, 2)
        extensions = negotiated_extensions(on.ws_url, name)
    assert extensions is not None and "permessage-deflate" in extensions
