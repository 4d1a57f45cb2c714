"""Several clients on one model at once: per-model order = log order; nothing lost or doubled."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
from websockets.sync.client import connect

from tests.service.support import ServiceProcess, core_learner, make_model, stream


def test_concurrent_clients_on_one_model(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 3, gamma=0.05, seed=2)
    X, y = stream(1600, 3, 4, seed=6)
    at_seq: dict[int, int] = {}  # seq -> index of the sample in X, from the acks
    lock = threading.Lock()

    def record(first: int, last: int, rows: range) -> None:
        with lock:
            for seq, row in zip(range(first, last + 1), rows, strict=True):
                assert seq not in at_seq
                at_seq[seq] = row

    def http_client(part: int) -> None:
        with service.client() as client:
            for k in range(part * 400, part * 400 + 400, 8):
                body = {"samples": [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 8)]}
                answer = client.post(f"/v1/models/{name}/samples", json=body).json()
                record(answer["first_seq"], answer["last_seq"], range(k, k + 8))

    def ws_client(part: int) -> None:
        with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
            for k in range(part * 400, part * 400 + 400, 8):
                samples = [{"x": X[i].tolist(), "y": y[i]} for i in range(k, k + 8)]
                ws.send(json.dumps({"id": f"{name}-{k}", "samples": samples}))
            for k in range(part * 400, part * 400 + 400, 8):
                ack = json.loads(ws.recv(timeout=30))
                assert ack["ack"] == f"{name}-{k}"
                record(ack["first_seq"], ack["last_seq"], range(k, k + 8))

    threads = [threading.Thread(target=http_client, args=(p,)) for p in (0, 1)]
    threads += [threading.Thread(target=ws_client, args=(p,)) for p in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(at_seq) == list(range(1, 1601))  # every seq once: nothing lost or doubled
    assert sorted(at_seq.values()) == list(range(1600))
    order = [at_seq[s] for s in range(1, 1601)]  # the log order, from the acks
    ref = core_learner(X[order], [y[i] for i in order], dim=3, gamma=0.05, seed=2)
    got = api.get(f"/v1/models/{name}/metric", params={"min_version": 1600}).json()
    assert got["version"] == 1600
    np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)
