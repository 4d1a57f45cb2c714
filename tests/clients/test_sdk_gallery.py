"""The SDK's and the command line's gallery and identify, against the live service."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clients import AsyncOPMLClient, OPMLClient
from clients._wire import BINARY_MATRIX_VALUES
from clients.errors import InvalidInput, NotFound
from tests.service.support import ServiceProcess

OPML = str(Path(sys.executable).with_name("opml"))


def brute_force(q: np.ndarray, G: np.ndarray, L: np.ndarray) -> np.ndarray:
    diff = (q - G) @ L.T
    return np.einsum("ij,ij->i", diff, diff)


def test_enroll_identify_list_delete(client: OPMLClient, name: str) -> None:
    d = 16
    client.create_model(name, d, gamma=0.05)
    rng = np.random.default_rng(1)
    client.ingest(name, rng.normal(size=(60, d)), [f"c{i % 3}" for i in range(60)], wait=True)
    G = rng.normal(size=(30, d))
    ids = [f"p{i:02d}" for i in range(29)] + [29]
    done = client.enroll(name, ids, G, [i % 5 for i in range(30)], idempotency_key="sdk-1")
    assert (done.enrolled, done.replaced, done.size, done.replayed) == (30, 0, 30, False)
    again = client.enroll(name, ids, G, [i % 5 for i in range(30)], idempotency_key="sdk-1")
    assert again.replayed and again.size == 30

    L = client.metric(name, min_version=60)
    found = client.identify(name, G[4] + 0.01, k=3)
    sq = brute_force(G[4] + 0.01, G, L)
    assert [m.id for m in found.matches] == [ids[i] for i in np.argsort(sq)[:3]]
    assert found.matches[0].y == 4 and found.version == 60
    np.testing.assert_allclose([m.squared_distance for m in found.matches], np.sort(sq)[:3],
                               rtol=1e-9)  # fmt: skip

    Q = rng.normal(size=(BINARY_MATRIX_VALUES // d + 1, d))  # large enough to go as .npz
    binary = client.identify_many(name, Q, k=2, threshold=1.0)
    as_json = client.identify_many(name, Q, k=2, threshold=1.0, binary=False)
    assert binary.version == as_json.version == 60 and binary.threshold_source == "caller"
    assert [[(str(m.id), m.squared_distance, m.same) for m in r] for r in binary.results] == [
        [(str(m.id), m.squared_distance, m.same) for m in r] for r in as_json.results
    ]

    page = client.gallery_list(name, limit=20)
    assert page.count == 30 and len(page.ids) == 20 and page.next_cursor is not None
    rest = client.gallery_list(name, cursor=page.next_cursor, limit=20)
    assert sorted(map(str, page.ids + rest.ids)) == sorted(map(str, ids))
    client.gallery_delete(name, 29)
    client.gallery_delete(name, "p00")
    assert client.gallery_list(name).count == 28
    with pytest.raises(NotFound):
        client.gallery_delete(name, "p00")
    with pytest.raises(InvalidInput):
        client.identify(name, G[0], k=29)


def test_async_client_gallery(service: ServiceProcess, name: str) -> None:
    async def run() -> None:
        async with AsyncOPMLClient(service.url) as client:
            await client.create_model(name, 2)
            done = await client.enroll(name, ["a", "b"], [[0.0, 0.0], [1.0, 1.0]])
            assert done.size == 2
            found = await client.identify(name, [0.9, 0.9], k=2)
            assert [m.id for m in found.matches] == ["b", "a"]
            many = await client.identify_many(name, [[0.0, 0.1]], k=1)
            assert many.results[0][0].id == "a"
            await client.gallery_delete(name, "a")
            assert (await client.gallery_list(name)).ids == ["b"]

    asyncio.run(run())


def test_sdk_refuses_bad_ids_before_sending(client: OPMLClient) -> None:
    with pytest.raises(ValueError, match="ids"):
        client.enroll("whatever", ["x" * 257], [[1.0]])
    with pytest.raises(ValueError, match="ids"):
        client.enroll("whatever", ["a", "b"], [[1.0]])


def opml(service: ServiceProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OPML, "--url", service.url, *args], capture_output=True, text=True, timeout=60
    )


def test_cli_gallery_and_identify(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    client.create_model(name, 3)
    path = tmp_path / "gallery.csv"
    rows = ["who,a,b,c", "ann,1,0,0", "bob,0,1,0", "cy,0,0,1", "7,1,1,0"]
    path.write_text("\n".join(rows) + "\n")
    args = ("gallery", "add", str(path), "--model", name, "--id-column", "who", "--batch", "3")
    added = json.loads(opml(service, *args, "--json").stdout)
    assert added == {"model": name, "items": 4, "replaced": 0, "size": 4}
    rerun = json.loads(opml(service, *args, "--json").stdout)  # replays: nothing written twice
    assert rerun["size"] == 4
    listed = json.loads(opml(service, "gallery", "list", name, "--json").stdout)
    assert listed == {"count": 4, "ids": ["7", "ann", "bob", "cy"]}  # a text column: strings
    found = json.loads(opml(service, "identify", name, "--x", "0.9,0.1,0", "--k", "2",
                            "--json").stdout)  # fmt: skip
    assert [m["id"] for m in found["matches"]] == ["ann", "7"]
    human = opml(service, "identify", name, "--x", "0,0,1")
    assert human.returncode == 0 and human.stdout.startswith("cy ")
    assert opml(service, "gallery", "delete", name, "7").returncode == 0
    assert opml(service, "gallery", "delete", name, "7").returncode == 3  # not found
    too_many = opml(service, "identify", name, "--x", "0,0,1", "--k", "9")
    assert too_many.returncode == 5 and "k" in too_many.stderr
