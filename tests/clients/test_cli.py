"""The ``opml`` command line run as a subprocess against a live service; ``--json`` parsed."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pty
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from clients import OPMLClient
from clients.cli import build_parser
from tests.clients.support import OPML, opml, served
from tests.service.support import ServiceProcess, core_learner, free_port, stream


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


def test_models_create_with_step_rules_and_gamma_auto(service: ServiceProcess, name: str) -> None:
    paper = ok_json(service, "models", "create", f"{name}-p", "--dim", "3", "--step", "paper")
    assert (paper["step"], paper["race"], paper["health"]["state"]) == ("paper", None, "ok")
    auto = ok_json(
        service, "models", "create", name, "--dim", "3", "--gamma", "auto", "--auto-warmup", "50"
    )
    assert (auto["step"], auto["gamma"], auto["auto_warmup"]) == ("scaled", "auto", 50)
    shown = opml(service, "models", "show", name)
    assert shown.returncode == 0 and "race: state=racing" in shown.stdout
    assert "health: state=ok" in shown.stdout
    out_of_range = opml(service, "models", "create", f"{name}-x", "--dim", "3", "--gamma", "2")
    assert out_of_range.returncode == 5 and "gamma" in out_of_range.stderr
    usage = opml(service, "models", "create", f"{name}-x", "--dim", "3", "--gamma", "fast")
    assert usage.returncode == 2 and "a number or auto" in usage.stderr
    rehearsing = ok_json(
        service, "models", "create", f"{name}-r", "--dim", "3", "--rehearsal", "2",
        "--rehearsal-memory", "64",
    )  # fmt: skip
    assert (rehearsing["rehearsal"], rehearsing["rehearsal_memory"]) == (2, 64)
    refused = opml(service, "models", "create", f"{name}-y", "--dim", "3", "--rehearsal", "99")
    assert refused.returncode == 5 and "rehearsal" in refused.stderr


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
    said = opml(service, "verify", name, f"--a={a}", f"--b={b}", "--threshold", "0.5").stdout
    assert said.endswith("threshold from caller, version 80)\n"), said
    own = ok_json(service, "verify", name, f"--a={a}", f"--b={b}")  # the model's threshold
    said = opml(service, "verify", name, f"--a={a}", f"--b={b}").stdout
    assert f"threshold from {own['threshold_source']}, version 80)" in said
    assert "caller" not in said

    L = client.metric(name)
    out = tmp_path / "L.npy"
    assert ok_json(service, "metric", "export", name, "--format", "npy", "-o", str(out))
    np.testing.assert_array_equal(np.load(out), L)
    exported = opml(service, "metric", "export", name, "--format", "json")
    assert exported.returncode == 0
    assert json.loads(exported.stdout) == {"L": L.tolist(), "version": 80}

    event = ok_json(service, "events", name, "--count", "1", "--interval-ms", "20")
    assert (event["version"], event["samples_seen"]) == (80, 80)


def test_query_output_labels_every_figure(
    service: ServiceProcess, client: OPMLClient, name: str
) -> None:
    """Distances and squared distances are named wherever they are printed, and a threshold
    is compared with the squared distance, as the service decides."""
    X, y = stream(40, 3, 2, seed=21)
    client.create_model(name, 3, gamma=0.01)
    client.ingest(name, X, y, wait=True)
    a, b, c = (
        f"--{k}=" + ",".join(map(repr, v.tolist())) for k, v in zip("abb", X[:3], strict=True)
    )
    one = client.distance(name, X[0], X[1])
    said = opml(service, "distance", name, a, b).stdout
    assert said == (
        f"distance {one.distance:.6g}, squared distance {one.squared_distance:.6g} (version 40)\n"
    )
    many = client.distances(name, X[0], X[1:3])
    lines = opml(service, "distance", name, a, b, c).stdout.splitlines()
    assert lines[0].split() == ["distance", "squared", "distance"]
    for line, d, sq in zip(lines[1:3], many.distances, many.squared_distances, strict=True):
        assert line.split() == [f"{d:.6g}", f"{sq:.6g}"]
    assert lines[3:] == ["(version 40)"]
    for threshold in (0.0, 1e6):
        v = client.verify(name, X[0], X[1], threshold=threshold)
        said = opml(service, "verify", name, a, b, "--threshold", str(threshold)).stdout
        word, relation = ("same", "<=") if v.same else ("different", ">")
        assert v.same is (threshold > 0)
        assert said == (
            f"{word}: squared distance {v.squared_distance:.6g} {relation} threshold "
            f"{threshold:.6g} (distance {v.squared_distance**0.5:.6g}; threshold from caller, "
            "version 40)\n"
        )


def test_help_is_plain_text() -> None:
    """``opml --help`` shows the module's text without its reST markup."""
    shown = subprocess.run([OPML, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: opml")
    assert "``" not in shown.stdout and ":mod:" not in shown.stdout
    assert "The service address comes from --url or $OPML_URL" in shown.stdout
    assert "a threshold (verify, identify, certificate) is a squared distance" in (
        " ".join(shown.stdout.split())
    )


def test_unreachable_service_exits_6() -> None:
    done = subprocess.run(
        [OPML, "--url", "http://127.0.0.1:9", "--retries", "0", "models", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 6 and "opml:" in done.stderr


def test_a_refused_connection_names_the_url() -> None:
    """A refused connect says where it tried (retries or not: a refused connect fails at once,
    the SDK's attempts are counted in test_refusals.py)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: refused
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        done = subprocess.run(
            [OPML, "--url", url, "--retries", "5", "models", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 6
    assert (
        done.stderr == f"opml: cannot connect to {url}/v1/models: [Errno 111] Connection refused\n"
    )


def test_ingest_of_the_wrong_width_is_refused_before_streaming(
    service: ServiceProcess, client: OPMLClient, name: str, tmp_path: Path
) -> None:
    client.create_model(name, 3)
    path = tmp_path / "wide.csv"
    path.write_text("".join(f"{i},1,2,3,c{i % 2}\n" for i in range(300)))  # 4 features + label
    done = opml(service, "ingest", str(path), "--model", name)
    assert done.returncode == 5
    assert done.stderr == f"opml: {path}: the file has 4 features, model {name} has dim 3\n"
    assert client.get_model(name).raw["logged_seq"] == 0


def test_npy_export_refuses_a_terminal(
    service: ServiceProcess, client: OPMLClient, name: str
) -> None:
    """Raw .npy bytes are not written to a terminal; JSON may be printed there."""
    client.create_model(name, 2)

    def on_a_terminal(*args: str) -> tuple[int, str, str]:
        """Exit code, standard error, and what the terminal (standard output) showed."""
        leader, follower = pty.openpty()
        try:
            done = subprocess.run(
                [OPML, "--url", service.url, "metric", "export", name, *args],
                stdout=follower,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
            os.close(follower)
            shown = b""
            with contextlib.suppress(OSError):  # EIO once all the terminal's output is read
                while chunk := os.read(leader, 65536):
                    shown += chunk
        finally:
            os.close(leader)
        return done.returncode, done.stderr, shown.decode(errors="replace")

    code, error, shown = on_a_terminal()
    assert (code, shown) == (2, "")
    assert "-o FILE or redirect standard output" in error
    code, error, shown = on_a_terminal("--format", "json")
    assert (code, error) == (0, "")
    assert json.loads(shown) == {"L": [[1.0, 0.0], [0.0, 1.0]], "version": 0}


def _options(parser: argparse.ArgumentParser, path: str = "opml") -> Iterator[tuple[str, Any]]:
    """Every (command path, action) of the parser tree, help actions left out."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, child in action.choices.items():
                yield from _options(child, f"{path} {command}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_has_help_and_serve_is_the_services_command_line() -> None:
    """``opml serve`` has no option list of its own: its options and its ``--help`` are
    ``python -m service``'s (none of the client options apply)."""
    options = list(_options(build_parser()))
    assert len(options) > 35
    missing = [(path, action.dest) for path, action in options if not action.help]
    assert missing == []
    assert [a.dest for path, a in options if path == "opml serve"] == []
    shown = subprocess.run([OPML, "serve", "--help"], capture_output=True, text=True, timeout=60)
    direct = subprocess.run(
        [sys.executable, "-m", "service", "--help"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == direct.returncode == 0
    assert shown.stdout.startswith("usage: opml serve [options]")
    assert shown.stdout == direct.stdout.replace("python -m service", "opml serve", 1)
    for client_only in ("--url", "--json", "--timeout", "--retries"):
        assert client_only + " " not in shown.stdout


def test_serve_runs_the_service_on_its_embedded_redis(tmp_path: Path) -> None:
    """``opml serve --port P --data-dir D`` (the Quickstart's service, without dev.py) answers
    on P, keeps its data in D, and stops its embedded Redis with it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    options = ("--port", str(port), "--data-dir", str(tmp_path / "data"))
    with served(url, tmp_path / "first.log", *options) as first:
        assert httpx.get(url + "/livez", timeout=10).json()["status"] == "ok"
        redis_pid = json.loads((tmp_path / "data" / "redis.json").read_text())["pid"]
        created = subprocess.run(
            [OPML, "--url", url, "models", "create", "kept", "--dim", "2", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
    assert "authentication OFF" in first.stop()  # the default log level (info) shows warnings
    assert not Path(f"/proc/{redis_pid}").exists()  # its embedded redis-server stopped too
    with served(url, tmp_path / "second.log", *options):
        listed = subprocess.run(
            [OPML, "--url", url, "models", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert [m["name"] for m in json.loads(listed.stdout)["models"]] == ["kept"]


def test_serve_passes_host_redis_url_and_log_level(
    redis_url: str, tmp_path: Path, name: str
) -> None:
    """Each option reaches the service: it binds --host (not 127.0.0.1), keeps its models in
    --redis-url (no embedded Redis in --data-dir) and logs at --log-level."""
    port = free_port()
    url = f"http://127.0.0.2:{port}"
    data = tmp_path / "data"
    options = ["--host", "127.0.0.2", "--port", str(port), "--data-dir", str(data)]
    options += ["--redis-url", redis_url, "--log-level", "error"]
    with served(url, tmp_path / "serve.log", *options) as proc:
        assert httpx.get(url + "/livez", timeout=10).json()["status"] == "ok"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/livez", timeout=10)
        with OPMLClient(url) as c:
            c.create_model(name, 2)
        assert redis.Redis.from_url(redis_url).sismember("opml:models", name)
        assert not (data / "redis.json").exists()
    assert "authentication OFF" not in proc.stop()  # a warning: below --log-level error


def test_certificate_command(service: ServiceProcess, client: OPMLClient, name: str) -> None:
    X, y = stream(700, 3, 3, seed=15)
    client.create_model(name, 3, gamma=0.01, holdout=0.3)
    early = opml(service, "certificate", name)
    assert early.returncode == 4 and "more" in early.stderr  # 409: how many more are needed
    client.ingest(name, X[:350], y[:350])
    client.ingest(name, X[350:], y[350:])
    cert = ok_json(service, "certificate", name, "--delta", "0.1", "--min-version", "700")
    assert cert == client.certificate(name, delta=0.1).raw
    said = opml(service, "certificate", name, "--method", "kl").stdout
    kl = client.certificate(name, method="kl")
    assert f"false accept rate  <= {kl.false_accept.bound:.4f}" in said
    assert kl.statement in said
    assert opml(service, "certificate", name, "--delta", "2").returncode == 5


def test_gradient_learner_create_and_restricted_distance(
    service: ServiceProcess, client: OPMLClient, name: str
) -> None:
    created = ok_json(
        service, "models", "create", name, "--dim", "3", "--algorithm", "brm", "--eta", "0.2",
        "--step", "invsqrt", "--lam", "0.001", "--margin", "0.3",
    )  # fmt: skip
    assert {k: created[k] for k in ("algorithm", "eta", "step", "lam", "margin", "kappa")} == {
        "algorithm": "brm", "eta": 0.2, "step": "invsqrt", "lam": 0.001, "margin": 0.3,
        "kappa": None,
    }  # fmt: skip
    X, y = stream(60, 3, 2, seed=4)
    client.ingest(name, X, y, wait=True)
    a, b, c = (",".join(map(repr, v.tolist())) for v in X[:3])
    d = ok_json(service, "distance", name, f"--a={a}", f"--b={b}")  # brm: always restricted
    assert d["restricted_distance"] == client.distance(name, X[0], X[1]).restricted_distance
    said = opml(service, "distance", name, f"--a={a}", f"--b={b}", f"--b={c}", "--restricted")
    lines = said.stdout.splitlines()
    assert said.returncode == 0 and lines[0].split() == [
        "distance", "squared", "distance", "restricted", "distance",
    ], said.stdout  # fmt: skip
    assert len(lines) == 4 and lines[3].startswith("(version ")
    refused = opml(service, "models", "create", f"{name}-x", "--dim", "3", "--kappa", "0.9")
    assert refused.returncode == 5 and "kappa" in refused.stderr


def test_models_create_lda_and_whitened(service: ServiceProcess, name: str) -> None:
    lda = ok_json(
        service, "models", "create", f"{name}-l", "--dim", "3", "--algorithm", "lda",
        "--refresh", "200", "--shrinkage", "0.1",
    )  # fmt: skip
    assert (lda["algorithm"], lda["refresh"], lda["shrinkage"]) == ("lda", 200, 0.1)
    white = ok_json(
        service, "models", "create", f"{name}-w", "--dim", "3", "--precondition", "whiten"
    )
    assert (white["precondition"], white["refresh"], white["shrinkage"]) == ("whiten", 1000, 0.0)
    weighted = ok_json(
        service, "models", "create", f"{name}-d", "--dim", "3", "--precondition", "discriminant"
    )
    assert (weighted["precondition"], weighted["gamma"]) == ("discriminant", 0.01)
    refused = opml(
        service, "models", "create", f"{name}-x", "--dim", "3", "--algorithm", "brm",
        "--precondition", "whiten",
    )  # fmt: skip
    assert refused.returncode == 5 and "precondition" in refused.stderr
