"""Certificates through the service: latency and CPU of ``GET .../certificate`` next to the
core's own computation on the same data, and whether other queries wait while one is computed.

    .venv/bin/python -m benchmarks.perf.certificate_service [--quick]

Starts ``python -m service`` (:class:`devkit.launcher.ServiceProcess`, embedded Redis in a
temporary dir) and, per dimension d (64 and 256), creates a model with ``holdout = 0.2``,
``holdout_window = 5000`` and ``pac_bayes_window = 5000`` (``normalize = l2``), feeds it
30,000 samples of 10 Gaussian classes (so the reservoir and the PAC-Bayes window are full) and
measures, sequentially from this process:

* per method (``binomial``, ``kl``, ``pac-bayes``): the latency of ``GET .../certificate``
  (median and max over ``--repeats``) and the service's CPU per request (utime + stime of all
  its threads from ``/proc``), **beside the baseline**: the same certificate computed by the
  core in this process on a learner fed the same stream (``Learner.certificate``, median wall
  time), and the ratio;
* ``verify`` latency (p50 / p99 of ``--verifies`` sequential requests) alone and while another
  thread asks for PAC-Bayes certificates back to back: the certificate runs in a worker
  thread, so the event loop keeps answering (the ratio shows what is left: the GIL and the
  2 cores shared with the learner).

The machine is shared and noisy: compare the ratios. Nothing is asserted. Writes
``benchmarks/results/certificate_service.{md,json}``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_block, machine_info, thread_cpu
from benchmarks.harness.results import command_line, result_stem, write_results
from devkit.launcher import ServiceProcess
from service.core import Learner, LearnerConfig

METHODS = ("binomial", "kl", "pac-bayes")
CONFIG = {
    "normalize": "l2",
    "holdout": 0.2,
    "holdout_window": 5000,
    "pac_bayes_window": 5000,
    "seed": 1,
}


def data(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(10, d))
    labels = rng.integers(10, size=n)
    return centers[labels] + rng.normal(size=(n, d)), [f"c{k}" for k in labels]


def cpu(pid: int) -> float:
    return sum(thread_cpu(pid))


def feed(client: httpx.Client, name: str, X: np.ndarray, y: list[str]) -> None:
    for lo in range(0, len(y), 2000):
        rows = [{"x": X[i].tolist(), "y": y[i]} for i in range(lo, min(lo + 2000, len(y)))]
        client.post(f"/v1/models/{name}/samples", json={"samples": rows}).raise_for_status()


def verify_latencies(client: httpx.Client, name: str, X: np.ndarray, n: int) -> list[float]:
    body = {"a": X[0].tolist(), "b": X[1].tolist()}
    out = []
    for _ in range(n):
        t = time.perf_counter()
        client.post(f"/v1/models/{name}/verify", json=body).raise_for_status()
        out.append(time.perf_counter() - t)
    return out


def measure_dim(svc: ServiceProcess, d: int, n: int, repeats: int, verifies: int) -> dict[str, Any]:
    name = f"cert{d}"
    X, y = data(n, d, seed=d)
    core = Learner(LearnerConfig(dim=d, **CONFIG))  # type: ignore[arg-type]
    core.learn_many(X, y)
    out: dict[str, Any] = {"d": d, "samples": n, "methods": {}}
    with svc.client(timeout=120) as client:
        client.post("/v1/models", json={"name": name, "dim": d, **CONFIG}).raise_for_status()
        feed(client, name, X, y)
        url = f"/v1/models/{name}/certificate"
        first = client.get(url, params={"min_version": n})
        first.raise_for_status()
        out["held_out"] = first.json()["samples"]
        for method in METHODS:
            base = []
            for _ in range(repeats):
                t = time.perf_counter()
                expected = core.certificate(method=method)  # type: ignore[arg-type]
                base.append(time.perf_counter() - t)
            walls = []
            before = cpu(svc.pid)
            for _ in range(repeats):
                t = time.perf_counter()
                answer = client.get(url, params={"method": method})
                walls.append(time.perf_counter() - t)
                answer.raise_for_status()
            used = (cpu(svc.pid) - before) / repeats
            same = answer.json()["false_accept"]["bound"] == expected.false_accept.bound
            out["methods"][method] = {
                "core_s": float(np.median(base)),
                "service_s": float(np.median(walls)),
                "service_max_s": float(np.max(walls)),
                "service_cpu_s": used,
                "equal_to_core": same,
            }
        alone = verify_latencies(client, name, X, verifies)
        stop = threading.Event()
        asked = [0]

        def hammer() -> None:
            with svc.client(timeout=120) as other:
                while not stop.is_set():
                    other.get(url, params={"method": "pac-bayes"}).raise_for_status()
                    asked[0] += 1

        worker = threading.Thread(target=hammer)
        worker.start()
        time.sleep(0.5)
        during = verify_latencies(client, name, X, verifies)
        stop.set()
        worker.join()
        out["verify"] = {
            "alone_p50_ms": 1e3 * float(np.percentile(alone, 50)),
            "alone_p99_ms": 1e3 * float(np.percentile(alone, 99)),
            "during_p50_ms": 1e3 * float(np.percentile(during, 50)),
            "during_p99_ms": 1e3 * float(np.percentile(during, 99)),
            "certificates_during": asked[0],
        }
    return out


def report(result: dict[str, Any]) -> str:
    lines = [
        "# Certificates through the service: latency, CPU, and queries meanwhile",
        "",
        "Generated by `benchmarks/certificate_service.py`; do not edit by hand. Command "
        "(repository root):",
        "",
        f"    {result['command']}",
        "",
        machine_block(result["machine"]),
        "",
        "Baseline: the core's `Learner.certificate` in the benchmark process on a learner fed "
        "the same stream (median wall time); service: `GET .../certificate` sequentially "
        "(HTTP, the frozen copy, the worker thread), median and max wall time, and the "
        "service's CPU per request. `equal` = the service's false accept bound equals the "
        "core's.",
        "",
        "| d | held-out | method | core ms | service ms (median) | max | ratio | service CPU "
        "ms/request | equal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["dims"]:
        for method, m in r["methods"].items():
            lines.append(
                f"| {r['d']} | {r['held_out']} | {method} | {1e3 * m['core_s']:.1f} | "
                f"{1e3 * m['service_s']:.1f} | {1e3 * m['service_max_s']:.1f} | "
                f"{m['service_s'] / m['core_s']:.2f}x | {1e3 * m['service_cpu_s']:.1f} | "
                f"{m['equal_to_core']} |"
            )
    lines += [
        "",
        "`verify` (one pair) alone and while another client asks for PAC-Bayes certificates "
        "back to back (sequential requests, ms):",
        "",
        "| d | p50 alone | p50 during | ratio | p99 alone | p99 during | ratio | "
        "certificates meanwhile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["dims"]:
        v = r["verify"]
        lines.append(
            f"| {r['d']} | {v['alone_p50_ms']:.2f} | {v['during_p50_ms']:.2f} | "
            f"{v['during_p50_ms'] / v['alone_p50_ms']:.1f}x | {v['alone_p99_ms']:.2f} | "
            f"{v['during_p99_ms']:.2f} | {v['during_p99_ms'] / v['alone_p99_ms']:.1f}x | "
            f"{v['certificates_during']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="d = 64 only, fewer repeats")
    args = parse(parser, argv)
    dims = (64,) if args.quick else (64, 256)
    repeats, verifies = (3, 200) if args.quick else (7, 500)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        svc = ServiceProcess(Path(tmp), None).start()
        try:
            dims_out = [measure_dim(svc, d, 30_000, repeats, verifies) for d in dims]
        finally:
            svc.close()
    info = machine_info()
    result = {
        "command": command_line("benchmarks.perf.certificate_service"),
        "machine": info,
        "wall_s": time.perf_counter() - started,
        "dims": dims_out,
    }
    text = report(result)
    write_results(result_stem("certificate_service", args.quick), [text], result)
    print(text)


if __name__ == "__main__":
    main()
