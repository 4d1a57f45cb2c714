"""Query overhead, before / after: service CPU per request and latency of the query routes.

    .venv/bin/python -m benchmarks.perf.queries --baseline /path/to/old/checkout [--quick]

Starts ``python -m service`` (:class:`devkit.launcher.ServiceProcess`, whose ``root`` runs
another checkout's code) from this checkout ("after") and, with ``--baseline``, from another
checkout of the repository ("before", e.g. ``git worktree add /tmp/base <commit>``), each on
its own embedded Redis in a temporary dir, both running at once, and measures them in
alternation (``--rounds`` rounds; figures are the median over rounds), from this process:

* ``GET /livez``, ``distance`` and ``verify`` (d = 64, one pair each) at ``--rate`` requests/s
  offered, open loop (fixed timetable, latency from the scheduled time, at most 64
  connections): p50 / p99 latency and the service's CPU per request (utime + stime of all its
  threads from ``/proc``, over the run, divided by the answers);
* ``distance`` and ``verify`` at the same rate while a WebSocket ingestion (``benchmarks.harness.loadgen
  ws`` as a separate process, JSON frames of 64 samples, ``--ingest-rate`` samples/s) feeds the
  same model;
* one-to-many ``distance`` of one vector against 10,000 x 128: a full-precision JSON body
  (~25 MB), the ``.npz`` body with a JSON answer, and ``.npz`` with ``Accept:
  application/x-npy``; sequential queries; latency per query and service CPU per query.
  ("before" has no binary gallery: n/a.)

The machine is shared and noisy: compare the ratios. Nothing is asserted. Writes
``benchmarks/results/query_overhead{,_quick}.{md,json}`` (:func:`measure` returns the rounds'
figures, :func:`report` renders them; ``--report-only`` re-renders a saved JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.loadgen import JSON_HEADERS, RawPool, summary
from benchmarks.harness.loadgen import open_loop as loadgen_open_loop
from benchmarks.harness.machine import machine_block, machine_info, thread_cpu
from benchmarks.harness.results import RESULTS_DIR, command_line
from devkit.launcher import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
D, GALLERY_D, GALLERY_N = 64, 128, 10_000
MODEL = {"normalize": "l2"}  # as benchmarks.perf.service_load: the contract's defaults, l2


# -- the services under test ------------------------------------------------------------------


@dataclass
class Service:
    """One side of the comparison: a label and ``python -m service`` from a checkout."""

    label: str
    process: ServiceProcess

    @property
    def url(self) -> str:
        return self.process.url

    def cpu(self) -> float:
        """CPU seconds (user + system) of every thread of the service process."""
        return sum(thread_cpu(self.process.pid))


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


#: Each background ingestion on a service's q64 gets frame ids of its own (a repeat would be
#: an idempotent replay: acknowledged but not logged, so not load).
_BACKGROUND_RUNS = itertools.count(1)


def latency_row(result: dict[str, Any]) -> dict[str, Any]:
    """The figures this report keeps of a latency summary (:func:`loadgen.summary`)."""
    return {k: result[k] for k in ("p50_ms", "p99_ms", "max_ms", "n")}


async def open_loop(
    service: Service, method: str, path: str, bodies: list[bytes], rate: float, seconds: float
) -> dict[str, Any]:
    """``rate`` requests/s on a fixed timetable (:func:`loadgen.open_loop`: latency from each
    scheduled time), after 50 warm-up requests; with the service's CPU per answer."""
    pool = RawPool(service.url, 64)
    for i in range(50):  # warm up the connections and the route
        await pool.request(method, path, bodies[i % len(bodies)])

    async def request(i: int) -> int:
        status, _ = await pool.request(method, path, bodies[i % len(bodies)])
        return status

    cpu0 = service.cpu()
    r = await loadgen_open_loop(request, rate, seconds)
    cpu = service.cpu() - cpu0
    await pool.close()
    answered = r["latency"].get("n", 0)
    return {
        **latency_row(r["latency"]),
        "errors": r["requests"] - r["statuses"].get("200", 0),
        "cpu_us_per_request": cpu / max(answered, 1) * 1e6,
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
    pool = RawPool(service.url, 1)
    path = "/v1/models/g128/distance"
    status, _ = await pool.request("POST", path, body, headers)
    if status != 200:
        await pool.close()
        return {"unsupported": status}
    times = []
    cpu0 = service.cpu()
    for _ in range(queries):
        start = time.perf_counter()
        await pool.request("POST", path, body, headers)
        times.append(time.perf_counter() - start)
    cpu = service.cpu() - cpu0
    await pool.close()
    return {
        **latency_row(summary(np.array(times))),
        "cpu_us_per_request": cpu / queries * 1e6,
        "body_bytes": len(body),
    }


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    seconds: float
    rate: float
    ingest_rate: float
    json_queries: int
    npz_queries: int


async def measure_round(service: Service, plan: Plan, tmp: Path) -> dict[str, Any]:
    """One round on one service: every row of :data:`ROWS`."""
    out: dict[str, Any] = {}
    pairs = pair_bodies(D)
    out["livez"] = await open_loop(service, "GET", "/livez", [b""], plan.rate, plan.seconds)
    for what in ("distance", "verify"):
        path = f"/v1/models/q64/{what}"
        out[what] = await open_loop(service, "POST", path, pairs, plan.rate, plan.seconds)
    report = tmp / f"ingest-{service.label}.json"
    background = subprocess.Popen(  # loadgen's paced WS ingestion, as its own process
        [sys.executable, "-m", "benchmarks.harness.loadgen", "ws", "--url", service.url,
         "--model", "q64", "--dim", str(D), "--frame", "64", "--encoding", "json",
         "--rate", str(plan.ingest_rate), "--seconds", str(2 * plan.seconds + 3),
         "--first-id", str(next(_BACKGROUND_RUNS)), "--out", str(report)],
        cwd=ROOT,
    )  # fmt: skip
    await asyncio.sleep(1.5)
    for what in ("distance", "verify"):
        path = f"/v1/models/q64/{what}"
        r = await open_loop(service, "POST", path, pairs, plan.rate, plan.seconds)
        r.pop("cpu_us_per_request")  # includes the ingestion's CPU: not per query
        out[f"{what}_ingesting"] = r
    background.wait(plan.seconds * 2 + 120)
    acked = json.loads(report.read_text())["throughput"]
    out["background_ingestion"] = {"offered": plan.ingest_rate, "acked_per_s": acked}
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
    from service.core import Learner, LearnerConfig, normalize_rows

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


def measure(plan: Plan, roots: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    """Start one service per checkout in ``roots`` (label -> checkout), all at once, and
    measure them in alternation, ``plan.rounds`` rounds: label -> the rounds' figures."""
    with tempfile.TemporaryDirectory(prefix="query-overhead-") as tmp_name, \
            contextlib.ExitStack() as stack:  # fmt: skip
        tmp = Path(tmp_name)
        services = []
        for label, root in roots.items():
            process = ServiceProcess(tmp / label, None, root=root)
            stack.enter_context(process.start(timeout=90))
            services.append(Service(label, process))
            prepare(services[-1])
            print(f"{label}: {root} on {process.url}", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in services}
        for k in range(plan.rounds):
            for service in services:
                result = asyncio.run(measure_round(service, plan, tmp))
                runs[service.label].append(result)
                print(
                    f"round {k + 1} {service.label}: "
                    + ", ".join(
                        f"{key} {result[key].get('cpu_us_per_request', float('nan')):.0f} us "
                        f"p99 {result[key].get('p99_ms', float('nan')):.2f} ms"
                        for key, _ in ROWS
                        if key in result
                    ),
                    flush=True,
                )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--ingest-rate", type=float, default=5000.0)
    parser.add_argument(
        "--report-only", action="store_true",
        help="re-render the .md from the saved .json (no measurement)",
    )  # fmt: skip
    args = parser.parse_args()
    suffix = "_quick" if args.quick else ""
    if args.report_only:
        data = json.loads((RESULTS_DIR / f"query_overhead{suffix}.json").read_text())
        (RESULTS_DIR / f"query_overhead{suffix}.md").write_text(report(data, args.quick))
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
    roots = {"after": ROOT}
    if args.baseline is not None:
        roots = {"before": args.baseline.resolve(), **roots}
    runs = measure(plan, roots)
    data: dict[str, Any] = {
        "command": command_line("benchmarks.perf.queries"),
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
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"query_overhead{suffix}.md").write_text(text)
    (RESULTS_DIR / f"query_overhead{suffix}.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
