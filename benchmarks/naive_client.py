"""The naive client's cost (issue 18), before / after: one sample per request or per frame.

    .venv/bin/python -m benchmarks.naive_client --baseline /path/to/old/checkout [--quick]
        [--profile]

Starts ``python -m service`` (:class:`devkit.launcher.ServiceProcess`: embedded Redis with
``appendfsync always`` in a temporary dir) from this checkout ("after") and, with
``--baseline``, from another checkout ("before", e.g. ``git worktree add /tmp/base <commit>``),
both at once, and measures them in alternation, ``--rounds`` rounds (figures: the median over
rounds), on a model of d = 64 (``normalize: l2``):

* ``GET /livez`` and single-sample ``POST .../samples``, sent in sequence over one keep-alive
  connection (:class:`benchmarks.loadgen.RawPool`), ``--requests`` each after a warm-up: the
  service's CPU per request (utime + stime of all its threads, from ``/proc``; the learning of
  the samples included) and the median latency;
* single-sample ``POST .../samples`` at 500 requests/s offered, open loop
  (``benchmarks.loadgen rest-one``, its own process): p50 / p99 latency, service CPU per request;
  the disk's fsync latency (write 600 B + fsync on the data dir) beside it;
* WebSocket, one sample per JSON frame (``benchmarks.loadgen ws --frame 1``, ``--connections``
  connections, 32 frames in flight each): samples/s acknowledged (durable) and the learner lag
  p99 (ack -> applied, from ``/events``);
* the best frames: binary frames of 256 and of 1024 samples (one connection), samples/s, each
  as a share of the core ``learn_many``'s own throughput on the same stream (measured in this
  process, in the service's batches of 4096; both frame sizes cut their frames from the same
  pool of 4096 samples). The target is on the best of them, as ``benchmarks.service_load``
  picks its best frame size; 256 is the size the earlier runs measured alone;
* this checkout only (``--sweep``, default 250, 1000 and 2000 requests/s): single-sample
  ``POST .../samples`` at other offered rates, open loop as at 500/s, for how the service CPU
  per request depends on the rate (each request finds the caches colder the longer the
  service idled before it; below 1,280 samples/s the writer learns a batch every 50 ms). Not on
  the baseline: it cannot serve 2000/s on two cores.

``--profile``: py-spy (in the ``bench`` extra: ``python3 dev.py bench``) samples each service
during a sequential single-sample run; the report lists the functions with the most samples on
top of the stack (self time) and the stacks are saved as ``naive_client_profile_{label}.txt``.

The machine is shared: CPU per request is what load disturbs least; the load average is
recorded at the start and end of every measurement. Nothing is asserted. Writes
``benchmarks/results/naive_client{,_quick}.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import (
    NO_PY_SPY,
    RESULTS_DIR,
    command_line,
    machine_block,
    machine_info,
    py_spy,
    thread_cpu,
)
from benchmarks.loadgen import JSON_HEADERS, RawPool, _dumps, _row, stream
from benchmarks.service_load import MODEL, core_throughput, fsync_latency
from devkit.launcher import ServiceProcess
from service.engine.writer import APPLY_DELAY_S, COALESCE_SAMPLES

ROOT = Path(__file__).resolve().parents[1]
D = 64
NAME = "n64"
BEST_FRAME = 256
#: The binary frame sizes measured for the best frames (the same pool of 4096 samples at d = 64:
#: ``benchmarks.loadgen.pool_size``), and their result keys (``ws_best``: 256, as in earlier runs).
BINARY_FRAMES = (BEST_FRAME, 1024)


def best_key(frame: int) -> str:
    """The result key of the binary frames of ``frame`` samples."""
    return "ws_best" if frame == BEST_FRAME else f"ws_best_{frame}"


@dataclass
class Plan:
    rounds: int
    requests: int
    seconds: float
    rate: float
    connections: int
    profile: bool
    quick: bool
    sweep: tuple[float, ...] = ()


def loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


class Service:
    """One side of the comparison: ``python -m service`` from a checkout."""

    def __init__(self, label: str, process: ServiceProcess) -> None:
        self.label, self.process = label, process
        self.frame_ids = itertools.count(1)  # each WS run its own frame ids (no replays)

    @property
    def url(self) -> str:
        return self.process.url

    def cpu(self) -> float:
        return sum(thread_cpu(self.process.pid))

    def prepare(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            answer = client.post("/v1/models", json={"name": NAME, "dim": D, **MODEL})
            answer.raise_for_status()
            model: dict[str, Any] = answer.json()
            return model

    def loadgen(self, kind: str, *args: str | int | float) -> dict[str, Any]:
        """One ``benchmarks.loadgen`` measurement as its own process, with the service's CPU
        over it."""
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = Path(f.name)
        cmd = [sys.executable, "-m", "benchmarks.loadgen", kind, "--url", self.url,
               "--model", NAME, "--dim", str(D), "--out", str(out),
               *(str(a) for a in args)]  # fmt: skip
        cpu0 = self.cpu()
        subprocess.run(cmd, cwd=ROOT, check=True, timeout=600)
        result: dict[str, Any] = json.loads(out.read_text())
        result["service_cpu_s"] = self.cpu() - cpu0
        out.unlink()
        return result


def single_bodies() -> list[bytes]:
    X, y = stream(512, D)
    return [_dumps({"x": _row(x), "y": int(label)}).encode() for x, label in zip(X, y, strict=True)]


async def sequential(service: Service, method: str, path: str, n: int) -> dict[str, Any]:
    """``n`` requests one after the other on one keep-alive connection, after a warm-up."""
    bodies = single_bodies() if method == "POST" else [b""]
    pool = RawPool(service.url, 1)
    for i in range(200):
        await pool.request(method, path, bodies[i % len(bodies)], JSON_HEADERS)
    load0, cpu0, t0 = loadavg(), service.cpu(), time.perf_counter()
    times = np.empty(n)
    bad = 0
    for i in range(n):
        start = time.perf_counter()
        status, _ = await pool.request(method, path, bodies[i % len(bodies)], JSON_HEADERS)
        times[i] = time.perf_counter() - start
        bad += status >= 300
    cpu, wall = service.cpu() - cpu0, time.perf_counter() - t0
    await pool.close()
    return {
        "cpu_us_per_request": cpu / n * 1e6,
        "p50_ms": float(np.median(times)) * 1e3,
        "requests_per_s": n / wall,
        "errors": bad,
        "load": [load0, loadavg()],
    }


def rest_open_loop(service: Service, plan: Plan) -> dict[str, Any]:
    load0 = loadavg()
    r = service.loadgen("rest-one", "--rate", plan.rate, "--seconds", plan.seconds)
    return {
        "cpu_us_per_request": r["service_cpu_s"] / max(r["ok"], 1) * 1e6,
        "p50_ms": r["latency"]["p50_ms"],
        "p99_ms": r["latency"]["p99_ms"],
        "achieved": r["achieved_rate"],
        "errors": r["requests"] - r["ok"],
        "load": [load0, loadavg()],
    }


def ws(service: Service, plan: Plan, encoding: str, frame: int, connections: int) -> dict[str, Any]:
    load0 = loadavg()
    first = next(service.frame_ids) * 100
    r = service.loadgen("ws", "--encoding", encoding, "--frame", frame, "--window", 32,
                        "--connections", connections, "--events", "--seconds", plan.seconds,
                        "--first-id", first)  # fmt: skip
    return {
        "samples_per_s": r["throughput"],
        "lag_p99_ms": r.get("lag", {}).get("p99_ms"),
        "cpu_us_per_sample": r["service_cpu_s"] / max(r["samples_acked"], 1) * 1e6,
        "errors": r["frame_errors"],
        "connections": connections,
        "load": [load0, loadavg()],
    }


#: Leaves of a thread that waits (as ``benchmarks.service_load.read_collapsed`` counts them).
IDLE = ("_worker (concurrent/futures/thread.py:81)", "Condition.wait", "Queue.get")
#: The event loop's own C code (uvloop: socket I/O, polling), where py-spy sees no Python frame.
UVLOOP = "(uvloop, C: socket I/O and polling)"


def profile(service: Service, plan: Plan, tmp: Path) -> dict[str, Any]:
    """py-spy on the service during a sequential single-sample run: the top self-time frames."""
    spy = py_spy()
    if spy is None:
        return {"error": NO_PY_SPY}
    raw = tmp / f"profile-{service.label}.txt"
    seconds = 8
    proc = subprocess.Popen(
        [spy, "record", "--pid", str(service.process.pid), "--rate", "200", "--duration",
         str(seconds), "--nonblocking", "--format", "raw", "-o", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    path = f"/v1/models/{NAME}/samples"
    asyncio.run(sequential(service, "POST", path, int(plan.requests * 1.5)))
    err = proc.communicate(timeout=seconds + 60)[1].decode()
    if not raw.exists():
        return {"error": "py-spy could not attach: " + err[-400:]}
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        leaf = stack.split(";")[-1]
        if leaf.startswith(IDLE):
            continue  # a worker thread waiting for work: not CPU
        if leaf.startswith("Runner.run (asyncio/runners.py"):
            leaf = UVLOOP
        leaves[leaf] += int(count)
        total += int(count)
    suffix = "_quick" if plan.quick else ""
    (RESULTS_DIR / f"naive_client_profile_{service.label}{suffix}.txt").write_text(raw.read_text())
    return {
        "samples": total,
        "top": [{"frame": f, "share": n / max(total, 1)} for f, n in leaves.most_common(15)],
    }


def sweep_key(rate: float) -> str:
    """The result key of the sweep's run at ``rate`` (apart from ``rest_500``, which holds the
    run at ``--rate``, whatever it is)."""
    return f"sweep_{rate:g}"


def measure_round(service: Service, plan: Plan, sweep: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    samples_path = f"/v1/models/{NAME}/samples"
    out["livez"] = asyncio.run(sequential(service, "GET", "/livez", plan.requests * 2))
    out["rest_seq"] = asyncio.run(sequential(service, "POST", samples_path, plan.requests))
    out["rest_500"] = rest_open_loop(service, plan)
    out["ws_json1"] = ws(service, plan, "json", 1, plan.connections)
    out["ws_json1_one"] = ws(service, plan, "json", 1, 1)
    for frame in BINARY_FRAMES:
        out[best_key(frame)] = ws(service, plan, "binary", frame, 1)
    for rate in [r for r in plan.sweep if r != plan.rate] if sweep else []:
        out[sweep_key(rate)] = rest_open_loop(service, replace(plan, rate=rate))
    return out


def measure(plan: Plan, roots: dict[str, Path]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="naive-client-") as tmp_name, \
            contextlib.ExitStack() as stack:  # fmt: skip
        tmp = Path(tmp_name)
        services: list[Service] = []
        model: dict[str, Any] = {}
        for label, root in roots.items():
            process = ServiceProcess(tmp / label, None, root=root)
            stack.enter_context(process.start(timeout=90))
            services.append(Service(label, process))
            model = services[-1].prepare()
            print(f"{label}: {root} on {process.url}", flush=True)
        fsync = fsync_latency(services[0].process.data_dir)
        runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in services}
        cores: list[float] = []
        for k in range(plan.rounds):
            for service in services:
                result = measure_round(service, plan, sweep=service.label == "after")
                runs[service.label].append(result)
                print(f"round {k + 1} {service.label}: {json.dumps(result)}", flush=True)
            # in every round, beside the services' runs: it moves with the machine's state too
            cores.append(core_throughput(model, BEST_FRAME, 200_000))
            print(f"round {k + 1} core learn_many: {cores[-1]:,.0f} samples/s", flush=True)
        profiles = {s.label: profile(s, plan, tmp) for s in services} if plan.profile else {}
    return {
        "runs": runs,
        "fsync": fsync,
        "core_samples_per_s": float(np.median(cores)),
        "core_rounds": cores,
        "profiles": profiles,
    }


# -- report -------------------------------------------------------------------------------------

#: (row key, metric, label, target, True when higher is better)
ROWS: list[tuple[str, str, str, float | None, bool]] = [
    ("livez", "cpu_us_per_request", "`GET /livez`, service CPU us/request", 120, False),
    ("rest_seq", "cpu_us_per_request", "REST single sample, in sequence: CPU us/request", 400,
     False),
    ("rest_seq", "p50_ms", "REST single sample, in sequence: p50 ms", None, False),
    ("rest_500", "cpu_us_per_request", "REST single sample at 500/s: CPU us/request", 400, False),
    ("rest_500", "p50_ms", "REST single sample at 500/s: p50 ms", None, False),
    ("rest_500", "p99_ms", "REST single sample at 500/s: p99 ms", 3, False),
    ("ws_json1", "samples_per_s", "WS, 1 sample per JSON frame, {c} connections: samples/s",
     20_000, True),
    ("ws_json1", "lag_p99_ms", "same: learner lag p99 ms", 100, False),
    ("ws_json1", "cpu_us_per_sample", "same: service CPU us/sample", None, False),
    ("ws_json1_one", "samples_per_s", "WS, 1 sample per JSON frame, 1 connection: samples/s",
     None, True),
    ("ws_json1_one", "lag_p99_ms", "same: learner lag p99 ms", None, False),
    *((best_key(f), "samples_per_s", f"WS, binary frames of {f}: samples/s", None, True)
      for f in BINARY_FRAMES),
]  # fmt: skip


def median(values: list[Any]) -> float | None:
    clean = [float(v) for v in values if v is not None and v == v]
    return float(np.median(clean)) if clean else None


def table(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    out = {
        f"{key}.{metric}": median([r[key][metric] for r in runs if key in r])
        for key, metric, *_ in ROWS
    }
    for key in runs[0]:
        if key.startswith("sweep_"):
            for metric in ("cpu_us_per_request", "p50_ms", "p99_ms", "achieved"):
                out[f"{key}.{metric}"] = median([r[key][metric] for r in runs])
    return out


def _f(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def verdict(value: float | None, target: float | None, higher: bool) -> str:
    if target is None or value is None:
        return "-"
    met = value >= target if higher else value <= target
    return ("met" if met else "MISSED") + f" ({'>=' if higher else '<='} {target:,g})"


def report(data: dict[str, Any], quick: bool) -> str:
    after = data["table"]["after"]
    before = data["table"].get("before", {})
    plan = data["plan"]
    lines = [
        "# The naive client's cost, before / after (issue 18)",
        "",
        "Generated by `benchmarks/naive_client.py`; do not edit by hand. Command (repository "
        "root):",
        "",
        f"    {data['command']}",
        "",
        machine_block(data["machine"]),
        f"- Before: `{data['baseline']}`; after: this checkout. Both services ran at once "
        "(embedded Redis, `appendfsync always`, d = 64, `normalize: l2`) and were measured in "
        f"alternation, {plan['rounds']} round(s); each figure is the median over rounds.",
        f"- Load average (1, 5, 15 min) at start: {data['load_start']}, at end: "
        f"{data['load_end']}; per measurement in the JSON (`load`: at its start and end). "
        f"Wall time {data['wall_s']:.0f} s.",
        f"- The disk's fsync (write 600 B + fsync, data dir): p50 {data['fsync']['p50_ms']:.2f} "
        f"ms, p99 {data['fsync']['p99_ms']:.2f} ms.",
        "",
        f"In sequence: {plan['requests']:,} requests (`/livez`: {2 * plan['requests']:,}) one "
        "after the other on one keep-alive connection after 200 warm-up requests. At 500/s: "
        f"open loop for {plan['seconds']:.0f} s, latency from the scheduled time. WS: "
        f"{plan['seconds']:.0f} s, 32 frames in flight per connection, throughput = samples "
        "acknowledged (durable) per second after a warm-up. Service CPU = utime + stime of all "
        "its threads (learning included), from `/proc`, divided by the answers or samples.",
        "",
        "| measurement | before | after | after / before | target (after) |",
        "|---|---|---|---|---|",
    ]
    for key, metric, label, target, higher in ROWS:
        k = f"{key}.{metric}"
        a, b = after.get(k), before.get(k)
        if a is None and b is None:
            continue  # not measured in this run (a row added after it)
        digits = 2 if metric.endswith("_ms") else 0
        ratio = "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"
        lines.append(
            f"| {label.format(c=plan['connections'])} | {_f(b, digits)} | {_f(a, digits)} | "
            f"{ratio} | {verdict(a, target, higher)} |"
        )
    core = data["core_samples_per_s"]
    rounds = data.get("core_rounds") or [core]
    measured = [f for f in BINARY_FRAMES if after.get(f"{best_key(f)}.samples_per_s")]
    best = max(measured, key=lambda f: after[f"{best_key(f)}.samples_per_s"], default=None)
    for frame in measured:
        share = {
            lbl: (t.get(f"{best_key(frame)}.samples_per_s") or float("nan")) / core
            for lbl, t in data["table"].items()
        }
        lines.append(
            f"| binary frames of {frame} / core `learn_many` ({core:,.0f} samples/s, same "
            f"stream; median of {', '.join(f'{c:,.0f}' for c in rounds)}, one per round) | "
            f"{share.get('before', float('nan')):.2f} | {share['after']:.2f} | - | "
            + (f"{verdict(share['after'], 0.5, True)}, the best frames" if frame == best else "-")
            + " |"
        )
    if plan.get("sweep"):
        lines += [
            "",
            "## Single-sample REST by offered rate (after only)",
            "",
            "The same requests, open loop, at other rates; in sequence for comparison. A request "
            "that arrives at an idle service finds its caches cold, and below "
            f"{COALESCE_SAMPLES / APPLY_DELAY_S:,.0f} samples/s the writer learns a batch every "
            f"{APPLY_DELAY_S * 1000:.0f} ms (the hold; its cost is spread over fewer requests at "
            "a low rate).",
            "",
            "| offered | service CPU us/request | p50 ms | p99 ms |",
            "|---|---|---|---|",
            f"| in sequence | {_f(after.get('rest_seq.cpu_us_per_request'))} | "
            f"{_f(after.get('rest_seq.p50_ms'), 2)} | - |",
        ]
        for rate in sorted({*plan["sweep"], plan["rate"]}):
            key = "rest_500" if rate == plan["rate"] else sweep_key(rate)
            lines.append(
                f"| {rate:,g}/s | {_f(after.get(f'{key}.cpu_us_per_request'))} | "
                f"{_f(after.get(f'{key}.p50_ms'), 2)} | {_f(after.get(f'{key}.p99_ms'), 2)} |"
            )
    errors = {
        label: sum(r[key].get("errors", 0) for r in runs for key in r)
        for label, runs in data["runs"].items()
    }
    lines += [
        "",
        "Requests or frames that failed (all rounds): "
        + ", ".join(f"{label} {n}" for label, n in errors.items())
        + ".",
    ]
    for label, prof in data["profiles"].items():
        lines += ["", f"## Profile, {label}: py-spy during single-sample POSTs in sequence", ""]
        if "error" in prof:
            lines.append(prof["error"])
            continue
        lines += [
            f"{prof['samples']:,} samples of the service's threads not waiting; the frames "
            "most often on top of the stack (self time):",
            "",
            "| share | frame |",
            "|---|---|",
        ]
        lines += [f"| {t['share']:.1%} | `{t['frame']}` |" for t in prof["top"]]
    if quick:
        lines += ["", "(`--quick`: shorter runs, one round; indicative only.)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--baseline-label", help="what the baseline is, for the report")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--connections", type=int, default=4, help="WS connections (JSON 1)")
    parser.add_argument(
        "--sweep", default="250,1000,2000",
        help="other REST rates for this checkout, comma-separated ('' for none)",
    )  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="py-spy each service")
    parser.add_argument(
        "--report-only", action="store_true",
        help="re-render the .md from the saved .json (no measurement)",
    )  # fmt: skip
    args = parser.parse_args()
    suffix = "_quick" if args.quick else ""
    md, js = RESULTS_DIR / f"naive_client{suffix}.md", RESULTS_DIR / f"naive_client{suffix}.json"
    if args.report_only:
        md.write_text(report(json.loads(js.read_text()), args.quick))
        return
    plan = Plan(
        rounds=1 if args.quick else args.rounds,
        requests=1000 if args.quick else args.requests,
        seconds=5.0 if args.quick else args.seconds,
        rate=args.rate,
        connections=args.connections,
        profile=args.profile,
        quick=args.quick,
        sweep=tuple(float(r) for r in args.sweep.split(",") if r.strip()),
    )
    roots = {"after": ROOT}
    if args.baseline is not None:
        roots = {"before": args.baseline.resolve(), **roots}
    load_start, started = loadavg(), time.time()
    measured = measure(plan, roots)
    data = {
        "command": command_line("benchmarks.naive_client"),
        "machine": machine_info(),
        "baseline": args.baseline_label or str(args.baseline),
        "plan": plan.__dict__,
        "load_start": load_start,
        "load_end": loadavg(),
        "wall_s": time.time() - started,
        **measured,
        "table": {label: table(runs) for label, runs in measured["runs"].items()},
    }
    js.write_text(json.dumps(data, indent=1))
    md.write_text(report(data, args.quick))
    print(md.read_text())


if __name__ == "__main__":
    main()
