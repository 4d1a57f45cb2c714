"""Service load benchmark: ingestion, queries and overhead against the embedded default.

    python3 dev.py bench service_load [--quick] [--no-profile]

Starts ``python -m service`` as a subprocess (:class:`devkit.launcher.ServiceProcess`; its own
embedded redis-server, AOF with ``appendfsync always``: an ack means the samples are on disk) in
a temporary data dir on a free port, and drives it with ``benchmarks/loadgen.py``, each
measurement a separate process (see its docstring for the methods). Nothing is asserted; the
figures are printed and saved with the machine they ran on and the 1-minute load average at
start and end (the machine is shared).

Measured, in one run (about 4.5 minutes; ``--quick``: about 2 minutes, shorter and fewer points):

* WebSocket ingestion throughput (samples/s acknowledged = durably logged) at d = 64 and 512 for
  frames of 1, 16, 64, 256 samples, each in JSON text frames and in the service's binary frames
  (one connection, 32 frames in flight, the service's ``OPML_WS_WINDOW``), plus d = 64 over 4
  connections (JSON); the learner lag (ack -> applied) p50/p99 at that rate, from
  ``WS /events?interval_ms=10`` (resolution ~10 ms, see loadgen);
* REST single-sample latency p50/p99 at 500 requests/s offered (open loop, latency from the
  scheduled send time), beside ``GET /livez`` at the same rate (the HTTP stack's floor); the same
  single-sample measurement on a second service whose embedded Redis runs ``appendfsync
  everysec`` (``OPML_REDIS_APPENDFSYNC``), side by side with the disk's fsync latency: under
  ``always`` one request cannot be faster than one fsync; REST batch throughput (256-sample
  batches, closed loop, 1 and 4 concurrent requests);
* distance and verify latency p50/p99 at 1,000 requests/s offered (open loop), idle and while a
  WebSocket ingestion runs flat out on the same model; one-to-many distance of one vector against
  10,000 x 128 (latency per query, full-precision and 4-decimal JSON), beside the core's own time
  for the same computation (and with the gallery pre-transformed);
* service overhead ratio: WebSocket ingestion throughput / core ``learn_many`` throughput on the
  same stream (same samples, same model config, the service's batch size), run here;
* CPU per acknowledged sample of the service (event-loop thread, worker threads), redis-server
  and the load generator (from ``/proc``), and a py-spy profile of the service under WebSocket
  ingestion (d = 64, 64-sample frames) broken down by stage; Redis ``INFO commandstats``; the
  fsync latency of the data dir's disk.

Writes ``benchmarks/results/service_load.{md,json,png}`` (the py-spy flame graph and its
collapsed stacks go to ``benchmarks/results/profiles/``, not tracked). :func:`measure`
returns the figures; :func:`report` (one function per section) and :func:`plot` render them, so
``--report-only`` re-renders a saved JSON without measuring.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.loadgen import pool_size, stream
from benchmarks.harness.machine import (
    NO_PY_SPY,
    cpu_seconds,
    machine_block,
    machine_info,
    py_spy,
    thread_cpu,
)
from benchmarks.harness.results import (
    PROFILES_DIR,
    command_line,
    result_stem,
    suffixed,
)
from benchmarks.harness.results import write_results as write_files
from benchmarks.harness.targets import fsync_latency, run_loadgen
from benchmarks.harness.targets import spawn_loadgen as spawn
from devkit.launcher import ServiceProcess
from service.core import Learner, LearnerConfig
from service.engine.admission import samples_per_batch

ROOT = Path(__file__).resolve().parents[2]

TARGETS = {
    "ws64_throughput": 20_000.0,  # samples/s
    "ws64_lag_p99_ms": 100.0,
    "rest_one_p99_ms": 5.0,
    "query_p99_ms": 5.0,
    "gallery_ms": 5.0,
}
#: What the service is given: the contract's defaults except normalize (unit-norm stream).
MODEL = {"normalize": "l2"}
#: WebSocket frame encodings measured (``loadgen ws --encoding``).
ENCODINGS = ("json", "binary")


# -- the service under test ----------------------------------------------------------------


@contextlib.contextmanager
def embedded_service(workdir: Path, appendfsync: str) -> Iterator[ServiceProcess]:
    """``python -m service`` on the embedded default (its own redis-server with
    ``appendfsync``) in ``workdir``, stopped (bounded) when the block ends."""
    with ServiceProcess(workdir, None, OPML_REDIS_APPENDFSYNC=appendfsync) as service:
        try:
            yield service
        finally:
            if not service.running:  # it ended before we asked: what failed next needs its log
                print(f"service (appendfsync {appendfsync}) had exited with status "
                      f"{service.returncode}; end of its log:\n{service.log_tail()}",
                      file=sys.stderr, flush=True)  # fmt: skip


def create_model(client: httpx.Client, name: str, dim: int) -> dict[str, Any]:
    client.delete(f"/v1/models/{name}")
    r = client.post("/v1/models", json={"name": name, "dim": dim, **MODEL})
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def delete_model(client: httpx.Client, name: str) -> None:
    client.delete(f"/v1/models/{name}", timeout=120)


def learner_config(model: dict[str, Any]) -> LearnerConfig:
    """The core config of a model body (so the core runs exactly what the service runs)."""
    return LearnerConfig(
        dim=model["dim"],
        algorithm=model["algorithm"],
        gamma=model["gamma"],
        gamma_pair=model["gamma_pair"],
        margin=model["margin"],
        normalize=model["normalize"],
        seed=model["seed"],
        calibration_window=model["calibration_window"],
    )


# -- CPU accounting from /proc --------------------------------------------------------------


class CpuSampler:
    """Samples CPU seconds of the service threads and redis-server every 0.1 s (a thread)."""

    def __init__(self, service: ServiceProcess) -> None:
        self.service = service
        self.rows: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        redis = self.service.embedded_redis()
        try:
            main, other = thread_cpu(self.service.pid)
            redis_cpu = cpu_seconds(Path(f"/proc/{redis[0]}/stat")) if redis else 0.0
        except OSError:
            return
        self.rows.append((time.time(), main, other, redis_cpu))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds used in [start, end] (wall clock), interpolated between samples."""
        if len(self.rows) < 2:
            return {}
        arr = np.array(self.rows)
        out = {}
        for i, key in ((1, "service_loop"), (2, "service_workers"), (3, "redis")):
            out[key] = float(
                np.interp(end, arr[:, 0], arr[:, i]) - np.interp(start, arr[:, 0], arr[:, i])
            )
        return out


# -- running the load generator ---------------------------------------------------------------


def loadgen(service: ServiceProcess, kind: str, *args: str | int | float) -> dict[str, Any]:
    """One ``benchmarks.harness.loadgen`` measurement on the service: its JSON result."""
    return run_loadgen(service.url, kind, *args)


def spawn_loadgen(service: ServiceProcess, kind: str, out: Path, *args: str | int | float) -> Any:
    return spawn(service.url, kind, out, *args)


def per_sample(cpu: dict[str, float], samples: float, generator_cpu: float) -> dict[str, float]:
    """Microseconds of CPU per acknowledged sample, by process."""
    if samples <= 0:
        return {}
    out = {k: v / samples * 1e6 for k, v in cpu.items()}
    out["generator"] = generator_cpu / samples * 1e6
    return out


