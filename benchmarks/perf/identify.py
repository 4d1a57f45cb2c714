"""Identification (1:N) against the server-side gallery: latency, refresh cost, baselines.

    python -m benchmarks.perf.identify            # ~10 min; benchmarks/results/identify.{md,json}
    python -m benchmarks.perf.identify --quick    # a smoke run, results/quick/identify.*

Three parts, all printed and saved with the machine they ran on:

1. **Refresh cost in the core** (in this process, one BLAS thread): bringing ``Z = G L^T`` to a
   new ``L`` fully (``G L^T``) and incrementally (``Z + (G B^T) Q^T`` for a change of rank
   r', :mod:`service.core.gallery`) by ``d``, gallery size and r': the table behind the
   refresh policy (incremental when ``32 r' <= d``; the full product in float32).
2. **The service** (``python -m service`` on the embedded Redis, ``appendfsync always``, in a
   temporary dir; d = 128, ``normalize: l2``): galleries of 10,000 and 100,000 items enrolled
   over HTTP; ``POST .../identify`` (one vector, k = 5, JSON) in an open loop at a fixed rate,
   latency from each request's scheduled send time (no coordinated omission), idle and while
   ``benchmarks.harness.loadgen ws --encoding binary --rate 20000`` streams samples (paced, its own
   process); the refreshes during ingestion from ``opml_gallery_refresh_seconds`` (time per
   refresh by method, versions per refresh).
3. **Baselines on the same gallery and queries**: brute force with numpy on the client
   (``||(q - G) L^T||^2`` for every row, then the top k), and faiss's exact ``IndexFlatL2`` on
   the transformed gallery (float32, one thread; index rebuilt per version: ``G L^T`` + add),
   where faiss-cpu is installed (``.venv/bin/pip install faiss-cpu``; not a dependency of the
   project). Their top-k ids are compared with the service's answers.

The load average of the machine (shared with other work) is recorded at every phase.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.harness.cli import parse
from benchmarks.harness.loadgen import RawPool, open_loop, summary
from benchmarks.harness.machine import machine_block, machine_info, thread_cpu
from benchmarks.harness.results import command_line, result_stem, write_results
from benchmarks.harness.targets import spawn_loadgen
from devkit.launcher import ServiceProcess
from service.core import normalize_rows
from service.core.gallery import OVERSAMPLE, TransformedGallery, refresh_method

ROOT = Path(__file__).resolve().parents[2]
D = 128
K = 5
INGEST_RATE = 20_000.0


def load() -> float:
    return round(os.getloadavg()[0], 2)


def timed(fn: Any, repeats: int) -> float:
    """Median wall time of ``fn()`` in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


# -- 1. the core ---------------------------------------------------------------------------------


def core_refresh(
    cases: list[tuple[int, int]], ranks: list[int], repeats: int
) -> list[dict[str, Any]]:
    """Full vs incremental refresh time by (n, d) and r' (the incremental form is forced, so
    its cost is seen past the policy's crossover too)."""
    rows = []
    rng = np.random.default_rng(0)
    for n, d in cases:
        G = normalize_rows(rng.normal(size=(n, d)), "l2")
        L0 = np.eye(d) + 0.01 * rng.normal(size=(d, d))
        view, _ = TransformedGallery.empty(L0).with_rows(G)
        L_full = L0 + 0.01 * rng.normal(size=(d, d))
        full = timed(lambda: view.refreshed(L_full, None), repeats)  # noqa: B023
        row: dict[str, Any] = {
            "n": n,
            "d": d,
            "full_ms": full,
            "incremental_ms": {},
            "load": load(),
        }
        for r in ranks:
            if r > d:
                continue
            rank = r - OVERSAMPLE
            L1 = L0 + 0.01 * rng.normal(size=(d, rank)) @ rng.normal(size=(rank, d))
            with threadpool_limits(1, "blas"):
                ms = timed(lambda: view._incremental(L1, rank), repeats)  # noqa: B023
            row["incremental_ms"][r] = ms
            row.setdefault("policy", {})[r] = refresh_method(rank, n, d)
        rows.append(row)
        print(
            f"core n={n} d={d}: full {full:.1f} ms, incremental "
            + ", ".join(f"r'={r}: {v:.1f}" for r, v in row["incremental_ms"].items()),
            flush=True,
        )
    return rows


# -- 2. the service ------------------------------------------------------------------------------


