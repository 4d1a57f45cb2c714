"""What the service benchmarks measure: the service, or the floor app beside it.

A :class:`Target` is a running HTTP/WebSocket server measured from outside: its URL, its
process's CPU seconds (all its threads, from ``/proc``; not its Redis's), its Redis server's
CPU seconds when the benchmark names that process (:attr:`Target.redis_pid`), and
:meth:`Target.loadgen`, one :mod:`benchmarks.harness.loadgen` measurement in a process of its
own with the target's CPU (and its Redis's) over it. :func:`start_service` starts
``python -m service`` (:class:`devkit.launcher.ServiceProcess`, embedded Redis with
``appendfsync always``); :func:`start_floor` starts :mod:`benchmarks.harness.floor` on a
given Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.harness.machine import thread_cpu
from devkit.launcher import ServiceProcess
from service.storage.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
#: The floor's environment: one BLAS thread (idle BLAS threads spin, which would count as the
#: floor's CPU; the service pins its small products to one thread too).
ONE_BLAS_THREAD = {
    **os.environ,
    **{k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
}


class Target:
    """A server under measurement (see the module docstring)."""

    def __init__(self, label: str, url: str, pid: int) -> None:
        self.label, self.url, self.pid = label, url, pid
        #: The Redis server the target writes to, when the benchmark knows its process: its
        #: CPU over a measurement is reported too (a Redis shared by two targets measured one
        #: after the other is charged to each only for its own run).
        self.redis_pid: int | None = None
        #: Its port on this host, when known: :meth:`settle` then also waits for the server's
        #: background persistence (an AOF rewrite or a snapshot, forked after a heavy run) to
        #: end, so that it does not weigh on the next measurement.
        self.redis_port: int | None = None
        self._frame_ids = 0

    def cpu(self) -> float:
        """CPU seconds (user + system, every thread) of the server's process so far."""
        return sum(thread_cpu(self.pid))

    def redis_cpu(self) -> float:
        """CPU seconds of :attr:`redis_pid` so far (0.0 when it is not known)."""
        return sum(thread_cpu(self.redis_pid)) if self.redis_pid is not None else 0.0

    def next_frame_ids(self) -> int:
        """A fresh frame-id range for a WS run (no run replays another's ids)."""
        self._frame_ids += 1
        return self._frame_ids * 100

    def create_model(self, name: str, dim: int, **params: Any) -> dict[str, Any]:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            answer = client.post("/v1/models", json={"name": name, "dim": dim, **params})
            if answer.status_code == 404:  # the floor has no models: any name is one
                return {"name": name, "dim": dim, **params}
            answer.raise_for_status()
            model: dict[str, Any] = answer.json()
            return model

    def settle(self, name: str, timeout_s: float = 300.0) -> None:
        """Wait until the model's learner has applied its whole log (``version >=
        logged_seq``), so that one measurement's backlog is not learned during the next (the
        floor has no models and nothing to learn), and until :attr:`redis_port`'s background
        persistence is idle."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while True:
                answer = client.get(f"/v1/models/{name}")
                caught_up = answer.status_code == 404  # the floor: nothing to learn
                if not caught_up:
                    answer.raise_for_status()
                    doc = answer.json()
                    caught_up = doc["version"] >= doc["logged_seq"]
                if caught_up and self._persistence_idle():
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.label}: {name} did not settle in {timeout_s} s")
                time.sleep(0.05)

    def _persistence_idle(self) -> bool:
        """No AOF rewrite or snapshot running or scheduled on :attr:`redis_port` (True when
        the port is not known)."""
        if self.redis_port is None:
            return True
        with redis.Redis(port=self.redis_port, socket_timeout=30) as client:
            info = client.info("persistence")
        return not any(
            info.get(key, 0)
            for key in (
                "aof_rewrite_in_progress",
                "aof_rewrite_scheduled",
                "rdb_bgsave_in_progress",
            )
        )

    def loadgen(self, kind: str, *args: str | int | float) -> dict[str, Any]:
        """One :func:`run_loadgen` measurement, with ``service_cpu_s`` (and ``redis_cpu_s``)
        over it."""
        cpu0, redis0 = self.cpu(), self.redis_cpu()
        result = run_loadgen(self.url, kind, *args)
        result["service_cpu_s"] = self.cpu() - cpu0
        result["redis_cpu_s"] = self.redis_cpu() - redis0
        return result


def spawn_loadgen(
    url: str, kind: str, out: Path, *args: str | int | float
) -> subprocess.Popen[bytes]:
    """``benchmarks.harness.loadgen KIND`` on ``url`` as a process of its own (its CPU is not
    the server's), writing its JSON result to ``out``; the caller waits for it."""
    cmd = [sys.executable, "-m", "benchmarks.harness.loadgen", kind, "--url", url,
           "--out", str(out), *(str(a) for a in args)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT)


def run_loadgen(url: str, kind: str, *args: str | int | float) -> dict[str, Any]:
    """One :func:`spawn_loadgen` measurement, waited for (at most 10 minutes): its result."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    try:
        proc = spawn_loadgen(url, kind, out, *args)
        try:
            code = proc.wait(600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if code != 0:
            raise subprocess.CalledProcessError(code, proc.args)
        result: dict[str, Any] = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    return result


@contextlib.contextmanager
def start_service(
    label: str, workdir: Path, root: Path | None = None, **settings: str
) -> Iterator[tuple[Target, ServiceProcess]]:
    """``python -m service`` on its embedded Redis in ``workdir``, stopped when the block ends."""
    with ServiceProcess(workdir, None, root=root, **settings).start(timeout=120) as process:
        yield Target(label, process.url, process.pid), process


@contextlib.contextmanager
def start_floor(
    redis_url: str, workdir: Path, dim: int, gallery: int = 10_000, gallery_dim: int = 128
) -> Iterator[Target]:
    """The floor app (:mod:`benchmarks.harness.floor`) on ``redis_url``; stopped (SIGTERM, then
    SIGKILL after 10 s) when the block ends."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / f"floor-{port}.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.harness.floor", "--redis-url", redis_url,
             "--port", str(port), "--dim", str(dim), "--gallery", str(gallery),
             "--gallery-dim", str(gallery_dim)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=ONE_BLAS_THREAD,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=url, timeout=2) as probe:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the floor app exited ({proc.returncode}); see {log.name}")
                with contextlib.suppress(httpx.HTTPError):
                    if probe.get("/livez").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the floor app did not answer within 60 s; {log.name}")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.05)
        yield Target("floor", url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def fsync_latency(directory: Path, n: int = 200) -> dict[str, float]:
    """write(600 B) + fsync on ``directory``'s disk: the floor of one durable append."""
    import numpy as np

    path = directory / "fsync-probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    times = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            os.write(fd, b"x" * 600)
            os.fsync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    arr = np.array(times)
    return {"p50_ms": float(np.median(arr)) * 1e3, "p99_ms": float(np.quantile(arr, 0.99)) * 1e3}