def service_cpu(r: dict[str, Any], cpu: CpuSampler) -> None:
    """Add the service's CPU per answered request of an open-loop run (microseconds)."""
    start, end = r["steady_wall"]
    used = cpu.between(start, end + 0.5)  # + the tail of answers after the last send
    r["cpu_util"] = {k: v / (end - start) for k, v in used.items()}
    answered = max(r["ok"], 1)
    r["service_cpu_us_per_request"] = (
        (used.get("service_loop", 0) + used.get("service_workers", 0)) / answered * 1e6
    )
    r["redis_cpu_us_per_request"] = used.get("redis", 0) / answered * 1e6


def wait_applied(client: httpx.Client, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/v1/models/{name}").json()
        if body["version"] >= body["logged_seq"]:
            return
        time.sleep(0.1)


def encoding_of(r: dict[str, Any]) -> str:
    """A WS row's frame encoding (results saved before ``--encoding`` existed are JSON)."""
    return str(r.get("encoding", "json"))


def best_ws(ws: list[dict[str, Any]], d: int, encoding: str | None = None) -> dict[str, Any]:
    """The one-connection WS row of dimension ``d`` (and ``encoding``) with most throughput."""
    rows = [r for r in ws if r["dim"] == d and r["connections"] == 1
            and encoding in (None, encoding_of(r))]  # fmt: skip
    return max(rows, key=lambda r: r["throughput"])


# -- measurements -----------------------------------------------------------------------------


@dataclass
class Plan:
    """Durations and points; ``--quick`` shrinks them."""

    quick: bool
    ws_seconds: float = 8.0
    frames: tuple[int, ...] = (1, 16, 64, 256)
    http_seconds: float = 10.0
    batch_seconds: float = 6.0
    query_seconds: float = 8.0
    gallery_queries: int = 4
    profile_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.quick:
            self.ws_seconds, self.frames = 1.0, (64,)
            self.http_seconds = self.batch_seconds = self.query_seconds = 1.0
            self.gallery_queries, self.profile_seconds = 1, 2.0


def measure_ws(
    service: ServiceProcess, client: httpx.Client, cpu: CpuSampler, plan: Plan
) -> list[dict[str, Any]]:
    rows = []
    # the two encodings of one (d, frame) back to back, so a change of the machine's load
    # between them is as small as it can be
    points = [(d, f, enc, 1) for d in (64, 512) for f in plan.frames for enc in ENCODINGS]
    points.append((64, 64, "json", 4))
    for d, frame, encoding, conns in points:
        name = f"ws{d}-f{frame}-{encoding}-c{conns}"
        create_model(client, name, d)
        drain = 10.0 if plan.quick else 20.0
        r = loadgen(service, "ws", "--model", name, "--dim", d, "--frame", frame,
                    "--encoding", encoding, "--connections", conns,
                    "--seconds", plan.ws_seconds, "--events", "--drain", drain)  # fmt: skip
        start, end = r["steady_wall"]
        used = cpu.between(start, end)
        r["cpu_us_per_sample"] = per_sample(
            used,
            r["throughput"] * (end - start),
            r["generator_cpu_run_s"],
        )
        r["cpu_util"] = {k: v / (end - start) for k, v in used.items()}
        delete_model(client, name)
        rows.append(r)
        lag = r.get("lag", {})
        print(f"ws {encoding} d={d} frame={frame} conns={conns}: {r['throughput']:.0f} "
              f"samples/s ({r['frame_errors']} error frames), "
              f"lag p50 {lag.get('p50_ms', float('nan')):.1f} ms p99 "
              f"{lag.get('p99_ms', float('nan')):.1f} ms", flush=True)  # fmt: skip
    return rows


def measure_rest(
    service: ServiceProcess, client: httpx.Client, cpu: CpuSampler, plan: Plan
) -> dict[str, Any]:
    create_model(client, "rest64", 64)
    out: dict[str, Any] = {}
    out["livez"] = loadgen(service, "query", "--target", "livez", "--rate", 500,
                           "--seconds", min(plan.http_seconds, 5.0))  # fmt: skip
    out["fsync"] = fsync_latency(service.data_dir)  # beside measure_everysec's
    with FsyncProbe(service.data_dir) as probe:
        out["one"] = loadgen(service, "rest-one", "--model", "rest64", "--dim", 64,
                             "--rate", 500, "--seconds", plan.http_seconds)  # fmt: skip
    out["one"]["fsync_during"] = probe.result()
    service_cpu(out["livez"], cpu)
    service_cpu(out["one"], cpu)
    wait_applied(client, "rest64", 30)
    out["batch"] = []
    for conc in (1, 4):
        r = loadgen(service, "rest-batch", "--model", "rest64", "--dim", 64, "--frame", 256,
                    "--concurrency", conc, "--seconds", plan.batch_seconds)  # fmt: skip
        start, end = r["steady_wall"]
        used = cpu.between(start, end)
        r["cpu_us_per_sample"] = per_sample(used, r["samples_acked"], r["generator_cpu_run_s"])
        out["batch"].append(r)
        wait_applied(client, "rest64", 30)
    for key in ("livez", "one"):
        lat = out[key]["latency"]
        print(f"REST {key}: p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms", flush=True)
    for r in out["batch"]:
        print(f"REST batch 256 x{r['concurrency']}: {r['throughput']:.0f} samples/s", flush=True)
    delete_model(client, "rest64")
    return out


def measure_everysec(tmp: Path, plan: Plan) -> dict[str, Any]:
    """REST single-sample latency at 500 req/s on a second service whose embedded Redis runs
    ``appendfsync everysec`` (same measurement as ``measure_rest``'s, on the same disk), and the
    disk's fsync latency measured just before it."""
    with embedded_service(tmp / "everysec", "everysec") as service:
        out: dict[str, Any] = {"fsync": fsync_latency(service.data_dir)}
        with httpx.Client(base_url=service.url, timeout=60) as client, \
                CpuSampler(service) as cpu:  # fmt: skip
            create_model(client, "rest64", 64)
            with FsyncProbe(service.data_dir) as probe:
                r = loadgen(service, "rest-one", "--model", "rest64", "--dim", 64,
                            "--rate", 500, "--seconds", plan.http_seconds)  # fmt: skip
            r["fsync_during"] = probe.result()
            service_cpu(r, cpu)
            wait_applied(client, "rest64", 30)
            delete_model(client, "rest64")
        out["one"] = r
    lat = out["one"]["latency"]
    print(f"REST one (appendfsync everysec): p50 {lat['p50_ms']:.2f} ms p99 "
          f"{lat['p99_ms']:.2f} ms; fsync p50 {out['fsync']['p50_ms']:.2f} ms",
          flush=True)  # fmt: skip
    return out


def measure_queries(
    service: ServiceProcess,
    client: httpx.Client,
    cpu: CpuSampler,
    plan: Plan,
    tmp: Path,
    rate: float,
) -> dict[str, Any]:
    """Open-loop queries, idle and while WS ingestion runs at ``rate`` samples/s (paced)."""
    create_model(client, "q64", 64)
    loadgen(service, "rest-batch", "--model", "q64", "--dim", 64, "--frame", 256,
            "--concurrency", 2, "--seconds", 1.0)  # fmt: skip
    wait_applied(client, "q64", 30)
    out: dict[str, Any] = {}
    out["distance_idle"] = loadgen(service, "query", "--target", "distance", "--model", "q64",
                                   "--dim", 64, "--rate", 1000,
                                   "--seconds", min(plan.query_seconds, 5.0))  # fmt: skip
    service_cpu(out["distance_idle"], cpu)
    background = tmp / "background.json"  # a paced WS ingestion, as its own process
    seconds = 2 * plan.query_seconds + 3.0
    proc = spawn_loadgen(service, "ws", background, "--model", "q64", "--dim", 64, "--frame", 64,
                         "--encoding", "binary", "--seconds", seconds,
                         "--rate", round(rate))  # fmt: skip
    time.sleep(1.5)
    for target in ("distance", "verify"):
        r = loadgen(service, "query", "--target", target, "--model", "q64", "--dim", 64,
                    "--rate", 1000, "--seconds", plan.query_seconds)  # fmt: skip
        service_cpu(r, cpu)
        out[f"{target}_ingesting"] = r
    proc.wait(seconds + 90)
    out["background_ingestion"] = json.loads(background.read_text())
    for key in ("distance_idle", "distance_ingesting", "verify_ingesting"):
        lat = out[key]["latency"]
        print(f"{key}: p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms", flush=True)
    print(f"background WS ingestion: {out['background_ingestion']['throughput']:.0f} samples/s",
          flush=True)  # fmt: skip
    delete_model(client, "q64")
    return out


def core_gallery(model: dict[str, Any], L: np.ndarray, seed: int = 0) -> dict[str, float]:
    """The core's time for the same one-to-many query (and with a pre-transformed gallery)."""
    rng = np.random.default_rng(seed + 2)
    a = rng.normal(size=model["dim"])
    B = rng.normal(size=(10_000, model["dim"]))
    metric = Learner(learner_config(model))
    metric.set_metric(L)
    metric.squared_distances(a, B)

    def best(fn: Any, reps: int = 15) -> float:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return float(np.min(times)) * 1e3  # best of reps: BLAS timings swing on a shared box

    Z = B @ L.T  # a gallery kept transformed (recomputed only when L changes)
    za = L @ a
    norms = np.einsum("ij,ij->i", Z, Z)  # kept with Z: ||L a - z||^2 = |za|^2 - 2 Z za + |z|^2
    text = json.dumps({"a": a.tolist(), "b": B.tolist()}, separators=(",", ":"))
    return {
        "core_squared_distances_ms": best(lambda: metric.squared_distances(a, B)),
        "core_pretransformed_ms": best(lambda: np.einsum("ij,ij->i", Z - za, Z - za)),
        "core_pretransformed_gemv_ms": best(lambda: norms - 2 * (Z @ za) + za @ za),
        "core_transform_gallery_ms": best(lambda: B @ L.T, reps=5),
        "json_loads_ms": best(lambda: json.loads(text), reps=3),
        "json_to_array_ms": best(lambda: np.asarray(json.loads(text)["b"]), reps=3),
    }


def measure_gallery(service: ServiceProcess, client: httpx.Client, plan: Plan) -> dict[str, Any]:
    model = create_model(client, "g128", 128)
    loadgen(service, "rest-batch", "--model", "g128", "--dim", 128, "--frame", 256,
            "--concurrency", 1, "--seconds", 1.0)  # fmt: skip
    wait_applied(client, "g128", 30)
    out: dict[str, Any] = {"runs": []}
    for decimals, encoding in ((-1, "json"), (4, "json"), (-1, "npz")):
        r = loadgen(service, "gallery", "--model", "g128", "--dim", 128,
                    "--queries", plan.gallery_queries, "--decimals", decimals,
                    "--gallery-encoding", encoding)  # fmt: skip
        out["runs"].append(r)
        print(f"gallery 10000x128 ({encoding}, decimals {r['decimals']}, "
              f"{r['body_bytes'] / 1e6:.1f} MB): p50 {r['latency']['p50_ms']:.0f} ms",
              flush=True)  # fmt: skip
    L = np.array(client.get("/v1/models/g128/metric").json()["L"])
    out["core"] = core_gallery(model, L)
    print(f"core: {out['core']}", flush=True)
    delete_model(client, "g128")
    return out


def core_throughput(model: dict[str, Any], frame: int, n: int) -> float:
    """Samples/s of ``learn_many`` on the stream the service got (same pool, same order), in
    the service's batches (``OPML_BATCH_MAX`` = 4096, at most 2^24 / d^2, at least 32)."""
    d = model["dim"]
    batch = samples_per_batch(d * d, 4096)
    pool = pool_size(frame, d)
    X, y = stream(pool, d)
    reps = -(-n // pool)
    Xs, ys = np.tile(X, (reps, 1))[:n], np.tile(y, reps)[:n]
    labels = [str(v) for v in ys]
    Learner(learner_config(model)).learn_many(Xs[:50], labels[:50])  # warm-up
    learner = Learner(learner_config(model))
    start = time.perf_counter()
    for i in range(0, n, batch):
        learner.learn_many(Xs[i : i + batch], labels[i : i + batch])
    return n / (time.perf_counter() - start)


class FsyncProbe:
    """``fsync_latency``'s probe (write 600 B + fsync) ``rate`` times a second in a thread, on the
    data dir's disk, while a measurement runs: what one fsync cost *during* it (the disk is
    shared, and its fsync latency swings by 10x from one minute to the next)."""

    def __init__(self, directory: Path, rate: float = 20.0) -> None:
        self.path = directory / "fsync-probe-during.bin"
        self.period = 1.0 / rate
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not self._stop.wait(self.period):
                start = time.perf_counter()
                os.write(fd, b"x" * 600)
                os.fsync(fd)
                self.times.append(time.perf_counter() - start)
        finally:
            os.close(fd)
            self.path.unlink()

    def __enter__(self) -> FsyncProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, float]:
        if not self.times:
            return {}
        ms = np.array(self.times) * 1e3
        return {"n": len(ms), "p50_ms": float(np.percentile(ms, 50)),
                "p99_ms": float(np.percentile(ms, 99))}  # fmt: skip


# -- profile ------------------------------------------------------------------------------------

#: Stage of a stack: the first rule whose marker appears in the stack (checked in this order).
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("learn_many (worker thread)", ("Learner.learn_many",)),
    ("worker threads: waiting/bookkeeping", ("Thread._bootstrap",)),
    ("frame JSON parsing (json.loads)", ("_parse (service/api/routes/stream.py",
                                         "JSONDecoder")),
    ("pydantic validation (StreamFrame)", ("model_validate", "pydantic")),
    ("numpy conversion + checks (parsing.samples)", ("samples (service/api/parsing.py",)),
    ("sample fingerprint (sha256)", ("fingerprint (service/engine/runtime.py",)),
    ("vector -> bytes (encode_vector)", ("encode_vector", "ModelRuntime._append.<locals>")),
    ("Lua append: redis-py call (pack, send, parse)", ("Store.append_groups",)),
    ("writer: XRANGE read + RESP parsing", ("Store.read_tail",)),
    ("writer: decode entries, np.stack", ("decode_vector", "Writer._apply")),
    ("snapshot publishing", ("_publish",)),
    ("checkpoints", ("_write_checkpoint",)),
    ("WS ack send (json + framing)", ("send_json", "WebSocket.send")),
    ("/events push", ("model_events",)),
    ("metrics (prometheus)", ("telemetry", "prometheus_client")),
    ("WS frame receive (protocol, queue)", ("receive_text", "websockets_sansio_impl",
                                            "stream_samples")),
    ("redis-py socket writes (wait_for tasks of both calls)", ("redis/asyncio",
                                                               "redis/_parsers")),
    ("event loop itself (uvloop/asyncio, C)", ("",)),
]  # fmt: skip


