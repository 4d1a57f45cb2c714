"""Query overhead, before / after: service CPU per request and latency of the query routes.

    .venv/bin/python -m benchmarks.query_overhead --baseline /path/to/old/checkout [--quick]

Starts ``python -m service`` from this checkout ("after") and, with ``--baseline``, from another
checkout of the repository ("before", e.g. ``git worktree add /tmp/base <commit>``), each on
its own embedded Redis in a temporary dir, both running at once, and measures them in
alternation (``--rounds`` rounds; figures are the median over rounds), from this process:

* ``GET /livez``, ``distance`` and ``verify`` (d = 64, one pair each) at ``--rate`` requests/s
  offered, open loop (fixed timetable, latency from the scheduled time, at most 64
  connections): p50 / p99 latency and the service's CPU per request (utime + stime of all its
  threads from ``/proc``, over the run, divided by the answers);
* ``distance`` and ``verify`` at the same rate while a WebSocket ingestion (a separate process,
  JSON frames of 64 samples, ``--ingest-rate`` samples/s) feeds the same model;
* one-to-many ``distance`` of one vector against 10,000 x 128: a full-precision JSON body
  (~25 MB), the ``.npz`` body with a JSON answer, and ``.npz`` with ``Accept:
  application/x-npy``; sequential queries; latency per query and service CPU per query.
  ("before" has no binary gallery: n/a.)

The machine is shared and noisy: compare the ratios. Nothing is asserted. Writes
``benchmarks/results/query_overhead{,_quick}.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import RESULTS_DIR, command_line, machine_block, machine_info

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
D, GALLERY_D, GALLERY_N = 64, 128, 10_000
MODEL = {"normalize": "l2"}  # as benchmarks.service_load: the contract's defaults, l2


# -- the services under test ------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Service:
    """``python -m service`` from ``root`` (its own code), embedded Redis in ``tmp``."""

    label: str
    root: Path
    tmp: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Service:
        env = {
            **os.environ,
            "OPML_PORT": str(self.port),
            "OPML_DATA_DIR": str(self.tmp / "data"),
            "OPML_LOG_LEVEL": "warning",
            "PYTHONPATH": str(self.root),
        }
        env.pop("OPML_REDIS_URL", None)
        log = open(self.tmp / "service.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=self.root, env=env, stdout=log, stderr=log
        )
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.tmp / "service.log").read_text()[-3000:])
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError((self.tmp / "service.log").read_text()[-3000:])
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cpu(self) -> float:
        """CPU seconds (user + system) of every thread of the service process."""
        assert self.proc is not None
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / CLK_TCK


def prepare(service: Service) -> None:
    """Models ``q64`` (d = 64) and ``g128`` (d = 128), each fed 512 samples and applied."""
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=service.url, timeout=120) as client:
        for name, d in (("q64", D), ("g128", GALLERY_D)):
            client.post("/v1/models", json={"name": name, "dim": d, **MODEL}).raise_for_status()
            X = rng.normal(size=(512, d))
            samples = [{"x": x.tolist(), "y": int(i % 10)} for i, x in enumerate(X)]
            answer = client.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples})
            answer.raise_for_status()


# -- a lean HTTP/1.1 client (the generator's own cost stays small) ------------------------------


class _Closed(Exception):
    """The server closed the connection before answering."""


class Pool:
    """Keep-alive connections (at most ``size``); FIFO hand-over to waiting requests."""

    def __init__(self, url: str, size: int = 64) -> None:
        parts = httpx.URL(url)
        self.host, self.port, self.size = parts.host, parts.port or 80, size
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.waiters: list[asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = []
        self.opened = 0

    async def _acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.idle:
            return self.idle.pop()
        if self.opened < self.size:
            self.opened += 1
            return await asyncio.open_connection(self.host, self.port, limit=2**26)
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        return await waiter

    def _release(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        if conn is None:
            self.opened -= 1
            return
        while self.waiters:
            waiter = self.waiters.pop(0)
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        """One request; sent again once on a fresh connection if the server had closed the
        idle one it went out on (uvicorn closes keep-alive connections idle for 5 s)."""
        try:
            return await self._request(method, path, body, headers)
        except (ConnectionError, asyncio.IncompleteReadError, _Closed):
            return await self._request(method, path, body, headers)

    async def _request(
        self, method: str, path: str, body: bytes, headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = await self._acquire()
        assert conn is not None
        reader, writer = conn
        try:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{headers}"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
            status_line = await reader.readline()
            if not status_line:
                raise _Closed
            status = int(status_line.split()[1])
            fields: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode("latin-1").partition(":")
                fields[key.strip().lower()] = value.strip()
            return status, fields, await reader.readexactly(int(fields["content-length"]))
        except BaseException:
            writer.close()
            conn = None
            raise
        finally:
            self._release(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


JSON_HEADERS = "Content-Type: application/json\r\n"


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "n": int(ms.size),
    }


async def open_loop(
    service: Service, method: str, path: str, bodies: list[bytes], rate: float, seconds: float
) -> dict[str, Any]:
    """``rate`` requests/s on a fixed timetable; latency from each scheduled time."""
    pool = Pool(service.url)
    headers = JSON_HEADERS if method == "POST" else ""
    for i in range(50):  # warm up the connections and the route
        await pool.request(method, path, bodies[i % len(bodies)], headers)
    n = int(rate * seconds)
    latency = [float("nan")] * n
    errors = 0
    tasks = set()

    async def one(i: int, scheduled: float) -> None:
        nonlocal errors
        try:
            status, _, _ = await pool.request(method, path, bodies[i % len(bodies)], headers)
        except (OSError, ValueError, IndexError, _Closed, asyncio.IncompleteReadError):
            status = 0
        latency[i] = time.perf_counter() - scheduled  # a failure counts with its wait
        errors += status != 200

    cpu0 = service.cpu()
    t0 = time.perf_counter() + 0.01
    for i in range(n):
        scheduled = t0 + i / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=120)
    cpu = service.cpu() - cpu0
    pool.close()
    done = [v for v in latency if v == v]
    return {
        **summary_ms(done),
        "errors": errors,
        "cpu_us_per_request": cpu / max(len(done), 1) * 1e6,
    }


def pair_bodies(d: int, count: int = 256) -> list[bytes]:
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(count, d)), rng.normal(size=(count, d))
    return [
        json.dumps({"a": a.tolist(), "b": b.tolist()}).encode() for a, b in zip(A, B, strict=True)
    ]


def gallery_bodies() -> dict[str, tuple[str, bytes]]:
    rng = np.random.default_rng(2)
    a, B = rng.normal(size=GALLERY_D), rng.normal(size=(GALLERY_N, GALLERY_D))
    buf = io.BytesIO()
    np.savez(buf, a=a, b=B)
    text = json.dumps({"a": a.tolist(), "b": B.tolist()}, separators=(",", ":")).encode()
    npz = "Content-Type: application/x-npz\r\n"
    return {
        "json": (JSON_HEADERS, text),
        "npz": (npz, buf.getvalue()),
        "npz_npy": (npz + "Accept: application/x-npy\r\n", buf.getvalue()),
    }


async def gallery(service: Service, headers: str, body: bytes, queries: int) -> dict[str, Any]:
    pool = Pool(service.url, 1)
    path = "/v1/models/g128/distance"
    status, _, _ = await pool.request("POST", path, body, headers)
    if status != 200:
        pool.close()
        return {"unsupported": status}
    times = []
    cpu0 = service.cpu()
    for _ in range(queries):
        start = time.perf_counter()
        await pool.request("POST", path, body, headers)
        times.append(time.perf_counter() - start)
    cpu = service.cpu() - cpu0
    pool.close()
    return {**summary_ms(times), "cpu_us_per_request": cpu / queries * 1e6, "body_bytes": len(body)}


# -- background ingestion (its own process) ---------------------------------------------------


def ingest_main(url: str, model: str, rate: float, seconds: float, out: Path) -> None:
    """Paced WebSocket ingestion: JSON frames of 64 samples, at most 32 unacknowledged."""
    from websockets.asyncio.client import connect

    rng = np.random.default_rng(5)
    frames = []
    for k in range(64):
        X = rng.normal(size=(64, D))
        samples = [{"x": x.tolist(), "y": int((k + i) % 10)} for i, x in enumerate(X)]
        frames.append(samples)

    async def run() -> dict[str, float]:
        acked = 0
        window = asyncio.Semaphore(32)
        async with connect(
            url.replace("http", "ws", 1) + f"/v1/models/{model}/stream", max_size=2**26
        ) as ws:
            t0 = time.perf_counter()
            stop_at = t0 + seconds

            async def receive() -> None:
                nonlocal acked
                async for message in ws:
                    if "ack" in json.loads(message):
                        acked += 64
                    window.release()

            reader = asyncio.create_task(receive())
            i = 0
            while (now := time.perf_counter()) < stop_at:
                due = t0 + i * 64 / rate
                if due > now:
                    await asyncio.sleep(due - now)
                await window.acquire()
                await ws.send(json.dumps({"id": f"bg-{i}", "samples": frames[i % 64]}))
                i += 1
            elapsed = time.perf_counter() - t0
            await asyncio.sleep(1.0)
            reader.cancel()
        return {"offered": rate, "acked_per_s": acked / elapsed}

    out.write_text(json.dumps(asyncio.run(run())))


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    seconds: float
    rate: float
    ingest_rate: float
    json_queries: int
    npz_queries: int


async def measure(service: Service, plan: Plan, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = pair_bodies(D)
    out["livez"] = await open_loop(service, "GET", "/livez", [b""], plan.rate, plan.seconds)
    for what in ("distance", "verify"):
        path = f"/v1/models/q64/{what}"
        out[what] = await open_loop(service, "POST", path, pairs, plan.rate, plan.seconds)
    report = tmp / f"ingest-{service.label}.json"
    background = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.query_overhead",
            "--ingest",
            service.url,
            str(plan.ingest_rate),
            str(2 * plan.seconds + 3),
            str(report),
        ],
        cwd=ROOT,
    )
    await asyncio.sleep(1.5)
    for what in ("distance", "verify"):
        path = f"/v1/models/q64/{what}"
        r = await open_loop(service, "POST", path, pairs, plan.rate, plan.seconds)
        r.pop("cpu_us_per_request")  # includes the ingestion's CPU: not per query
        out[f"{what}_ingesting"] = r
    background.wait(plan.seconds * 2 + 120)
    out["background_ingestion"] = json.loads(report.read_text())
    for key, (headers, body) in gallery_bodies().items():
        queries = plan.json_queries if key == "json" else plan.npz_queries
        out[f"gallery_{key}"] = await gallery(service, headers, body, queries)
    return out


ROWS = [
    ("livez", "`GET /livez` (HTTP stack floor)"),
    ("distance", "distance, one pair (d = 64)"),
    ("verify", "verify (d = 64)"),
    ("distance_ingesting", "distance during WS ingestion"),
    ("verify_ingesting", "verify during WS ingestion"),
    ("gallery_json", "one-to-many 10,000 x 128, JSON body (25 MB)"),
    ("gallery_npz", "one-to-many 10,000 x 128, .npz body (10 MB), JSON answer"),
    ("gallery_npz_npy", "same, `Accept: application/x-npy`"),
]


def median(values: list[float]) -> float | None:
    clean = [v for v in values if v is not None and v == v]
    return float(np.median(clean)) if clean else None


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    table = {}
    for key, _ in ROWS:
        cells = [r[key] for r in runs if key in r and "unsupported" not in r[key]]
        table[key] = {
            m: median([c.get(m) for c in cells]) for m in ("cpu_us_per_request", "p50_ms", "p99_ms")
        }
    return table


def _f(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _ratio(before: float | None, after: float | None) -> str:
    return "-" if before is None or after is None or after == 0 else f"{before / after:.1f}x"


def report(data: dict[str, Any], quick: bool) -> str:
    after = data["table"]["after"]
    before = data["table"].get("before")
    lines = [
        "# Query overhead: service CPU per request and latency, before / after",
        "",
        "Generated by `benchmarks/query_overhead.py`; do not edit by hand. Command (repository "
        "root):",
        "",
        f"    {data['command']}",
        "",
        machine_block(data["machine"]),
        f"- Before: `{data['baseline']}`; after: this checkout. Both services ran at once "
        f"(embedded Redis, appendfsync always) and were measured in alternation, "
        f"{data['plan']['rounds']} round(s); each figure is the median over rounds.",
        f"- Load average (1, 5, 15 min) at start: {data['load_start']}, at end: "
        f"{data['load_end']}; wall time {data['wall_s']:.0f} s",
        "",
        f"Pairs: open loop at {data['plan']['rate']:.0f} requests/s for "
        f"{data['plan']['seconds']:.0f} s (latency from the scheduled time); service CPU = utime "
        "+ stime of all its threads over the run / answers. During ingestion: a WebSocket "
        f"ingestion of {data['plan']['ingest_rate']:.0f} samples/s offered (JSON frames of 64) "
        "on the same model. One-to-many: sequential queries, latency per query including the "
        "transfer of the body.",
        "",
        "| what | CPU us/request before | after | ratio | p50 ms before | after | p99 ms "
        "before | after | p99 ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in ROWS:
        a = after[key]
        b = before[key] if before else {"cpu_us_per_request": None, "p50_ms": None, "p99_ms": None}
        lines.append(
            f"| {label} | {_f(b['cpu_us_per_request'], 0)} | {_f(a['cpu_us_per_request'], 0)} | "
            f"{_ratio(b['cpu_us_per_request'], a['cpu_us_per_request'])} | {_f(b['p50_ms'])} | "
            f"{_f(a['p50_ms'])} | {_f(b['p99_ms'])} | {_f(a['p99_ms'])} | "
            f"{_ratio(b['p99_ms'], a['p99_ms'])} |"
        )
    failed = {
        label: sum(r[key].get("errors", 0) for r in runs for key, _ in ROWS if key in r)
        for label, runs in data["runs"].items()
    }
    lines += [
        "",
        "Requests that failed or were not answered 200 (all rounds): "
        + ", ".join(f"{label} {n}" for label, n in failed.items())
        + ".",
    ]
    lines += ["", "Background ingestion achieved (samples/s acknowledged, median over rounds):"]
    for label, runs in data["runs"].items():
        rate = median([r["background_ingestion"]["acked_per_s"] for r in runs])
        lines.append(f"- {label}: {_f(rate, 0)}")
    core = data.get("core")
    if core:
        lines += [
            "",
            "Core alone, `squared_distances(a, B)` for 10,000 x 128 (`normalize: l2`, best / "
            "median of 15, this process): "
            f"before (one GEMM `(B - a) L^T` on the whole gallery) {core['before_ms'][0]:.1f} / "
            f"{core['before_ms'][1]:.1f} ms; after (blocks of 1,024 rows, triangular factor, "
            f"one BLAS thread) {core['after_ms'][0]:.1f} / {core['after_ms'][1]:.1f} ms; max "
            f"relative difference {core['max_rel_diff']:.1e}.",
        ]
    if quick:
        lines += ["", "(`--quick`: shorter runs, one round; indicative only.)"]
    return "\n".join(lines) + "\n"


def core_timing() -> dict[str, Any]:
    """The core's one-to-many time: the previous formula beside the current method."""
    from service.core import Learner, LearnerConfig
    from service.core.learner import normalize_rows

    rng = np.random.default_rng(3)
    L = np.eye(GALLERY_D) + 0.05 * rng.normal(size=(GALLERY_D, GALLERY_D))
    a, B = rng.normal(size=GALLERY_D), rng.normal(size=(GALLERY_N, GALLERY_D))
    metric = Learner(LearnerConfig(dim=GALLERY_D, **MODEL))  # type: ignore[arg-type]
    metric.set_metric(L)

    def before() -> np.ndarray:
        A = normalize_rows(a[None, :], "l2")
        Z = (normalize_rows(B, "l2") - A) @ L.T
        out: np.ndarray = np.einsum("ij,ij->i", Z, Z)
        return out

    def timed(fn: Any) -> tuple[float, float]:
        times = []
        for _ in range(15):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return float(np.min(times)) * 1e3, float(np.median(times)) * 1e3

    ref, got = before(), metric.squared_distances(a, B)
    return {
        "before_ms": timed(before),
        "after_ms": timed(lambda: metric.squared_distances(a, B)),
        "max_rel_diff": float(np.max(np.abs(got - ref) / ref)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--ingest-rate", type=float, default=5000.0)
    parser.add_argument("--ingest", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ingest:
        url, rate, seconds, out = args.ingest
        ingest_main(url, "q64", float(rate), float(seconds), Path(out))
        return
    plan = Plan(
        rounds=1 if args.quick else args.rounds,
        seconds=3.0 if args.quick else 6.0,
        rate=args.rate,
        ingest_rate=args.ingest_rate,
        json_queries=2 if args.quick else 4,
        npz_queries=10 if args.quick else 30,
    )
    started, load_start = time.time(), [round(v, 2) for v in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="query-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        roots = {"after": ROOT}
        if args.baseline is not None:
            roots = {"before": args.baseline.resolve(), **roots}
        services = {}
        try:
            for label, root in roots.items():
                (tmp / label).mkdir()
                services[label] = Service(label, root, tmp / label).start()
                prepare(services[label])
                print(f"{label}: {root} on {services[label].url}", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label in services}
            for k in range(plan.rounds):
                for label, service in services.items():
                    result = asyncio.run(measure(service, plan, tmp))
                    runs[label].append(result)
                    print(
                        f"round {k + 1} {label}: "
                        + ", ".join(
                            f"{key} {result[key].get('cpu_us_per_request', float('nan')):.0f} us "
                            f"p99 {result[key].get('p99_ms', float('nan')):.2f} ms"
                            for key, _ in ROWS
                            if key in result
                        ),
                        flush=True,
                    )
        finally:
            for service in services.values():
                service.stop()
    data: dict[str, Any] = {
        "command": command_line("benchmarks.query_overhead"),
        "baseline": args.baseline_label or (str(args.baseline) if args.baseline else None),
        "plan": plan.__dict__,
        "runs": runs,
        "table": {label: aggregate(r) for label, r in runs.items()},
        "core": core_timing(),
        "load_start": load_start,
        "load_end": [round(v, 2) for v in os.getloadavg()],
        "wall_s": time.time() - started,
        "machine": machine_info(),
    }
    text = report(data, args.quick)
    print(text)
    suffix = "_quick" if args.quick else ""
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"query_overhead{suffix}.md").write_text(text)
    (RESULTS_DIR / f"query_overhead{suffix}.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
