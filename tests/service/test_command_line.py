"""``python -m service`` as a user runs it: its flags (and ``--help``), the start-up order (it
listens while the learning kernels compile), the refusals in one line with their exit status,
and a stop by SIGINT or SIGTERM. Every service here is a real subprocess on its own embedded
redis-server, stopped by the ``launch`` fixture whatever happens."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from service.__main__ import _flag, _shown, _variable
from service.api.routes.ops import COMPILING
from service.config import Settings
from tests.service.cluster import wait_for
from tests.service.support import free_port, make_model


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any ``OPML_*`` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPML_")}
    return {**env, "COLUMNS": "200", **extra}


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    log: Path

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def ready(self, port: int, timeout: float = 180) -> httpx.Client:
        """A client once ``/readyz`` answers 200 (the first start may compile the kernels)."""

        def answered() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return httpx.get(self.url(port) + "/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("/readyz 200", answered, timeout)
        return httpx.Client(base_url=self.url(port), timeout=30)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send ``signum``; the exit status. Killed if still running after 60 s (and the
        wait's TimeoutExpired fails the test)."""
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Start ``python -m service *args`` (cwd ``tmp_path``, no inherited ``OPML_*``); every
    process still running at the end is stopped (SIGTERM, then SIGKILL)."""
    started: list[Launched] = []

    def run(*args: str, env: dict[str, str] | None = None) -> Launched:
        log = tmp_path / f"service-{len(started)}.log"
        with log.open("ab") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service", *args],
                cwd=tmp_path,
                env=env or environment(),
                stdout=sink,
                stderr=sink,
            )
        started.append(Launched(proc, log))
        return started[-1]

    yield run
    for launched in started:
        if launched.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                launched.stop()


def run_once(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=cwd,
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_lists_every_setting_with_its_variable_and_default_and_starts_nothing(
    tmp_path: Path,
) -> None:
    done = run_once("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m service [options]")
    text = " ".join(done.stdout.split())  # as read, whatever the wrapping
    for name, field in Settings.model_fields.items():
        default = _shown(field.get_default(call_default_factory=True))
        assert _flag(name) in text and f"({_variable(name)}; default {default})" in text, name
    assert "--no-lean-path" in text and "{always,everysec,no}" in text
    for status in ("130 stopped by SIGINT", "143 stopped by SIGTERM", "3 could not start"):
        assert status in text
    assert list(tmp_path.iterdir()) == []  # no ./data, nothing else: nothing started


def test_flags_win_over_the_environment_which_wins_over_the_defaults(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    env_port, flag_port = free_port(), free_port()
    env = environment(
        OPML_PORT=str(env_port),
        OPML_DATA_DIR=str(tmp_path / "env-data"),
        OPML_MAX_DIM="64",
        OPML_MAX_MODELS="2",  # no flag: the environment's value holds
    )
    args = ("--port", str(flag_port), "--data-dir", str(tmp_path / "flag-data"), "--max-dim", "128")
    service = launch(*args, env=env)
    with service.ready(flag_port) as api:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{env_port}/livez")
        assert (tmp_path / "flag-data" / "redis.json").exists()
        assert not (tmp_path / "env-data").exists()
        make_model(api, "wide", 100)  # over OPML_MAX_DIM=64, within --max-dim 128
        refused = api.post("/v1/models", json={"name": "wider", "dim": 129})
        assert refused.status_code == 422 and "<= 128" in refused.json()["detail"]
        make_model(api, "second", 2)
        assert api.post("/v1/models", json={"name": "third", "dim": 2}).status_code == 422
    assert service.stop() == -signal.SIGTERM


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--port", "http"], {}, "--port"),
        (["--max-dim", "0"], {}, "--max-dim"),
        ([], {"OPML_MAX_DIM": "0"}, "OPML_MAX_DIM"),
        ([], {"OPML_REDIS_WAIT_REPLICAS": "1"}, "OPML_REDIS_WAIT_REPLICAS"),
        (["--redis-wait-replicas", "1"], {}, "--redis-wait-replicas"),
        (["--api-keys", "key"], {}, "--api-keys"),
        ([], {"OPML_API_KEYS": "key"}, "OPML_API_KEYS"),
        (["--log-level", "loud"], {}, "--log-level"),
        ([], {"OPML_LOG_LEVEL": "loud"}, "OPML_LOG_LEVEL"),
    ],
)
def test_a_bad_value_exits_2_naming_its_flag_or_variable(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    done = run_once(*args, cwd=tmp_path, env=environment(**env))
    assert done.returncode == 2
    assert named in done.stderr.splitlines()[-1] and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_second_service_on_the_same_data_dir_or_port_says_so_in_one_line(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    port, data = free_port(), tmp_path / "data"
    first = launch("--port", str(port), "--data-dir", str(data))
    with first.ready(port) as api:
        same_dir = run_once("--port", str(free_port()), "--data-dir", str(data), cwd=tmp_path)
        assert same_dir.returncode == 3
        lines = same_dir.stderr.strip().splitlines()
        assert len(lines) == 1, same_dir.stderr
        assert f"another opml-service is using {data}" in lines[0]
        assert "--data-dir" in lines[0]
        same_port = run_once("--port", str(port), "--data-dir", str(tmp_path / "d2"), cwd=tmp_path)
        assert same_port.returncode == 3
        lines = same_port.stderr.strip().splitlines()
        assert len(lines) == 1, same_port.stderr
        assert f"cannot listen on 127.0.0.1 port {port}" in lines[0]
        assert not (tmp_path / "d2").exists()  # refused before its Redis was started
        assert api.get("/readyz").status_code == 200  # the first one is untouched


def test_one_log_format_and_no_line_per_request_unless_asked(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    """uvicorn's lines are in the service's format (not its own ``INFO:     ...``); requests and
    WebSocket handshakes are not logged by default, and are with ``--access-log``."""
    ours = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")
    for flags, logged in (((), False), (("--access-log",), True)):
        port = free_port()
        service = launch(
            "--port", str(port), "--data-dir", str(tmp_path / f"data-{logged}"), *flags
        )
        with service.ready(port) as api:
            assert api.get("/livez").status_code == 200
            with ws_connect(f"ws://127.0.0.1:{port}/v1/models/none/stream"):
                pass
        assert service.stop() == -signal.SIGTERM
        lines = service.log.read_text().splitlines()
        uvicorn_lines = [line for line in lines if " uvicorn.error: " in line]
        assert any("Application startup complete" in line for line in uvicorn_lines), lines
        assert not [line for line in lines if re.match(r"^[A-Z]+:\s", line)]  # uvicorn's own
        requests = [line for line in lines if '"GET /livez HTTP/1.1" 200' in line]
        handshakes = [line for line in lines if '"WebSocket /v1/models/none/stream"' in line]
        assert bool(requests) == logged and bool(handshakes) == logged, lines
        assert all(ours.match(line) for line in uvicorn_lines + requests + handshakes), lines
        # the client left before the refusal frame: not an error of the server
        assert not [line for line in lines if "Exception in ASGI application" in line], lines


def test_it_keeps_large_buffers_unless_told_not_to(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    """The start-up sets glibc's thresholds (``service.allocator``) and says so at debug
    level; not with ``--no-keep-large-buffers``, nor when ``GLIBC_TUNABLES`` tunes malloc."""
    untuned = {
        k: v for k, v in environment().items()
        if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")
    }  # fmt: skip
    cases = [
        ((), {}, "large buffers kept in the process"),
        (("--no-keep-large-buffers",), {}, "OPML_KEEP_LARGE_BUFFERS off"),
        (
            (),
            {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
            "the environment tunes malloc",
        ),
    ]
    for i, (flags, extra, expected) in enumerate(cases):
        port = free_port()
        service = launch(
            "--port", str(port), "--data-dir", str(tmp_path / f"data-{i}"),
            "--log-level", "debug", *flags, env={**untuned, **extra},
        )  # fmt: skip
        with service.ready(port) as api:
            assert api.get("/livez").status_code == 200
        assert service.stop() == -signal.SIGTERM
        said = [
            line for line in service.log.read_text().splitlines() if "malloc thresholds" in line
        ]
        assert [line.split(": ", 1)[1] for line in said] == [f"malloc thresholds: {expected}"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_stop_gracefully_and_end_the_process_by_that_signal(
    launch: Callable[..., Launched], tmp_path: Path, signum: signal.Signals
) -> None:
    """Both stop alike (final checkpoint, embedded Redis stopped) and the process ends by the
    signal: Python's returncode -2 / -15, a shell's 130 / 143."""
    port, data = free_port(), tmp_path / "data"
    service = launch("--port", str(port), "--data-dir", str(data))
    with service.ready(port) as api:
        make_model(api, "m", 2)
        sent = api.post("/v1/models/m/samples", json={"samples": [{"x": [1, 0], "y": "a"}] * 5})
        assert sent.status_code == 202
        redis_pid = json.loads((data / "redis.json").read_text())["pid"]
    assert service.stop(signum) == -signum
    assert "service: stopped" in service.log.read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(redis_pid, 0)
    again = launch("--port", str(port), "--data-dir", str(data))
    with again.ready(port) as api:
        checkpoint = api.get("/v1/models/m").json()["checkpoint"]
        assert checkpoint["seq"] == 5  # written at the stop (none was due before it)


def test_it_listens_while_the_kernels_compile_and_is_ready_after(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    """A first start (an empty numba cache): ``/livez`` answers and samples are acknowledged
    while ``/readyz`` says the kernels compile; then it is ready and has learned them. A second
    start loads the kernels from the cache (its files are not rewritten)."""
    port, cache = free_port(), tmp_path / "numba-cache"
    env = environment(NUMBA_CACHE_DIR=str(cache))
    args = ("--port", str(port), "--data-dir", str(tmp_path / "data"))
    first = launch(*args, env=env)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def alive() -> bool:
        assert first.proc.poll() is None, first.log.read_text()
        try:
            return api.get("/livez").status_code == 200
        except httpx.HTTPError:
            return False

    with api:
        wait_for("/livez", alive)
        compiling = api.get("/readyz")
        assert compiling.status_code == 503
        assert compiling.json()["detail"] == COMPILING

        def created() -> bool:  # the models load beside the compilation: 503 until they have
            made = api.post("/v1/models", json={"name": "early", "dim": 2})
            loading = made.status_code == 503 and "being loaded" in made.json()["detail"]
            assert not loading or made.headers["retry-after"] == "1"
            assert made.status_code == 201 or loading, made.text
            return made.status_code == 201

        wait_for("the models to be loaded", created)
        sent = api.post("/v1/models/early/samples", json={"x": [1, 0], "y": "a"})
        assert sent.status_code == 202
    with first.ready(port) as api:
        assert api.get("/v1/models/early/metric", params={"min_version": 1}).status_code == 200
        assert api.get("/v1/models/early").json()["version"] == 1
    assert "learning kernels ready" in first.log.read_text()
    assert first.stop() == -signal.SIGTERM
    cached = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert any(p.suffix == ".nbi" for p in cached)  # numba's index files: the kernels are cached
    second = launch(*args, env=env)
    with second.ready(port) as api:
        assert api.get("/v1/models/early").json()["version"] == 1
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == cached