def classify(frames: list[str]) -> str:
    text = ";".join(frames)
    for stage, markers in STAGES:
        if any(m in text for m in markers):
            return stage
    return STAGES[-1][0]


def read_collapsed(path: Path) -> Counter[str]:
    stages: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        waiting = leaf.startswith(("_worker (concurrent/futures/thread.py:81)",
                                   "Condition.wait", "Queue.get"))  # fmt: skip
        stages["(idle waits, not CPU)" if waiting else classify(frames)] += int(count)
    return stages


def measure_profile(
    service: ServiceProcess, client: httpx.Client, cpu: CpuSampler, plan: Plan, tmp: Path
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """py-spy on the service under WS ingestion (d = 64, 64-sample frames, one connection):
    the breakdown by stage, and py-spy's flame graph and collapsed stacks (by results name)."""
    spy = py_spy()
    if spy is None:
        return {"error": NO_PY_SPY}, {}
    name = "prof64"
    create_model(client, name, 64)
    embedded = service.embedded_redis()
    rclient = None
    if embedded:
        import redis

        rclient = redis.Redis(port=embedded[1])
        rclient.config_resetstat()
    seconds = plan.profile_seconds + 4.0
    result_path = tmp / "profile-ws.json"
    proc = spawn_loadgen(service, "ws", result_path, "--model", name, "--dim", 64, "--frame", 64,
                         "--seconds", seconds)  # fmt: skip
    time.sleep(2.0)
    raw, svg = tmp / "profile.txt", tmp / "profile.svg"
    rate = 100
    spies = [
        subprocess.Popen([spy, "record", "--pid", str(service.pid), "--rate", str(rate),
                          "--duration", str(int(plan.profile_seconds)), "--threads",
                          "--nonblocking", "--format", fmt, "-o", str(path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for fmt, path in (("raw", raw), ("flamegraph", svg))
    ]  # fmt: skip
    t0 = time.time()
    seq0 = client.get(f"/v1/models/{name}").json()["logged_seq"]
    errors = [p.communicate(timeout=plan.profile_seconds + 60)[1].decode() for p in spies]
    t1 = time.time()
    seq1 = client.get(f"/v1/models/{name}").json()["logged_seq"]
    proc.wait(seconds + 90)
    commandstats: dict[str, Any] = {}
    if rclient is not None:
        commandstats = {k: v for k, v in rclient.info("commandstats").items()
                        if k in ("cmdstat_evalsha", "cmdstat_xrange", "cmdstat_exec",
                                 "cmdstat_hmget")}  # fmt: skip
        rclient.close()
    ws = json.loads(result_path.read_text())
    delete_model(client, name)
    if not raw.exists():
        return {"error": "py-spy could not attach: " + " | ".join(errors)[-500:]}, {}
    artifacts = {"service_load_profile.txt": raw.read_bytes()}
    if svg.exists():
        artifacts["service_load_profile.svg"] = svg.read_bytes()
    samples = seq1 - seq0
    stages = read_collapsed(raw)
    used = cpu.between(t0, t1)
    breakdown = [
        {"stage": stage, "py_spy_samples": n, "us_per_sample": n / rate / samples * 1e6,
         "share": n / sum(stages.values())}
        for stage, n in stages.most_common()
    ]  # fmt: skip
    return {
        "samples_acked": samples,
        "seconds": t1 - t0,
        "throughput_under_profiler": samples / (t1 - t0),
        "throughput_loadgen": ws["throughput"],
        "rate_hz": rate,
        "breakdown": breakdown,
        "cpu_us_per_sample": per_sample(used, samples, 0.0)
        | {"generator": ws["generator_cpu_run_s"] / max(ws["samples_acked"], 1) * 1e6},
        "cpu_util": {k: v / (t1 - t0) for k, v in used.items()},
        "redis_commandstats": commandstats,
        "frames_per_s": samples / 64 / (t1 - t0),
    }, artifacts


# -- report -------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 1) -> str:
    if value is None or not np.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def verdict(value: float, target: float, higher_is_better: bool) -> str:
    if not np.isfinite(value):
        return "-"
    ok = value >= target if higher_is_better else value <= target
    ratio = value / target
    return f"{ratio:.2f}x of target, {'met' if ok else 'MISSED'}"


#: What a 202 / ack means under each embedded-Redis AOF fsync policy (see fsync_modes_section).
GUARANTEE = {
    "always": "on disk: survives power loss / a kernel crash, and any process crash",
    "everysec": "in the OS page cache: survives a crash of the service or of redis-server "
    "(but see the exception below); the last ~1 s can be lost on power loss / a kernel crash",
}


def fsync_modes_section(rest: dict[str, Any], everysec: dict[str, Any]) -> list[str]:
    """The report's side-by-side REST single-sample latency, ``always`` vs ``everysec``."""
    one = rest["one"]
    lines = [
        "",
        "## A single durable request: `appendfsync always` vs `everysec`",
        "",
        f"The REST single-sample measurement above (d = 64, {one['offered_rate']:.0f} requests/s "
        "offered, open loop), on this run's service (embedded Redis with `appendfsync always`, "
        "the default) and on a second service started with `OPML_REDIS_APPENDFSYNC=everysec` "
        "(data dir on the same disk). Disk fsync: 600 B append + fsync of a file in the data "
        "dir, 200 times back to back just before the run, and 20 times a second during it.",
        "",
        "| `OPML_REDIS_APPENDFSYNC` | a 202 means the sample is | disk fsync before, p50 / p99 "
        "(ms) | disk fsync during | answered (req/s) | p50 (ms) | p90 | p99 | p99.9 | max | "
        "non-2xx | CPU per request (us): service / redis |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fsync(fs: dict[str, float] | None) -> str:
        return f"{_f(fs['p50_ms'], 2)} / {_f(fs['p99_ms'], 2)}" if fs else "-"

    for mode, r, before in (("always", one, rest.get("fsync")),
                            ("everysec", everysec["one"], everysec.get("fsync"))):  # fmt: skip
        lat = r["latency"]
        lines.append(
            f"| `{mode}` | {GUARANTEE[mode]} | {fsync(before)} | {fsync(r.get('fsync_during'))} | "
            f"{r['achieved_rate']:.0f} | "
            f"{_f(lat['p50_ms'], 2)} | {_f(lat['p90_ms'], 2)} | {_f(lat['p99_ms'], 2)} | "
            f"{_f(lat['p999_ms'], 2)} | {_f(lat['max_ms'], 1)} | {r['requests'] - r['ok']} | "
            f"{_f(r.get('service_cpu_us_per_request'), 0)} / "
            f"{_f(r.get('redis_cpu_us_per_request'), 0)} |"
        )
    lines += [
        "",
        "Why, under `always`, one request cannot be faster than one fsync of the disk: the "
        "service answers 202 only after the Lua append returned, and redis-server sends no "
        "reply before the AOF is written. Its `beforeSleep()` calls `flushAppendOnlyFile()` "
        'before it writes the pending replies ("must be done before '
        'handleClientsWithPendingWrites, in case of appendfsync=always", redis/redis '
        "`src/server.c`), and under `always` `flushAppendOnlyFile()` (`src/aof.c`) write()s the "
        "buffered commands and then fdatasync()s the file before it returns. A request that "
        "arrives alone therefore waits for at least one whole fsync (the disk's fsync above, "
        "measured during the run) on top of the HTTP and Lua path (the `everysec` row: the "
        "same path without waiting for the fsync). Requests that arrive together share one "
        "write + fsync (group commit in the service, and Redis's one flush per event-loop "
        "turn), which is why "
        "batches and WebSocket frames are not limited to one fsync per sample, but a lone "
        "request is. A single-request p99 below 5 ms under `always` needs the service path "
        "(the `everysec` row) plus one fsync to stay below 5 ms: on a disk whose fsync p99 "
        "alone exceeds that, no change to the service gets there, only a disk with fast "
        "durable writes (NVMe with power-loss protection, a battery-backed write cache).",
        "",
        "What each policy guarantees for an acknowledged sample (the service crashing loses "
        "nothing acknowledged under any policy: redis-server holds it):",
        "",
        "- `always`: on disk before the 202 / ack: it survives a crash of the service or of "
        "redis-server and a power loss or kernel crash.",
        "- `everysec`: the reply still waits for Redis's write() of the AOF (the ordering above "
        "holds for every policy), so the sample is in the kernel's page cache: it survives a "
        "crash (even `kill -9`) of the service or of redis-server, because the kernel still "
        "writes the page back. The fsync runs in a background thread about once a second, so a "
        "power loss or kernel crash can lose up to about the last second of acknowledged "
        'samples (redis.conf: with the everysec default "Redis can lose just one second of '
        'writes in a dramatic event like a server power outage"). One exception, in '
        "`flushAppendOnlyFile()`: while a background fsync is still running, Redis postpones "
        "the write() (for at most 2 s, counted in `INFO persistence` `aof_delayed_fsync` "
        "when it gives up waiting) and keeps replying meanwhile, so acks given in that window "
        "(about one fsync time per second on a healthy disk, up to 2 s on a saturated one) are "
        "only in redis-server's memory and are lost if redis-server itself crashes; on a "
        "saturated disk a power loss can cost ~2-3 s.",
    ]
    return lines


def header_section(data: dict[str, Any], quick: bool) -> list[str]:
    """Title, command, machine, load and the disk's fsync latency."""
    return [
        "# Service load: ingestion, queries, overhead (embedded Redis, appendfsync always)",
        "",
        "Generated by `benchmarks/service_load.py`; do not edit by hand. Command (repository "
        "root):",
        "",
        f"    {data['command']}",
        "",
        machine_block(data["machine"]),
        f"- Load average (1, 5, 15 min) at start: {data['load_start']}, at end: "
        f"{data['load_end']}; wall time {data['wall_s']:.0f} s"
        + (" (**--quick**: short smoke run, indicative only)" if quick else ""),
        f"- fsync (600 B append) on the data dir's disk: p50 {data['fsync']['p50_ms']:.2f} ms, "
        f"p99 {data['fsync']['p99_ms']:.2f} ms",
        "",
        "The service, its redis-server and the load generator (a separate process) share the 2 "
        "cores. Model: the contract's defaults (`copml`, gamma 1e-3, margin 1) with "
        "`normalize: l2`; stream: unit-norm Gaussian vectors, 10 classes cycling.",
    ]


def ws_target_rows(ws: list[dict[str, Any]]) -> list[str]:
    """Targets table: WebSocket throughput and learner lag, by frame encoding."""
    encodings = [e for e in ENCODINGS if any(encoding_of(r) == e for r in ws)]
    lines = []
    for enc in encodings:
        keeping_up = [
            r
            for r in ws
            if r["dim"] == 64 and r["connections"] == 1 and encoding_of(r) == enc
            and r.get("lag", {}).get("p99_ms", 1e9) < 100
        ]  # fmt: skip
        if keeping_up:
            r = max(keeping_up, key=lambda r: r["throughput"])
            lines.append(
                f"| WS d = 64, {enc} frames, fastest frame size whose learner lag p99 stays "
                f"< 100 ms (frame {r['frame']}) | {_f(r['throughput'], 0)} samples/s, lag p99 "
                f"{_f(r['lag']['p99_ms'])} ms | >= 20,000 | "
                f"{verdict(r['throughput'], TARGETS['ws64_throughput'], True)} |"
            )
    for d in (64, 512):
        for enc in encodings:
            r = best_ws(ws, d, enc)
            target = TARGETS["ws64_throughput"] if d == 64 else None
            lines.append(
                f"| WS durable ingestion, d = {d}, **{enc}** frames (best frame size: "
                f"{r['frame']}) | {_f(r['throughput'], 0)} samples/s | "
                f"{'>= 20,000' if target else '-'} | "
                f"{verdict(r['throughput'], target, True) if target else '-'} |"
            )
            lag = r.get("lag", {})
            lines.append(
                f"| learner lag (ack -> applied) at that rate, d = {d}, {enc} | p50 "
                f"{_f(lag.get('p50_ms'))} ms, p99 {_f(lag.get('p99_ms'))} ms | "
                f"{'p99 < 100 ms' if d == 64 else '-'} | "
                f"{verdict(lag.get('p99_ms', float('nan')), 100.0, False) if d == 64 else '-'} |"
            )
    return lines


def http_target_rows(rest: dict[str, Any], q: dict[str, Any]) -> list[str]:
    """Targets table: REST single sample (both fsync policies), batches, queries."""
    lines = []
    for mode, r in (("always", rest["one"]), ("everysec", rest.get("everysec", {}).get("one"))):
        if r is None:
            continue
        one = r["latency"]
        lines.append(
            f"| REST single sample at 500 req/s offered (achieved {r['achieved_rate']:.0f}), "
            f"`appendfsync {mode}` | p50 {_f(one['p50_ms'], 2)} ms, p99 "
            f"{_f(one['p99_ms'], 2)} ms | p99 < 5 ms | {verdict(one['p99_ms'], 5.0, False)} |"
        )
    bb = max(rest["batch"], key=lambda r: r["throughput"])
    lines.append(
        f"| REST batch throughput (256 per request, {bb['concurrency']} in flight) | "
        f"{_f(bb['throughput'], 0)} samples/s | - | - |"
    )
    for key, label in (("distance_ingesting", "distance"), ("verify_ingesting", "verify")):
        lat = q[key]["latency"]
        lines.append(
            f"| {label} at 1,000 req/s offered during ingestion | p50 {_f(lat['p50_ms'], 2)} ms,"
            f" p99 {_f(lat['p99_ms'], 2)} ms | p99 < 5 ms | {verdict(lat['p99_ms'], 5.0, False)}"
            " |"
        )
    return lines


def gallery_target_rows(gal: dict[str, Any]) -> list[str]:
    """Targets table: one-to-many distance through the service and in the core."""
    g_full = gal["runs"][0]
    lines = [
        f"| one-to-many distance, 10,000 x 128 (service, JSON {g_full['body_bytes'] / 1e6:.0f} "
        f"MB body) | {_f(g_full['latency']['p50_ms'], 0)} ms per query | < 5 ms | "
        f"{verdict(g_full['latency']['p50_ms'], 5.0, False)} |"
    ]
    npz = [r for r in gal["runs"] if r.get("encoding") == "npz"]
    if npz:
        g_npz = npz[0]
        lines.append(
            f"| one-to-many distance, 10,000 x 128 (service, `.npz` body "
            f"{g_npz['body_bytes'] / 1e6:.0f} MB, `.npy` answer) | "
            f"{_f(g_npz['latency']['p50_ms'], 1)} ms per query | < 5 ms | "
            f"{verdict(g_npz['latency']['p50_ms'], 5.0, False)} |"
        )
    lines.append(
        f"| same, core `squared_distances` alone / gallery pre-transformed | "
        f"{_f(gal['core']['core_squared_distances_ms'], 2)} ms / "
        f"{_f(gal['core']['core_pretransformed_ms'], 2)} ms | < 5 ms | "
        f"{verdict(gal['core']['core_squared_distances_ms'], 5.0, False)} |"
    )
    return lines


def overhead_rows(ws: list[dict[str, Any]], core: dict[str, Any]) -> list[str]:
    """Targets table: best WebSocket throughput / core ``learn_many`` throughput."""
    lines = []
    for d in (64, 512):
        best = best_ws(ws, d)
        ratio = best["throughput"] / core[str(d)]["samples_per_s"]
        lines.append(
            f"| service overhead ratio, d = {d}: best WS throughput ({encoding_of(best)} "
            f"frames of {best['frame']}) / core `learn_many` "
            f"({_f(core[str(d)]['samples_per_s'], 0)} samples/s, same stream) | {ratio:.3f} | "
            "- | - |"
        )
    return lines


def targets_section(data: dict[str, Any]) -> list[str]:
    """Every measurement against the targets of issue 7."""
    return [
        "",
        "## Against the targets of issue 7",
        "",
        "| measurement | figure | target | verdict |",
        "|---|---|---|---|",
        *ws_target_rows(data["ws"]),
        *http_target_rows(data["rest"], data["queries"]),
        *gallery_target_rows(data["gallery"]),
        *overhead_rows(data["ws"], data["core"]),
    ]


def ws_section(ws: list[dict[str, Any]]) -> list[str]:
    """WebSocket ingestion, one row per (d, frame, encoding, connections)."""
    lines = [
        "",
        "## WebSocket ingestion by frame size",
        "",
        "One connection (unless stated), at most 32 unacknowledged frames (= `OPML_WS_WINDOW`). "
        "Throughput counts samples acknowledged (durable) after a warm-up. Lag: ack received -> "
        "first `/events` frame (every >= 10 ms) whose `version` covers the ack's `last_seq`; an "
        "upper bound, late by 0-10 ms. CPU: microseconds per acknowledged sample (event-loop "
        "thread / worker threads of the service, redis-server, load generator). Event-loop "
        "ceiling: 1 s / loop CPU per sample, the rate at which the service's single event-loop "
        "thread would be 100 % busy (a whole core to itself). Encoding: `json` text frames "
        "(vectors in full float64 repr) or the service's `binary` frames (uint32 header length, "
        "JSON header `{id, y}`, raw little-endian float64 block); bytes/sample: mean frame size "
        "/ frame.",
        "",
        "| d | frame | encoding | bytes/sample | conns | samples/s | frames/s | frame RTT p50 / "
        "p99 (ms) | lag p50 / p99 (ms) | catch-up after stop (s) | CPU us/sample: loop / "
        "workers / redis / generator | event-loop ceiling (samples/s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ws:
        lag = r.get("lag", {})
        c = r.get("cpu_us_per_sample", {})
        catch = r.get("catch_up_s")
        size = r["frame_bytes"] / r["frame"] if r.get("frame_bytes") else None
        lines.append(
            f"| {r['dim']} | {r['frame']} | {encoding_of(r)} | {_f(size, 0)} | "
            f"{r['connections']} | {_f(r['throughput'], 0)}"
            + (f" ({r['frame_errors']} frames refused)" if r.get("frame_errors") else "")
            + " | "
            f"{_f(r['frames_per_s'], 0)} | {_f(r['frame_rtt'].get('p50_ms'))} / "
            f"{_f(r['frame_rtt'].get('p99_ms'))} | {_f(lag.get('p50_ms'))} / "
            f"{_f(lag.get('p99_ms'))}"
            + (f" ({r['lag_unapplied']} acks not applied in time)" if r.get("lag_unapplied")
               else "")
            + f" | {_f(catch, 2) if catch is not None else 'not caught up'} | "
            f"{_f(c.get('service_loop'), 0)} / {_f(c.get('service_workers'), 0)} / "
            f"{_f(c.get('redis'), 0)} / {_f(c.get('generator'), 0)} | "
            f"{_f(1e6 / c['service_loop'], 0) if c.get('service_loop') else '-'} |"
        )  # fmt: skip
    return lines


def http_section(rest: dict[str, Any], q: dict[str, Any]) -> list[str]:
    """Open-loop REST and query latencies, the background ingestion, REST batches."""
    lines = [
        "",
        "## REST and queries (open loop: fixed timetable, latency from the scheduled time)",
        "",
        "| what | offered / answered (req/s) | p50 (ms) | p90 | p99 | p99.9 | max | generator "
        "lateness p99 (ms) | non-2xx | service CPU per request (us) | service CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    everysec = rest.get("everysec")
    for label, r in (
        ("`GET /livez` (HTTP stack floor)", rest["livez"]),
        ("REST single sample (202 = on disk, `appendfsync always`)", rest["one"]),
        ("REST single sample, `appendfsync everysec` (second service, see below)",
         everysec["one"] if everysec else None),
        ("distance, idle", q["distance_idle"]),
        ("distance, during WS ingestion", q["distance_ingesting"]),
        ("verify, during WS ingestion", q["verify_ingesting"]),
    ):  # fmt: skip
        if r is None:
            continue
        lat = r["latency"]
        bad = r["requests"] - r["ok"]
        lines.append(
            f"| {label} | {r['offered_rate']:.0f} / {r['achieved_rate']:.0f} | "
            f"{_f(lat['p50_ms'], 2)} | {_f(lat['p90_ms'], 2)} | {_f(lat['p99_ms'], 2)} | "
            f"{_f(lat['p999_ms'], 2)} | {_f(lat['max_ms'], 1)} | "
            f"{_f(r['lateness']['p99_ms'], 2)} | {bad} | "
            f"{_f(r.get('service_cpu_us_per_request'), 0)} | "
            f"{_f(sum(v for k, v in r.get('cpu_util', {}).items() if k != 'redis'), 2)} |"
        )
    bg = q["background_ingestion"]
    lines += [
        "",
        f"Background ingestion during the queries: {_f(bg['throughput'], 0)} samples/s "
        f"acknowledged, paced at {_f(bg['offered_rate'], 0)} samples/s offered (the issue's "
        "WS ingestion target; d = 64, 64-sample binary frames as the SDK sends them, one "
        "connection).",
        "",
        "REST batches (closed loop, 256 samples per request):",
        "",
        "| in flight | samples/s | request p50 / p99 (ms) | CPU us/sample: loop / workers / "
        "redis / generator |",
        "|---|---|---|---|",
    ]
    for r in rest["batch"]:
        c = r.get("cpu_us_per_sample", {})
        lines.append(
            f"| {r['concurrency']} | {_f(r['throughput'], 0)} | {_f(r['latency']['p50_ms'])} / "
            f"{_f(r['latency']['p99_ms'])} | {_f(c.get('service_loop'), 0)} / "
            f"{_f(c.get('service_workers'), 0)} / {_f(c.get('redis'), 0)} / "
            f"{_f(c.get('generator'), 0)} |"
        )
    return lines


def gallery_section(gal: dict[str, Any]) -> list[str]:
    """One-to-many distance: each service path beside the core's own times."""
    lines = [
        "",
        "## One-to-many distance, 10,000 x 128",
        "",
        "| path | per query (ms) |",
        "|---|---|",
    ]
    for r in gal["runs"]:
        if r.get("encoding") == "npz":
            what = f"`.npz` body {r['body_bytes'] / 1e6:.1f} MB (float64), `.npy` answer"
        else:
            digits = "full float64 repr" if r["decimals"] is None else f"{r['decimals']} decimals"
            what = f"JSON body {r['body_bytes'] / 1e6:.1f} MB ({digits})"
        lines.append(
            f"| service, {what}, p50 of {r['latency']['n']} | {_f(r['latency']['p50_ms'], 1)} |"
        )
    c = gal["core"]
    return [
        *lines,
        f"| core `Learner.squared_distances(a, B)` (best of 15, as all core rows) | "
        f"{_f(c['core_squared_distances_ms'], 2)} |",
        f"| core, gallery kept transformed (`Z = B L^T` cached; `||L a - z_i||^2`) | "
        f"{_f(c['core_pretransformed_ms'], 2)} |",
        f"| core, gallery kept transformed with its row norms (one GEMV: "
        f"`|L a|^2 - 2 Z L a + |z_i|^2`) | {_f(c.get('core_pretransformed_gemv_ms'), 2)} |",
        f"| (re-)transforming the gallery, `B L^T`, once per new `L` | "
        f"{_f(c.get('core_transform_gallery_ms'), 2)} |",
        f"| `json.loads` of the full-precision body alone (this process) | "
        f"{_f(c['json_loads_ms'], 0)} |",
        f"| `json.loads` + `np.asarray` of the gallery | {_f(c['json_to_array_ms'], 0)} |",
    ]


def profile_section(prof: dict[str, Any] | None) -> list[str]:
    """The py-spy profile by stage (or why there is none)."""
    if not prof:
        return []
    if "breakdown" not in prof:
        return ["", f"Profile: {prof.get('error')}"]
    lines = [
        "",
        "## Where the time goes (py-spy, WS ingestion d = 64, 64-sample frames)",
        "",
        f"{prof['samples_acked']:,} samples acknowledged in {prof['seconds']:.1f} s under "
        f"the profiler ({_f(prof['throughput_under_profiler'], 0)} samples/s; "
        f"{_f(prof['frames_per_s'], 0)} frames/s). CPU per acknowledged sample (/proc): "
        + ", ".join(f"{k} {_f(v, 0)} us" for k, v in prof["cpu_us_per_sample"].items())
        + "; utilisation (cores): "
        + ", ".join(f"{k} {v:.2f}" for k, v in prof["cpu_util"].items())
        + ". Service stages (py-spy at "
        f"{prof['rate_hz']} Hz, all threads, idle excluded; us of thread time per "
        "acknowledged sample):",
        "",
        "| stage | us / sample (py-spy) | scaled to /proc CPU | share |",
        "|---|---|---|---|",
    ]
    busy = [b for b in prof["breakdown"] if not b["stage"].startswith("(idle")]
    spy_total = sum(b["us_per_sample"] for b in busy)
    cpu = prof["cpu_us_per_sample"]
    proc_total = cpu.get("service_loop", 0.0) + cpu.get("service_workers", 0.0)
    scale = proc_total / spy_total if spy_total else float("nan")
    for b in busy:
        lines.append(
            f"| {b['stage']} | {_f(b['us_per_sample'])} | {_f(b['us_per_sample'] * scale)} | "
            f"{b['us_per_sample'] / spy_total:.1%} |"
        )
    lines += [
        f"| **total** | {_f(spy_total)} | {_f(proc_total)} | 100% |",
        "",
        f"py-spy counts a thread that is runnable but waiting for a CPU as busy (the machine "
        f"is shared), so its total exceeds the CPU the kernel accounted to the service "
        f"threads; the third column scales the stages to the /proc figure (x{scale:.2f}).",
    ]
    stats = prof.get("redis_commandstats", {})
    if stats:
        lines += ["", "Redis `INFO commandstats` during the profile:", ""]
        for k, v in stats.items():
            lines.append(
                f"- `{k[8:]}`: {v['calls']} calls, {v['usec_per_call']:.1f} us per call "
                "(execution only; the AOF write + fsync happen after it, before the reply)"
            )
    return [*lines, "", "Flame graph and collapsed stacks (not tracked): "
            "`benchmarks/results/profiles/service_load_profile.{svg,txt}`."]  # fmt: skip


def report(data: dict[str, Any], quick: bool) -> str:
    """The markdown of a run (``data`` as measured, or as saved in the JSON)."""
    everysec = data["rest"].get("everysec")
    lines = [
        *header_section(data, quick),
        *targets_section(data),
        *ws_section(data["ws"]),
        *http_section(data["rest"], data["queries"]),
        *(fsync_modes_section(data["rest"], everysec) if everysec else []),
        *gallery_section(data["gallery"]),
        *profile_section(data.get("profile")),
        "",
        "![service load](service_load.png)",
        "",
    ]
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    ws = [r for r in data["ws"] if r["connections"] == 1]
    frames = sorted({r["frame"] for r in ws})
    series = [(d, enc) for d in (64, 512) for enc in ENCODINGS
              if any(r["dim"] == d and encoding_of(r) == enc for r in ws)]  # fmt: skip
    width = 0.8 / len(series)
    for k, (d, enc) in enumerate(series):
        vals = [next((r["throughput"] for r in ws if r["dim"] == d and r["frame"] == f
                      and encoding_of(r) == enc), 0.0)
                for f in frames]  # fmt: skip
        xs = np.arange(len(frames)) + (k - (len(series) - 1) / 2) * width
        color = f"C{(0 if d == 64 else 1) * 2 + (0 if enc == 'json' else 1)}"
        ax.bar(xs, vals, width, color=color, label=f"service WS, d = {d}, {enc}")
    for k, d in enumerate((64, 512)):
        ax.axhline(data["core"][str(d)]["samples_per_s"], ls=":", color=f"C{2 * k}",
                   label=f"core learn_many, d = {d}")  # fmt: skip
    ax.axhline(TARGETS["ws64_throughput"], color="red", ls="--", label="target d = 64")
    ax.set_xticks(np.arange(len(frames)), [str(f) for f in frames])
    ax.set_yscale("log")
    ax.set_xlabel("samples per WS frame")
    ax.set_ylabel("durable samples/s")
    ax.set_title("WebSocket ingestion throughput (1 connection)")
    ax.legend(fontsize=7)

    def ccdf(ax: Any, summary: dict[str, Any], label: str, **style: Any) -> None:
        if not summary.get("cdf"):
            return
        pts = np.array(summary["cdf"])
        ax.plot(pts[:, 1], np.maximum(1 - pts[:, 0], 1e-4), label=label, **style)

    ax = axes[0][1]
    for r in data["ws"]:
        if "lag" in r:
            enc = encoding_of(r)
            label = f"d={r['dim']} frame={r['frame']} {enc} c={r['connections']}"
            ccdf(ax, r["lag"], label, ls="--" if enc == "binary" else "-")
    ax.axvline(TARGETS["ws64_lag_p99_ms"], color="red", ls="--", label="target p99 (d=64)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("learner lag, ack -> applied (ms)")
    ax.set_ylabel("fraction above (1 - CDF)")
    ax.set_title("Learner lag at the measured rates")
    ax.legend(fontsize=6)

    ax = axes[1][0]
    rest, q = data["rest"], data["queries"]
    if "everysec" in rest:
        ccdf(ax, rest["everysec"]["one"]["latency"], "REST 1 sample @500/s, everysec", ls="--")
    for label, r in (("GET /livez @500/s", rest["livez"]), ("REST 1 sample @500/s", rest["one"]),
                     ("distance idle @1000/s", q["distance_idle"]),
                     ("distance + ingestion @1000/s", q["distance_ingesting"]),
                     ("verify + ingestion @1000/s", q["verify_ingesting"])):  # fmt: skip
        ccdf(ax, r["latency"], label)
    ax.axvline(5.0, color="red", ls="--", label="target p99 5 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency from scheduled send (ms)")
    ax.set_ylabel("fraction above (1 - CDF)")
    ax.set_title("Open-loop HTTP latency")
    ax.legend(fontsize=7)

    ax = axes[1][1]
    prof = data.get("profile", {})
    if "breakdown" in prof:
        rows = [b for b in prof["breakdown"] if b["stage"] != "(idle waits, not CPU)"][::-1]
        ax.barh([b["stage"] for b in rows], [b["us_per_sample"] for b in rows])
        ax.set_xlabel("us of service thread time per acknowledged sample")
        ax.set_title("Service profile, WS d = 64, 64-sample frames (py-spy)")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(plan: Plan, profile: bool) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Every measurement of a run: the figures (what the JSON keeps) and the profiler's files
    (``service_load_profile.svg``/``.txt``, by name)."""
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str, since: float) -> float:
        now = time.monotonic()
        phases[name] = round(now - since, 1)
        return now

    data: dict[str, Any] = {"load_start": [round(v, 2) for v in os.getloadavg()],
                            "quick": plan.quick}  # fmt: skip
    artifacts: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="opml-load-") as tmp_name:
        tmp = Path(tmp_name)
        with embedded_service(tmp / "always", "always") as service:
            t = phase("start", started)
            data["fsync"] = fsync_latency(service.data_dir)
            with httpx.Client(base_url=service.url, timeout=60) as client, \
                    CpuSampler(service) as cpu:  # fmt: skip
                data["ws"] = measure_ws(service, client, cpu, plan)
                t = phase("ws", t)
                data["rest"] = measure_rest(service, client, cpu, plan)
                t = phase("rest", t)
                data["rest"]["everysec"] = measure_everysec(tmp, plan)
                t = phase("rest_everysec", t)
                # queries while ingesting at the ingestion target (20,000 samples/s, binary)
                data["queries"] = measure_queries(service, client, cpu, plan, tmp, 20_000)
                t = phase("queries", t)
                data["gallery"] = measure_gallery(service, client, plan)
                t = phase("gallery", t)
                if profile:
                    data["profile"], artifacts = measure_profile(service, client, cpu, plan, tmp)
                    t = phase("profile", t)
                model = create_model(client, "core-config", 64)
                delete_model(client, "core-config")
    data["core"] = {}
    for d in (64, 512):
        best = best_ws(data["ws"], d)
        n = 20_000 if d == 64 else 3_000
        rate = core_throughput({**model, "dim": d}, best["frame"], n // (4 if plan.quick else 1))
        data["core"][str(d)] = {"samples_per_s": rate, "us_per_sample": 1e6 / rate,
                                "frame_of_stream": best["frame"]}  # fmt: skip
        print(f"core learn_many d={d}: {rate:.0f} samples/s", flush=True)
    phase("core", t)
    data["phase_s"] = phases
    data["load_end"] = [round(v, 2) for v in os.getloadavg()]
    data["wall_s"] = time.monotonic() - started
    data["machine"] = machine_info()
    data["command"] = command_line("benchmarks.perf.service_load")
    return data, artifacts


def write_results(data: dict[str, Any], quick: bool, artifacts: dict[str, bytes]) -> str:
    """``service_load.{md,json,png}`` and the profiler's files under
    ``benchmarks/results/``; returns the markdown."""
    stem = result_stem("service_load", quick)
    text = report(data, quick)
    write_files(stem, [text], data)
    plot(data, suffixed(stem, ".png"))
    PROFILES_DIR.mkdir(parents=True, exist_ok=True)
    for name, content in artifacts.items():
        (PROFILES_DIR / name).write_bytes(content)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profile")
    parser.add_argument(
        "--wait-load", type=float, default=0.0,
        help="first wait (up to 5 min) until the 1-minute load average is below this",
    )  # fmt: skip
    parser.add_argument(
        "--report-only", action="store_true",
        help="re-render the .md and .png from the saved .json (no measurement)",
    )  # fmt: skip
    args = parse(parser, argv)
    if args.report_only:
        stem = result_stem("service_load", args.quick)
        data = json.loads(suffixed(stem, ".json").read_text())
        suffixed(stem, ".md").write_text(report(data, args.quick))
        plot(data, suffixed(stem, ".png"))
        return
    if args.wait_load:
        deadline = time.monotonic() + 300
        while os.getloadavg()[0] >= args.wait_load and time.monotonic() < deadline:
            time.sleep(5)
    data, artifacts = measure(Plan(quick=args.quick), profile=not args.no_profile)
    print(write_results(data, args.quick, artifacts))


if __name__ == "__main__":
    main()