def enrol(client: httpx.Client, model: str, G: np.ndarray, chunk: int = 2000) -> float:
    start = time.perf_counter()
    for lo in range(0, len(G), chunk):
        items = [
            {"id": f"id-{i:06d}", "x": G[i].tolist()} for i in range(lo, min(lo + chunk, len(G)))
        ]
        r = client.post(f"/v1/models/{model}/gallery", json={"items": items}, timeout=300)
        r.raise_for_status()
    return time.perf_counter() - start


def refresh_stats(client: httpx.Client, model: str) -> dict[str, dict[str, float]]:
    """``opml_gallery_refresh_seconds`` of ``model``: sum and count by method, and buckets."""
    out: dict[str, dict[str, float]] = {}
    for line in client.get("/metrics").text.splitlines():
        if not line.startswith("opml_gallery_refresh_seconds") or f'model="{model}"' not in line:
            continue
        name, value = line.rsplit(" ", 1)
        method = name.split('method="', 1)[1].split('"', 1)[0]
        stats = out.setdefault(method, {})
        if "_sum" in name:
            stats["sum"] = float(value)
        elif "_count" in name:
            stats["count"] = float(value)
        else:
            le = name.split('le="', 1)[1].split('"', 1)[0]
            stats[f"le_{le}"] = float(value)
    return out


def refresh_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for method, stats in after.items():
        base = before.get(method, {})
        count = stats.get("count", 0) - base.get("count", 0)
        total = stats.get("sum", 0) - base.get("sum", 0)
        buckets = sorted(
            (float(k[3:]), v - base.get(k, 0)) for k, v in stats.items() if k.startswith("le_")
        )
        p50 = next((le for le, c in buckets if count and c >= 0.5 * count), None)
        p99 = next((le for le, c in buckets if count and c >= 0.99 * count), None)
        out[method] = {
            "count": count,
            "mean_ms": 1e3 * total / count if count else None,
            "p50_le_ms": None if p50 is None else p50 * 1e3,
            "p99_le_ms": None if p99 is None else p99 * 1e3,
        }
    return out


def metric(client: httpx.Client, model: str) -> np.ndarray:
    """``L`` once every logged sample is applied (idle: the L of every idle answer)."""
    logged = client.get(f"/v1/models/{model}").json()["logged_seq"]
    npy = client.get(
        f"/v1/models/{model}/metric",
        params={"min_version": logged},
        headers={"accept": "application/x-npy"},
    )
    L: np.ndarray = np.load(io.BytesIO(npy.content), allow_pickle=False)
    return L


def model_version(client: httpx.Client, model: str) -> int:
    return int(client.get(f"/v1/models/{model}").json()["version"])


