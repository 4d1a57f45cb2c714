"""Ingestion: the service beside the floor of its stack, in one run, as ratios.

    python3 dev.py bench ingest [--quick]
    .venv/bin/python -m benchmarks.perf.ingest [--rounds 3] [--seconds 10] [--quick]

Starts ``python -m service`` (embedded Redis, ``appendfsync always``, d = 64, ``normalize:
l2``), the floor app (:mod:`benchmarks.harness.floor`: parse, one Lua append group-committed on
the same Redis, its log trimmed as the service's checkpoints trim the service's, ack; nothing
else) and, for compression, two more services, one with the
defaults and one with ``OPML_WS_PER_MESSAGE_DEFLATE=true``. In each of ``--rounds`` rounds,
the same client (:mod:`benchmarks.harness.loadgen`, a process of its own) measures each of
these on the service and on the floor back to back, the order alternating from round to round:

* ``rest_seq``: single-sample ``POST .../samples`` one after the other on one keep-alive
  connection (requests/s and server CPU per request);
* ``ws_json1`` / ``ws_json1_4``: one sample per JSON frame, 32 frames in flight per
  connection, on 1 and on 4 connections (samples/s acknowledged, server CPU per sample);
* ``ws_binary``: binary frames of 256 and 1024 samples on one connection (the best of them is
  the headline, also as a share of the core ``learn_many`` on the same stream, measured in
  this process each round);
* on the service only, compression: one-sample JSON frames on one connection from a client
  that offers permessage-deflate, to a default service (which declines it) and to a
  service that accepts it, two services that take only these frames.

The headline is service / floor per round (throughput: higher is better; CPU per sample:
lower is better), with the median and the range over rounds. Server CPU is utime + stime of
every thread of the server's process; the Redis server's CPU (the one both write to, read over
each target's own run) is reported beside it, since the service's appends do more there
(idempotency records with their expiry index) than the floor's. The machine
may be shared: the ratios of one round are measured within seconds of each other, which is
what makes them travel between machines; the absolute figures are recorded too. Nothing is
asserted. Writes ``benchmarks/results/ingest.{md,json}`` (``quick/`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.floor import KEPT_SAMPLES
from benchmarks.harness.loadgen import JSON_HEADERS, RawPool, _dumps, _row, stream
from benchmarks.harness.machine import loadavg, machine_block, machine_info
from benchmarks.harness.results import result_stem, run_record, write_results
from benchmarks.harness.targets import Target, fsync_latency, start_floor, start_service
from benchmarks.perf.service_load import MODEL, core_throughput

NAME, D = "n64", 64
BINARY_FRAMES = (256, 1024)
#: (key, label, what is compared with the floor)
MEASURES = [
    ("rest_seq", "REST, one sample per request, in sequence"),
    ("ws_json1", "WS, one sample per JSON frame, 1 connection"),
    ("ws_json1_4", "WS, one sample per JSON frame, 4 connections"),
    *((f"ws_binary_{f}", f"WS, binary frames of {f} samples, 1 connection") for f in BINARY_FRAMES),
]
#: The WebSocket measurements' loadgen settings: key -> (encoding, frame, connections).
WS_SETTINGS = {
    "ws_json1": ("json", 1, 1),
    "ws_json1_4": ("json", 1, 4),
    **{f"ws_binary_{f}": ("binary", f, 1) for f in BINARY_FRAMES},
}


async def sequential(target: Target, n: int) -> dict[str, Any]:
    """``n`` single-sample POSTs one after the other on one keep-alive connection."""
    X, y = stream(512, D)
    bodies = [_dumps({"x": _row(x), "y": int(v)}).encode() for x, v in zip(X, y, strict=True)]
    path = f"/v1/models/{NAME}/samples"
    pool = RawPool(target.url, 1)
    for i in range(100):  # warm-up
        await pool.request("POST", path, bodies[i % len(bodies)], JSON_HEADERS)
    cpu0, redis0, t0, bad = target.cpu(), target.redis_cpu(), time.perf_counter(), 0
    for i in range(n):
        status, _ = await pool.request("POST", path, bodies[i % len(bodies)], JSON_HEADERS)
        bad += status >= 300
    wall, cpu = time.perf_counter() - t0, target.cpu() - cpu0
    redis_cpu = target.redis_cpu() - redis0
    await pool.close()
    return {
        "samples_per_s": n / wall,
        "cpu_us_per_sample": cpu / n * 1e6,
        "redis_cpu_us_per_sample": redis_cpu / n * 1e6,
        "errors": bad,
    }


def ws(target: Target, seconds: float, encoding: str, frame: int, connections: int,
       deflate: bool = False) -> dict[str, Any]:  # fmt: skip
    r = target.loadgen("ws", "--model", NAME, "--dim", D, "--encoding", encoding,
                       "--frame", frame, "--window", 32, "--connections", connections,
                       "--seconds", seconds, "--first-id", target.next_frame_ids(),
                       *(["--deflate"] if deflate else []))  # fmt: skip
    return {
        "samples_per_s": r["throughput"],
        "cpu_us_per_sample": r["service_cpu_s"] / max(r["samples_acked"], 1) * 1e6,
        "redis_cpu_us_per_sample": r["redis_cpu_s"] / max(r["samples_acked"], 1) * 1e6,
        "errors": r["frame_errors"],
        "deflate": r["deflate"],
    }


def measure_one(target: Target, key: str, seconds: float, requests: int) -> dict[str, Any]:
    """One measurement of :data:`MEASURES` on one target, from a settled service."""
    target.settle(NAME)
    if key == "rest_seq":
        return asyncio.run(sequential(target, requests))
    return ws(target, seconds, *WS_SETTINGS[key])


def offering_deflate(target: Target, seconds: float) -> dict[str, Any]:
    """One-sample JSON frames on one connection from a client that offers permessage-deflate,
    from a settled service (its previous run's samples learned, its Redis not persisting)."""
    target.settle(NAME)
    return ws(target, seconds, "json", 1, 1, deflate=True)


def measure_pair(
    service: Target, floor: Target, seconds: float, requests: int, floor_first: bool
) -> dict[str, dict[str, Any]]:
    """Every measurement on the service and the floor back to back (the order alternating
    by round), so that a change of the machine's load between them moves both alike."""
    load0 = loadavg()
    out: dict[str, dict[str, Any]] = {"service": {}, "floor": {}}
    order = [("floor", floor), ("service", service)]
    for key, _ in MEASURES:
        for label, target in order if floor_first else order[::-1]:
            out[label][key] = measure_one(target, key, seconds, requests)
    for side in out.values():
        side["load"] = [load0, loadavg()]
    return out


def best_binary(run: dict[str, Any]) -> dict[str, Any]:
    return max((run[f"ws_binary_{f}"] for f in BINARY_FRAMES), key=lambda r: r["samples_per_s"])


def ratios(service: dict[str, Any], floor: dict[str, Any]) -> dict[str, dict[str, float]]:
    """service / floor of one round, per measurement (and of the best binary frames)."""
    pairs = {key: (service[key], floor[key]) for key, _ in MEASURES}
    pairs["ws_binary_best"] = (best_binary(service), best_binary(floor))
    return {
        key: {
            "throughput": s["samples_per_s"] / f["samples_per_s"],
            "cpu_per_sample": s["cpu_us_per_sample"] / f["cpu_us_per_sample"],
            "redis_cpu_per_sample": s["redis_cpu_us_per_sample"]
            / max(f["redis_cpu_us_per_sample"], 1e-9),
        }
        for key, (s, f) in pairs.items()
    }


def measure(rounds: int, seconds: float, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp_name, \
            contextlib.ExitStack() as stack:  # fmt: skip
        tmp = Path(tmp_name)
        service, process = stack.enter_context(start_service("service", tmp / "service"))
        # The compression pair runs on two services of its own, alike but for the setting:
        # the main one's Redis, rewriting its AOF after the binary runs, would weigh on
        # whichever side ran on it.
        declining, declining_process = stack.enter_context(
            start_service("service_declines", tmp / "declines")
        )
        deflating, deflating_process = stack.enter_context(
            start_service("service_deflate", tmp / "deflate", OPML_WS_PER_MESSAGE_DEFLATE="true")
        )
        redis = process.embedded_redis()
        assert redis is not None, "the service runs its embedded Redis"
        floor = stack.enter_context(start_floor(f"redis://127.0.0.1:{redis[1]}/0", tmp, D))
        for target in (service, floor):
            target.redis_pid, target.redis_port = redis
        for side, side_process in ((declining, declining_process), (deflating, deflating_process)):
            side.redis_pid, side.redis_port = side_process.embedded_redis() or (None, None)
            side.create_model(NAME, D, **MODEL)
        model = service.create_model(NAME, D, **MODEL)
        fsync = fsync_latency(process.data_dir)
        out: list[dict[str, Any]] = []
        for k in range(rounds):
            pair = measure_pair(service, floor, seconds, requests, floor_first=k % 2 == 1)
            # The main Redis's AOF rewrite after the binary runs shares the disk (and the
            # cores) with the compression pair's Redis servers: let it end first.
            service.settle(NAME)
            run: dict[str, Any] = {
                **pair,
                "deflate": {
                    "declined": offering_deflate(declining, seconds),
                    "accepted": offering_deflate(deflating, seconds),
                },
                "core_samples_per_s": core_throughput(model, BINARY_FRAMES[0], 200_000),
            }
            run["ratios"] = ratios(run["service"], run["floor"])
            run["binary_over_core"] = (
                best_binary(run["service"])["samples_per_s"] / run["core_samples_per_s"]
            )
            run["floor_binary_over_core"] = (
                best_binary(run["floor"])["samples_per_s"] / run["core_samples_per_s"]
            )
            out.append(run)
            print(f"round {k + 1}: {json.dumps(run['ratios'])}", flush=True)
    return {"rounds": out, "fsync": fsync}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": float(np.median(values)), "min": min(values), "max": max(values)}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in MEASURES] + ["ws_binary_best"]
    summary: dict[str, Any] = {
        key: {
            metric: spread([r["ratios"][key][metric] for r in rounds])
            for metric in ("throughput", "cpu_per_sample", "redis_cpu_per_sample")
        }
        for key in keys
    }
    summary["binary_over_core"] = spread([r["binary_over_core"] for r in rounds])
    summary["floor_binary_over_core"] = spread([r["floor_binary_over_core"] for r in rounds])
    summary["deflate"] = {
        metric: spread([r["deflate"]["accepted"][metric] / r["deflate"]["declined"][metric]
                        for r in rounds])
        for metric in ("samples_per_s", "cpu_us_per_sample")
    }  # fmt: skip
    return summary


def _range(s: dict[str, float]) -> str:
    return f"**{s['median']:.2f}** ({s['min']:.2f}-{s['max']:.2f})"


def _median(rounds: list[dict[str, Any]], *path: str) -> float:
    values = []
    for r in rounds:
        v: Any = r
        for p in path:
            v = v[p]
        values.append(float(v))
    return float(np.median(values))


def _floor_over_core(summary: dict[str, Any]) -> list[str]:
    """The floor's best binary frames against the same ``learn_many``: above 1.0, the floor
    appends faster than the core learns, so no service that learns every sample can keep up
    with it on binary frames."""
    if "floor_binary_over_core" not in summary:
        return []
    ratio = summary["floor_binary_over_core"]
    line = f"The floor's best binary frames / the same `learn_many`: {_range(ratio)}"
    if ratio["min"] > 1.0:
        line += (
            ": the floor appends faster than the core alone learns, so on binary frames no "
            "service that learns every sample reaches 1.0x the floor"
        )
    return ["", line + "."]


def report(data: dict[str, Any]) -> list[str]:
    rounds, summary, run = data["rounds"], data["summary"], data["run"]
    n = len(rounds)
    lines = [
        "# Ingestion: the service beside the floor of its stack",
        "",
        "Generated by `benchmarks/perf/ingest.py`; do not edit by hand.",
        "",
        f"    {run['command']}",
        "",
        machine_block(data["machine"]),
        f"- {n} round(s) of {data['plan']['seconds']:g} s per WebSocket measurement and "
        f"{data['plan']['requests']:,} REST requests; load average (1, 5, 15 min) at the end: "
        f"{run['load_average']}. The disk's fsync (600 B): p50 {data['fsync']['p50_ms']:.2f} ms.",
        "",
        "## Service / floor (median over rounds, range in brackets)",
        "",
        "The floor is a bare uvicorn app doing only the durable work (parse, one Lua append "
        "group-committed on the same Redis with `appendfsync always`, the log trimmed to its "
        f"last {KEPT_SAMPLES:,} samples as the service's checkpoints trim its own, ack), measured "
        "by the same "
        "client back to back with the service (the order alternating by round), each from a "
        "settled service (its learner caught up). Throughput: at or above 1.0 means the "
        "service keeps up with "
        "its stack's floor; CPU per sample: the service's extra work (learning, validation, "
        "idempotency, metrics) as a multiple of the floor's, in its own process and in the "
        "Redis server both write to (the service also keeps an idempotency record per frame "
        "with its expiry, which the floor does not).",
        "",
        "| measurement | throughput, service / floor | server CPU per sample, service / floor "
        "| Redis CPU per sample, service / floor | service samples/s | floor samples/s |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in [*MEASURES, ("ws_binary_best", "WS, the best binary frames")]:
        if key == "ws_binary_best":
            s_rate = float(np.median([best_binary(r["service"])["samples_per_s"] for r in rounds]))
            f_rate = float(np.median([best_binary(r["floor"])["samples_per_s"] for r in rounds]))
        else:
            s_rate = _median(rounds, "service", key, "samples_per_s")
            f_rate = _median(rounds, "floor", key, "samples_per_s")
        lines.append(
            f"| {label} | {_range(summary[key]['throughput'])} | "
            f"{_range(summary[key]['cpu_per_sample'])} | "
            f"{_range(summary[key]['redis_cpu_per_sample'])} | {s_rate:,.0f} | {f_rate:,.0f} |"
        )
    core = _median(rounds, "core_samples_per_s")
    deflate = summary["deflate"]
    lines += [
        "",
        f"Best binary frames / the core's `learn_many` on the same stream ({core:,.0f} "
        f"samples/s, measured each round): {_range(summary['binary_over_core'])}.",
        *_floor_over_core(summary),
        "",
        "## Compression (permessage-deflate), one-sample JSON frames, one connection",
        "",
        "The same client offers permessage-deflate (as browsers and Python's `websockets` do) "
        "to a service with the default settings, which declines it, and to a service started "
        "with `OPML_WS_PER_MESSAGE_DEFLATE=true`, which accepts it (two services beside the "
        "one above, each taking only these frames).",
        "",
        "| | declined (default) | accepted |",
        "|---|---|---|",
        f"| samples/s | {_median(rounds, 'deflate', 'declined', 'samples_per_s'):,.0f} | "
        f"{_median(rounds, 'deflate', 'accepted', 'samples_per_s'):,.0f} |",
        f"| service CPU us/sample | "
        f"{_median(rounds, 'deflate', 'declined', 'cpu_us_per_sample'):.0f} | "
        f"{_median(rounds, 'deflate', 'accepted', 'cpu_us_per_sample'):.0f} |",
        "",
        f"Accepted / declined: throughput {_range(deflate['samples_per_s'])}, CPU per sample "
        f"{_range(deflate['cpu_us_per_sample'])}.",
    ]
    errors = sum(
        v.get("errors", 0)
        for r in rounds
        for side in ("service", "floor", "deflate")
        for v in r[side].values()
        if isinstance(v, dict)
    )
    lines += ["", f"Requests or frames refused, all rounds: {errors}."]
    if data["plan"]["quick"]:
        lines += ["", "(`--quick`: one short round; indicative only.)"]
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.perf.ingest", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per WS measurement")
    parser.add_argument("--requests", type=int, default=3000, help="REST requests in sequence")
    return parser


#: What ``--quick`` sets (explicit options still win).
QUICK = {"rounds": 1, "seconds": 1.0, "requests": 200}


def main(argv: list[str] | None = None) -> None:
    args = parse(build_parser(), argv, QUICK)
    started = time.time()
    measured = measure(args.rounds, args.seconds, args.requests)
    data = {
        "run": run_record("benchmarks.perf.ingest"),
        "machine": machine_info(),
        "plan": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "requests": args.requests,
            "quick": args.quick,
        },
        "wall_s": time.time() - started,
        "summary": summarise(measured["rounds"]),
        **measured,
    }
    out = result_stem("ingest", args.quick)
    lines = report(data)
    write_results(out, lines, data)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
