"""Queries: the service beside the floor of its stack, in one run, as ratios.

    python3 dev.py bench queries [--quick]
    .venv/bin/python -m benchmarks.perf.queries [--baseline /path/to/old/checkout] [--quick]

Starts ``python -m service`` (:func:`benchmarks.harness.targets.start_service`: embedded
Redis, ``appendfsync always``) and the floor app (:mod:`benchmarks.harness.floor`: parse, one
read of a matrix cached in the process, numpy, answer) and, with ``--baseline``, the service
from another checkout (``before``); all run at once and are measured in alternation by the
same client (``--rounds`` rounds; figures are the median over rounds):

* ``GET /livez``, ``distance`` and ``verify`` (d = 64, one pair each) at ``--rate``
  requests/s offered, and ``identify`` (k = 5, against ``--gallery`` items of d = 128) at
  ``--identify-rate``, open loop (fixed timetable, latency from the scheduled time, at most
  64 connections): p50 / p99 latency and the server's CPU per request (utime + stime of all
  its threads from ``/proc``, over the run, divided by the answers);
* ``distance`` and ``verify`` at the same rate while a WebSocket ingestion
  (``benchmarks.harness.loadgen ws`` as a separate process, JSON frames of 64 samples,
  ``--ingest-rate`` samples/s) feeds the same model;
* one-to-many ``distance`` of one vector against 10,000 x 128: a full-precision JSON body
  (~25 MB), the ``.npz`` body with a JSON answer, and ``.npz`` with ``Accept:
  application/x-npy``; sequential queries; latency per query and server CPU per query.

The headline is service / floor (CPU per request, p99). The machine may be shared: the ratios
are what travels. Nothing is asserted. Writes ``benchmarks/results/queries.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.loadgen import JSON_HEADERS, RawPool, summary
from benchmarks.harness.loadgen import open_loop as loadgen_open_loop
from benchmarks.harness.machine import loadavg, machine_block, machine_info
from benchmarks.harness.results import result_stem, run_record, write_results
from benchmarks.harness.targets import Target, spawn_loadgen, start_floor, start_service
from benchmarks.perf.identify import enrol

ROOT = Path(__file__).resolve().parents[2]
D, GALLERY_D, GALLERY_N = 64, 128, 10_000
MODEL = {"normalize": "l2"}  # as benchmarks.perf.service_load: the contract's defaults, l2


# -- the services under test ------------------------------------------------------------------


def prepare(service: Target, gallery_items: int) -> None:
    """Models ``q64`` (d = 64) and ``g128`` (d = 128), each fed 512 samples and applied, and a
    gallery of ``gallery_items`` random vectors on ``g128``."""
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=service.url, timeout=120) as client:
        for name, d in (("q64", D), ("g128", GALLERY_D)):
            client.post("/v1/models", json={"name": name, "dim": d, **MODEL}).raise_for_status()
            X = rng.normal(size=(512, d))
            samples = [{"x": x.tolist(), "y": int(i % 10)} for i, x in enumerate(X)]
            answer = client.post(f"/v1/models/{name}/samples?wait=true", json={"samples": samples})
            answer.raise_for_status()
        enrol(client, "g128", rng.normal(size=(gallery_items, GALLERY_D)))


# -- a lean HTTP/1.1 client (the generator's own cost stays small) ------------------------------


#: Each background ingestion on a service's q64 gets frame ids of its own (a repeat would be
#: an idempotent replay: acknowledged but not logged, so not load).
_BACKGROUND_RUNS = itertools.count(1)


def latency_row(result: dict[str, Any]) -> dict[str, Any]:
    """The figures this report keeps of a latency summary (:func:`loadgen.summary`)."""
    return {k: result[k] for k in ("p50_ms", "p99_ms", "max_ms", "n")}


async def open_loop(
    service: Target, method: str, path: str, bodies: list[bytes], rate: float, seconds: float
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


def identify_bodies(count: int = 256) -> list[bytes]:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(count, GALLERY_D))
    return [json.dumps({"x": x.tolist(), "k": 5}).encode() for x in X]


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


async def gallery(service: Target, headers: str, body: bytes, queries: int) -> dict[str, Any]:
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
    identify_rate: float
    gallery_items: int


async def measure_round(service: Target, plan: Plan, tmp: Path) -> dict[str, Any]:
    """One round on one server: every row of :data:`ROWS`, each part from a settled server
    (no learner backlog of an earlier part running beside it)."""
    out: dict[str, Any] = {}
    service.settle("q64")
    pairs = pair_bodies(D)
    out["livez"] = await open_loop(service, "GET", "/livez", [b""], plan.rate, plan.seconds)
    for what in ("distance", "verify"):
        path = f"/v1/models/q64/{what}"
        out[what] = await open_loop(service, "POST", path, pairs, plan.rate, plan.seconds)
    out["identify"] = await open_loop(
        service, "POST", "/v1/models/g128/identify", identify_bodies(), plan.identify_rate,
        plan.seconds,
    )  # fmt: skip
    report = tmp / f"ingest-{service.label}.json"
    background = spawn_loadgen(  # a paced WS ingestion
        service.url, "ws", report, "--model", "q64", "--dim", D, "--frame", 64,
        "--encoding", "json", "--rate", plan.ingest_rate, "--seconds", 2 * plan.seconds + 3,
        "--first-id", next(_BACKGROUND_RUNS),
    )  # fmt: skip
    try:
        await asyncio.sleep(1.5)
        for what in ("distance", "verify"):
            path = f"/v1/models/q64/{what}"
            r = await open_loop(service, "POST", path, pairs, plan.rate, plan.seconds)
            r.pop("cpu_us_per_request")  # includes the ingestion's CPU: not per query
            out[f"{what}_ingesting"] = r
        background.wait(plan.seconds * 2 + 120)
    finally:
        if background.poll() is None:  # interrupted: no generator left behind
            background.kill()
            background.wait(10)
    acked = json.loads(report.read_text())["throughput"]
    out["background_ingestion"] = {"offered": plan.ingest_rate, "acked_per_s": acked}
    service.settle("q64")
    for key, (headers, body) in gallery_bodies().items():
        queries = plan.json_queries if key == "json" else plan.npz_queries
        out[f"gallery_{key}"] = await gallery(service, headers, body, queries)
    return out


ROWS = [
    ("livez", "`GET /livez` (HTTP stack floor)"),
    ("distance", "distance, one pair (d = 64)"),
    ("verify", "verify (d = 64)"),
    ("identify", "identify, k = 5 (gallery x 128)"),
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


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None or den == 0 else f"{num / den:.2f}"


def report(data: dict[str, Any], quick: bool) -> str:
    table = data["table"]
    service, floor, before = table["service"], table["floor"], table.get("before")
    plan = data["plan"]
    lines = [
        "# Queries: the service beside the floor of its stack",
        "",
        "Generated by `benchmarks/perf/queries.py`; do not edit by hand.",
        "",
        f"    {data['run']['command']}",
        "",
        machine_block(data["machine"]),
        f"- The service (embedded Redis, `appendfsync always`) and the floor app (parse, one "
        f"read of a matrix cached in the process, numpy, answer) ran at once and were measured "
        f"in alternation by the same client, {plan['rounds']} round(s); each figure is the "
        "median over rounds" + (f"; `before`: `{data['baseline']}`." if before else "."),
        f"- Load average (1, 5, 15 min) at start: {data['load_start']}, at end: "
        f"{data['load_end']}; wall time {data['wall_s']:.0f} s.",
        "",
        f"Pairs: open loop at {plan['rate']:.0f} requests/s for {plan['seconds']:.0f} s "
        f"(identify: {plan['identify_rate']:.0f}/s against {plan['gallery_items']:,} items; "
        "latency from the scheduled time); server CPU = utime + stime of all its threads over "
        "the run / answers. During ingestion: a WebSocket ingestion of "
        f"{plan['ingest_rate']:.0f} samples/s offered (JSON frames of 64) on the same model. "
        "One-to-many: sequential queries, latency per query including the transfer of the "
        "body (the floor reads JSON only, with the standard library: n/a for `.npz`).",
        "",
        "| what | CPU us/request, service / floor | service | floor | p99 ms, service / floor "
        "| service | floor |" + (" CPU, service / before |" if before else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if before else ""),
    ]
    for key, label in ROWS:
        a, f = service[key], floor[key]
        row = (
            f"| {label} | **{_ratio(a['cpu_us_per_request'], f['cpu_us_per_request'])}** | "
            f"{_f(a['cpu_us_per_request'], 0)} | {_f(f['cpu_us_per_request'], 0)} | "
            f"**{_ratio(a['p99_ms'], f['p99_ms'])}** | {_f(a['p99_ms'])} | {_f(f['p99_ms'])} |"
        )
        if before:
            row += f" {_ratio(a['cpu_us_per_request'], before[key]['cpu_us_per_request'])} |"
        lines.append(row)
    failed = {
        label: sum(r[key].get("errors", 0) for r in runs for key, _ in ROWS if key in r)
        for label, runs in data["runs"].items()
    }
    lines += [
        "",
        "Requests that failed or were not answered 200 (all rounds): "
        + ", ".join(f"{label} {n}" for label, n in failed.items())
        + ".",
        "",
        "Background ingestion achieved (samples/s acknowledged, median over rounds):",
    ]
    for label, runs in data["runs"].items():
        rate = median([r["background_ingestion"]["acked_per_s"] for r in runs])
        lines.append(f"- {label}: {_f(rate, 0)}")
    core = data.get("core")
    if core:
        lines += [
            "",
            "Core alone, `squared_distances(a, B)` for 10,000 x 128 (`normalize: l2`, best / "
            "median of 15, this process): one GEMM `(B - a) L^T` on the whole gallery "
            f"{core['before_ms'][0]:.1f} / {core['before_ms'][1]:.1f} ms; the core's method "
            "(blocks of 1,024 rows, triangular factor, one BLAS thread) "
            f"{core['after_ms'][0]:.1f} / {core['after_ms'][1]:.1f} ms; max relative "
            f"difference {core['max_rel_diff']:.1e}.",
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


def measure(plan: Plan, baseline: Path | None) -> dict[str, list[dict[str, Any]]]:
    """Start the service (and a ``baseline`` checkout's) and the floor app, all at once, and
    measure them in alternation, ``plan.rounds`` rounds: label -> the rounds' figures."""
    with tempfile.TemporaryDirectory(prefix="bench-queries-") as tmp_name, \
            contextlib.ExitStack() as stack:  # fmt: skip
        tmp = Path(tmp_name)
        targets: list[Target] = []
        roots = {"service": None} | ({"before": baseline.resolve()} if baseline else {})
        redis_url = ""
        for label, root in roots.items():
            target, process = stack.enter_context(start_service(label, tmp / label, root))
            prepare(target, plan.gallery_items)
            targets.append(target)
            if label == "service":
                redis = process.embedded_redis()
                assert redis is not None, "the service runs its embedded Redis"
                redis_url = f"redis://127.0.0.1:{redis[1]}/0"
        floor = stack.enter_context(
            start_floor(redis_url, tmp, D, gallery=plan.gallery_items, gallery_dim=GALLERY_D)
        )
        targets.insert(1, floor)
        runs: dict[str, list[dict[str, Any]]] = {t.label: [] for t in targets}
        for k in range(plan.rounds):
            for target in targets:
                result = asyncio.run(measure_round(target, plan, tmp))
                runs[target.label].append(result)
                print(
                    f"round {k + 1} {target.label}: "
                    + ", ".join(
                        f"{key} {result[key].get('cpu_us_per_request', float('nan')):.0f} us "
                        f"p99 {result[key].get('p99_ms', float('nan')):.2f} ms"
                        for key, _ in ROWS
                        if key in result
                    ),
                    flush=True,
                )
    return runs


#: What ``--quick`` sets (explicit options still win).
QUICK = {"rounds": 1, "seconds": 1.0, "gallery": 1000}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.perf.queries", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--baseline", type=Path, help="also a checkout of the code before")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--identify-rate", type=float, default=200.0)
    parser.add_argument("--gallery", type=int, default=10_000, help="identify: gallery items")
    parser.add_argument("--ingest-rate", type=float, default=5000.0)
    args = parse(parser, argv, QUICK)
    plan = Plan(
        rounds=args.rounds,
        seconds=args.seconds,
        rate=args.rate,
        ingest_rate=args.ingest_rate,
        json_queries=1 if args.quick else 4,
        npz_queries=3 if args.quick else 30,
        identify_rate=args.identify_rate,
        gallery_items=args.gallery,
    )
    started, load_start = time.time(), loadavg()
    runs = measure(plan, args.baseline)
    data: dict[str, Any] = {
        "run": run_record("benchmarks.perf.queries"),
        "baseline": args.baseline_label or (str(args.baseline) if args.baseline else None),
        "plan": plan.__dict__,
        "runs": runs,
        "table": {label: aggregate(r) for label, r in runs.items()},
        "core": core_timing(),
        "load_start": load_start,
        "load_end": loadavg(),
        "wall_s": time.time() - started,
        "machine": machine_info(),
    }
    text = report(data, args.quick)
    print(text)
    write_results(result_stem("queries", args.quick), [text], data)


if __name__ == "__main__":
    main()