async def identify_loop(
    url: str, model: str, Q: np.ndarray, rate: float, seconds: float, pid: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Open loop of ``identify`` (one vector, k = K), then of ``GET /livez`` at the same rate
    (the HTTP stack's floor under the same conditions); the summary, with the service's CPU
    per request of each, and every identify answer."""
    bodies = [json.dumps({"x": q.tolist(), "k": K}).encode() for q in Q]
    path = f"/v1/models/{model}/identify"
    pool = RawPool(url, 16)
    for i in range(20):  # warm the route and the connections
        await pool.request("POST", path, bodies[i % len(bodies)])
    answers: list[dict[str, Any]] = []

    async def request(i: int) -> int:
        status, body = await pool.request("POST", path, bodies[i % len(bodies)])
        if status == 200:
            answers.append({"query": i % len(bodies), **json.loads(body)})
        return status

    async def livez(i: int) -> int:
        return (await pool.request("GET", "/livez"))[0]

    cpu0 = sum(thread_cpu(pid))
    out = await open_loop(request, rate, seconds)
    cpu1 = sum(thread_cpu(pid))
    floor = await open_loop(livez, rate, seconds / 2)
    cpu2 = sum(thread_cpu(pid))
    out["cpu_ms_per_request"] = 1e3 * (cpu1 - cpu0) / max(out["requests"], 1)
    out["livez"] = floor["latency"]
    out["livez_cpu_ms_per_request"] = 1e3 * (cpu2 - cpu1) / max(floor["requests"], 1)
    await pool.close()
    return out, answers


def loadgen_ws(
    url: str,
    model: str,
    seconds: float,
    rate: float,
    first_id: int,
    out: Path,
) -> subprocess.Popen[bytes]:
    args: list[str | int | float] = ["--model", model, "--dim", D, "--frame", 64,
                                     "--encoding", "binary", "--seconds", seconds,
                                     "--first-id", first_id]  # fmt: skip
    return spawn_loadgen(url, "ws", out, *args, *(["--rate", rate] if rate else []))


def measure_service(tmp: Path, sizes: list[int], plan: dict[str, float]) -> dict[str, Any]:
    service = ServiceProcess(tmp / "service").start(180)
    results: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=service.url, timeout=120) as client:
            for n in sizes:
                model = f"g{n}"
                client.delete(f"/v1/models/{model}")
                client.post("/v1/models", json={"name": model, "dim": D, "normalize": "l2"})
                pretrain = loadgen_ws(service.url, model, 3.0, 0.0, 0, tmp / f"pre{n}.json")
                pretrain.wait(120)
                metric(client, model)  # every pre-training sample applied
                rng = np.random.default_rng(n)
                G = rng.normal(size=(n, D))
                enrol_s = enrol(client, model, G)
                Q = G[rng.integers(n, size=256)] + 0.3 * rng.normal(size=(256, D))
                rate = plan["rate_10k"] if n <= 10_000 else plan["rate_100k"]
                version = model_version(client, model)
                idle, answers = asyncio.run(
                    identify_loop(service.url, model, Q, rate, plan["seconds"], service.pid)
                )
                idle["load"] = load()
                L = metric(client, model)
                print(
                    f"service n={n} idle: p50 {idle['latency']['p50_ms']:.2f} ms, p99 "
                    f"{idle['latency']['p99_ms']:.2f} ms (load {load()})",
                    flush=True,
                )
                before = refresh_stats(client, model)
                v0 = model_version(client, model)
                feed = loadgen_ws(
                    service.url,
                    model,
                    plan["seconds"] + 6,
                    INGEST_RATE,
                    100,
                    tmp / f"ingest{n}.json",
                )
                time.sleep(3.0)  # the stream is up to speed
                busy, busy_answers = asyncio.run(
                    identify_loop(service.url, model, Q, rate, plan["seconds"], service.pid)
                )
                v1 = model_version(client, model)
                after = refresh_stats(client, model)
                feed.wait(120)
                ingest = json.loads((tmp / f"ingest{n}.json").read_text())
                refreshes = refresh_delta(before, after)
                count = sum(r["count"] for r in refreshes.values())
                print(
                    f"service n={n} ingesting {ingest['throughput']:.0f}/s: p50 "
                    f"{busy['latency']['p50_ms']:.2f} ms, p99 {busy['latency']['p99_ms']:.2f} ms;"
                    f" refreshes {refreshes} (load {load()})",
                    flush=True,
                )
                results[str(n)] = {
                    "n": n,
                    "enrol_s": enrol_s,
                    "idle": {**idle, "version": version},
                    "ingesting": {
                        **busy,
                        "load": load(),
                        "ingest_throughput": ingest["throughput"],
                        "ingest_errors": ingest["frame_errors"],
                        "versions": [v0, v1],
                        "refreshes": refreshes,
                        "versions_per_refresh": (v1 - v0) / count if count else None,
                        "answered_versions": len({a["version"] for a in busy_answers}),
                    },
                    "baselines": baselines(G, Q, L, answers, plan),
                }
                client.delete(f"/v1/models/{model}")
    finally:
        service.close()
    return results


# -- 3. baselines --------------------------------------------------------------------------------


def baselines(
    G: np.ndarray,
    Q: np.ndarray,
    L: np.ndarray,
    answers: list[dict[str, Any]],
    plan: dict[str, float],
) -> dict[str, Any]:
    """numpy brute force on the client and faiss IndexFlatL2 on Z, against the service's ids."""
    Gn, Qn = normalize_rows(G, "l2"), normalize_rows(Q, "l2")
    ids = np.array([f"id-{i:06d}" for i in range(len(G))])
    count = int(plan["baseline_queries"])
    service_top = {a["query"]: [m["id"] for m in a["matches"]] for a in answers}
    out: dict[str, Any] = {}
    times, agree = [], 0
    with threadpool_limits(1, "blas"):
        for j in range(count):
            start = time.perf_counter()
            diff = (Qn[j] - Gn) @ L.T
            sq = np.einsum("ij,ij->i", diff, diff)
            top = np.argpartition(sq, K)[:K]
            top = top[np.lexsort((ids[top], sq[top]))]
            times.append(time.perf_counter() - start)
            agree += service_top.get(j) == ids[top].tolist()
    out["numpy"] = {**summary(np.array(times)), "agree": agree, "compared": count}
    try:
        import faiss
    except ImportError:
        out["faiss"] = None
        return out
    faiss.omp_set_num_threads(1)
    start = time.perf_counter()
    Z = (Gn @ L.T).astype(np.float32)
    index = faiss.IndexFlatL2(Z.shape[1])
    index.add(Z)
    rebuild = time.perf_counter() - start
    times, agree = [], 0
    for j in range(count):
        start = time.perf_counter()
        zq = (L @ Qn[j]).astype(np.float32)[None, :]
        _, found = index.search(zq, K)
        times.append(time.perf_counter() - start)
        agree += service_top.get(j) == ids[found[0]].tolist()
    out["faiss"] = {
        **summary(np.array(times)),
        "agree": agree,
        "compared": count,
        "rebuild_ms": rebuild * 1e3,
        "version": faiss.__version__,
    }
    return out


# -- report --------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(latency: dict[str, float] | None) -> str:
    """``p50 / p99`` of a latency summary (``-`` when the run predates it)."""
    return "-" if latency is None else f"{_f(latency['p50_ms'])} / {_f(latency['p99_ms'])}"


def report(data: dict[str, Any]) -> str:
    lines = [
        "# Identification (1:N) against the server-side gallery",
        "",
        f"Command: `{data['command']}`",
        "",
        machine_block(data["machine"]),
        f"- Load average (1 min) at each phase: {data['loads']}",
        "",
        "## Identification latency during ingestion / idle (same gallery, same run)",
        "",
        "| gallery | p99 idle ms | p99 ingesting ms | ingesting / idle | target |",
        "|---|---|---|---|---|",
        *(
            f"| {int(n):,} x 128 | {_f(r['idle']['latency']['p99_ms'])} | "
            f"{_f(r['ingesting']['latency']['p99_ms'])} | "
            f"**{r['ingesting']['latency']['p99_ms'] / r['idle']['latency']['p99_ms']:.2f}** | "
            + ("<= 2" if int(n) == 10_000 else "-")
            + " |"
            for n, r in data["service"].items()
        ),
        "",
        "## The service (d = 128, normalize l2, k = 5, JSON, open loop)",
        "",
        "Latency from each request's scheduled send time. During ingestion the loadgen streams "
        f"binary frames paced at {INGEST_RATE:,.0f} samples/s (achieved rate in the table); the "
        "target is the ratio above: p99 during ingestion at most 2x the same gallery's idle p99.",
        "",
        "`GET /livez` (no work at all) was measured right after each run at the same rate: its "
        "latency is the floor the machine's load sets for any request. Service CPU per request "
        "from /proc (during ingestion it includes the ingestion's share). The generator shares "
        "the machine's two cores: 'generator late' is how late it started requests (its timer "
        "and its turn on a core), and 'from send' the latency from that start: the part the "
        "service and the network make (the target is judged on the latency from the schedule).",
        "",
        "| gallery | phase | queries/s | p50 ms | p99 ms | max ms | from send p50 / p99 ms | "
        "generator late p50 / p99 ms | livez p50 / p99 ms | "
        "service CPU ms per identify / livez | ingestion samples/s | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in data["service"].items():
        for phase in ("idle", "ingesting"):
            p = r[phase]
            lat = p["latency"]
            rate = _f(p.get("ingest_throughput"), 0) if phase == "ingesting" else "-"
            lines.append(
                f"| {int(n):,} x 128 | {phase} | {p['offered_rate']:g} | "
                f"{_f(lat['p50_ms'])} | {_f(lat['p99_ms'])} | {_f(lat['max_ms'])} | "
                f"{_pair(p.get('from_send'))} | {_pair(p.get('lateness'))} | "
                f"{_pair(p['livez'])} | "
                f"{_f(p['cpu_ms_per_request'])} / {_f(p['livez_cpu_ms_per_request'])} | "
                f"{rate} | {p['load']} |"
            )
    lines += [
        "",
        "Refreshes while ingesting (`opml_gallery_refresh_seconds`; p50/p99 as the "
        "histogram bucket bounds they fall under):",
        "",
        "| gallery | method | refreshes | mean ms | p50 <= ms | p99 <= ms | versions per "
        "refresh | distinct versions answered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in data["service"].items():
        busy = r["ingesting"]
        for method, s in busy["refreshes"].items():
            if not s["count"]:
                continue
            lines.append(
                f"| {int(n):,} | {method} | {s['count']:.0f} | {_f(s['mean_ms'], 1)} | "
                f"{_f(s['p50_le_ms'], 1)} | {_f(s['p99_le_ms'], 1)} | "
                f"{_f(busy['versions_per_refresh'], 0)} | "
                f"{busy['answered_versions']} |"
            )
    lines += [
        "",
        "## Baselines on the same gallery and queries (one thread)",
        "",
        "| gallery | method | p50 ms | p99 ms | top-5 ids equal to the service's | "
        "per new version |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in data["service"].items():
        b = r["baselines"]
        idle = r["idle"]["latency"]
        lines.append(
            f"| {int(n):,} | service identify (HTTP, idle) | {_f(idle['p50_ms'])} | "
            f"{_f(idle['p99_ms'])} | (reference) | refresh, above |"
        )
        np_ = b["numpy"]
        lines.append(
            f"| {int(n):,} | numpy brute force on the client | {_f(np_['p50_ms'])} | "
            f"{_f(np_['p99_ms'])} | {np_['agree']}/{np_['compared']} | nothing |"
        )
        fa = b.get("faiss")
        if fa:
            lines.append(
                f"| {int(n):,} | faiss {fa['version']} IndexFlatL2 on Z (float32) | "
                f"{_f(fa['p50_ms'])} | {_f(fa['p99_ms'])} | {fa['agree']}/"
                f"{fa['compared']} | rebuild {_f(fa['rebuild_ms'], 1)} ms |"
            )
    lines += [
        "",
        "## Refresh cost in the core (one BLAS thread, median)",
        "",
        "Full: `Z = G L^T` (in float32 while the scale allows). Incremental: "
        "`Z + (G B^T) Q^T` for a change of rank r' (forced here; the policy takes it when "
        "`32 r' <= d`, marked *).",
        "",
    ]
    ranks = sorted({int(r) for row in data["core"] for r in row["incremental_ms"]})
    lines += [
        "| n | d | full ms | " + " | ".join(f"r'={r} ms" for r in ranks) + " | load |",
        "|---|---|---|" + "---|" * len(ranks) + "---|",
    ]
    for row in data["core"]:
        cells = []
        for r in ranks:
            ms = row["incremental_ms"].get(str(r), row["incremental_ms"].get(r))
            chosen = row.get("policy", {}).get(str(r), row.get("policy", {}).get(r))
            cells.append(
                "-" if ms is None else f"{ms:.1f}" + ("*" if chosen == "incremental" else "")
            )
        lines.append(
            f"| {row['n']:,} | {row['d']} | {row['full_ms']:.1f} | "
            + " | ".join(cells)
            + f" | {row['load']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (smaller, shorter)")
    parser.add_argument("--rate-10k", type=float, default=50.0, help="queries/s, 10,000 items")
    parser.add_argument("--rate-100k", type=float, default=5.0, help="queries/s, 100,000 items")
    args = parse(parser, argv)
    quick = args.quick
    plan = {
        "seconds": 5.0 if quick else 30.0,
        "rate_10k": args.rate_10k,
        "rate_100k": args.rate_100k,
        "baseline_queries": 10 if quick else 50,
    }
    loads = {"start": load()}
    cases = (
        [(10_000, 128)] if quick else [(10_000, d) for d in (64, 128, 256, 512)] + [(100_000, 128)]
    )
    core = core_refresh(cases, [4, 8, 16, 32, 64, 128], 1 if quick else 3)
    loads["after core"] = load()
    sizes = [10_000] if quick else [10_000, 100_000]
    with tempfile.TemporaryDirectory(prefix="opml-identify-") as tmp:
        service = measure_service(Path(tmp), sizes, plan)
    loads["end"] = load()
    data = {
        "command": command_line("benchmarks.perf.identify"),
        "machine": machine_info(),
        "loads": loads,
        "plan": plan,
        "core": core,
        "service": service,
    }
    text = report(data)
    write_results(result_stem("identify", quick), [text], data)
    print(text)


if __name__ == "__main__":
    main()
