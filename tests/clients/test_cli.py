"""The ``opml`` command line run as a subprocess against a live service; ``--json`` parsed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from clients import OPMLClient
from tests.service.support import ServiceProcess, core_learner, free_port, stream

OPML = str(Path(sys.executable).with_name("opml"))


def opml(service: ServiceProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OPML, "--url", service.url, *args], capture_output=True, text=True, timeout=60
    )


def ok_json(service: ServiceProcess, *args: str) -> Any:
    done = opml(service, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_models_commands_and_their_exit_codes(service: ServiceProcess, name: str) -> None:
    created = ok_json(
        service, "models", "create", name, "--dim", "3", "--algorithm", "opml", "--gamma", "0.02"
    )
    assert (created["name"], created["dim"], created["algorithm"], created["gamma"]) == (
        name,
        3,
        "opml",
        0.02,
    )
    assert name in [m["name"] for m in ok_json(service, "models", "list")["models"]]
    assert ok_json(service, "models", "show", name)["version"] == 0
    duplicate = opml(service, "models", "create", name, "--dim", "3")
    assert duplicate.returncode == 4 and "409" in duplicate.stderr
    assert ok_json(service, "models", "delete", name) == {"deleted": name}
    assert opml(service, "models", "show", name).returncode == 3
    assert opml(service, "models", "create", "Bad Name!", "--dim", "3").returncode == 5


def test_ingest_csv_by_header_name_then_rerun_logs_nothing(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    X, y = stream(700, 4, 3, seed=11)
    path = tmp_path / "data.csv"
    rows = [",".join(["kind", *"abcd"])] + [
        ",".join([label, *map(repr, row.tolist())]) for label, row in zip(y, X, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n")
    client.create_model(name, 4, gamma=0.01)
    args = ("ingest", str(path), "--model", name, "--label-column", "kind", "--batch", "64")
    first = ok_json(service, *args)
    assert (first["rows"], first["logged"], first["replayed"], first["last_seq"]) == (
        700,
        700,
        0,
        700,
    )
    again = ok_json(service, *args)  # same content, same frame ids: acknowledged, not logged
    assert (again["logged"], again["replayed"], again["last_seq"]) == (0, 700, 700)
    L = client.metric(name, min_version=700)
    assert client.get_model(name).samples_seen == 700
    np.testing.assert_allclose(L, core_learner(X, y, dim=4, gamma=0.01).L, atol=1e-12)


def test_ingest_npy_with_label_file_and_resume_file(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    X, y = stream(300, 3, 2, seed=12)
    np.save(tmp_path / "X.npy", X)
    (tmp_path / "y.txt").write_text("\n".join(y) + "\n")
    resume = tmp_path / "resume.json"
    client.create_model(name, 3)
    args = (
        "ingest",
        str(tmp_path / "X.npy"),
        "--labels",
        str(tmp_path / "y.txt"),
        "--model",
        name,
        "--batch",
        "50",
        "--resume-file",
        str(resume),
    )
    assert ok_json(service, *args)["logged"] == 300
    assert json.loads(resume.read_text())["acked_rows"] == 300
    rerun = ok_json(service, *args)
    assert (rerun["skipped_rows"], rerun["acked"]) == (300, 0)
    assert client.get_model(name).raw["logged_seq"] == 300


def test_ingest_npz_and_bad_files(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    X, y = stream(120, 2, 2, seed=13)
    np.savez(tmp_path / "d.npz", X=X, y=np.array([int(v[1:]) for v in y]))
    client.create_model(name, 2)
    assert ok_json(service, "ingest", str(tmp_path / "d.npz"), "--model", name)["logged"] == 120
    assert client.get_model(name).raw["logged_seq"] == 120
    (tmp_path / "bad.csv").write_text("1,2,a\n3,x,b\n")
    assert opml(service, "ingest", str(tmp_path / "bad.csv"), "--model", name).returncode == 5
    missing = opml(service, "ingest", str(tmp_path / "d.npz"), "--model", "no-such-model")
    assert missing.returncode == 3


def test_queries_export_and_events(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    X, y = stream(80, 3, 2, seed=14)
    client.create_model(name, 3, gamma=0.01)
    client.ingest(name, X, y, wait=True)
    a, b, c = (",".join(map(repr, v.tolist())) for v in X[:3])
    d = ok_json(service, "distance", name, f"--a={a}", f"--b={b}")
    assert d["squared_distance"] == client.distance(name, X[0], X[1]).squared_distance
    many = ok_json(service, "distance", name, f"--a={a}", f"--b={b}", f"--b={c}")
    np.testing.assert_array_equal(many["distances"], client.distances(name, X[0], X[1:3]).distances)
    v = ok_json(service, "verify", name, f"--a={a}", f"--b={b}", "--threshold", "0")
    assert (v["same"], v["threshold"], v["version"]) == (False, 0.0, 80)

    L = client.metric(name)
    out = tmp_path / "L.npy"
    assert ok_json(service, "metric", "export", name, "--format", "npy", "-o", str(out))
    np.testing.assert_array_equal(np.load(out), L)
    exported = opml(service, "metric", "export", name, "--format", "json")
    assert exported.returncode == 0
    assert json.loads(exported.stdout) == {"L": L.tolist(), "version": 80}

    event = ok_json(service, "events", name, "--count", "1", "--interval-ms", "20")
    assert (event["version"], event["samples_seen"]) == (80, 80)


def test_unreachable_service_exits_6() -> None:
    done = subprocess.run(
        [OPML, "--url", "http://127.0.0.1:9", "--retries", "0", "models", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 6 and "opml:" in done.stderr


def test_serve_runs_the_service_on_its_embedded_redis(tmp_path: Path) -> None:
    """``opml serve`` (the Quickstart's service, without dev.py) serves and keeps its data."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [OPML, "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPML_")}

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    return proc
            time.sleep(0.1)
        proc.kill()
        raise TimeoutError("opml serve did not become ready")

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    proc = start()
    redis_pid = json.loads((tmp_path / "data" / "redis.json").read_text())["pid"]
    try:
        created = subprocess.run(
            [OPML, "--url", url, "models", "create", "kept", "--dim", "2", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
    finally:
        stop(proc)
    assert not Path(f"/proc/{redis_pid}").exists()  # its embedded redis-server stopped too
    proc = start()
    try:
        listed = subprocess.run(
            [OPML, "--url", url, "models", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert [m["name"] for m in json.loads(listed.stdout)["models"]] == ["kept"]
    finally:
        stop(proc)
