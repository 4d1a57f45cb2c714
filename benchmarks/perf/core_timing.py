"""Time per sample of the core update: ours (Eq. 16, O(d^2)) vs a naive O(d^3) inverse (Eq. 12).

    python3 dev.py bench core_timing [--quick]

Side by side in one run, at d in {21, 64, 310, 1024} (plus 128 and 512 for the slope):

* ``learn_many``: our learner on a stream where every step is an active triplet update
  (margin 1e9, so the hinge never goes passive: the worst case, as in the paper's Table I);
* ``learn_one``: the same stream one call per sample (per-call validation included);
* ``naive``: the textbook transcription ``L <- L @ inv(I + gamma (a a^T - b b^T))`` with d x d
  matrices, the O(d^3) baseline, on the same triplets;
* the memory-bandwidth floor of our step: it reads ``L`` twice and writes it once
  (3 * 8 d^2 bytes) divided by the measured copy bandwidth of this machine (a 64 MiB copy, so
  main memory; an ``L`` small enough to stay in cache, d <= ~400, can beat that floor).

The paper's Table I (MATLAB, 2016 hardware) is printed beside: 0.026 ms (d=21), 0.023 ms
(d=64), 1.7 ms (d=310). Results: ``benchmarks/results/core_timing.{md,json}``
(:func:`measure` returns the figures, :func:`report` renders them).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem, write_results
from service.core import Learner, LearnerConfig

PAPER_MS = {21: 0.026, 64: 0.023, 310: 1.7}
DIMS = (21, 64, 128, 310, 512, 1024)


def stream(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # unit norm: no step is ever shrunk
    return X, rng.integers(0, 10, size=n)


def config(d: int) -> LearnerConfig:
    # The paper's units: a margin of 1e9 on unit-norm inputs makes every step an update.
    return LearnerConfig(dim=d, algorithm="opml", gamma=1e-3, margin=1e9, seed=0, step="paper")


def time_learn_many(X: np.ndarray, y: np.ndarray) -> tuple[float, Learner]:
    Learner(config(X.shape[1])).learn_many(X[:20], y[:20])  # warm-up: BLAS thread control
    learner = Learner(config(X.shape[1]))
    start = time.perf_counter()
    learner.learn_many(X, y)
    return (time.perf_counter() - start) / len(y), learner


def time_learn_one(X: np.ndarray, y: np.ndarray) -> float:
    learner = Learner(config(X.shape[1]))
    start = time.perf_counter()
    for x, label in zip(X, y, strict=True):
        learner.learn_one(x, int(label))
    return (time.perf_counter() - start) / len(y)


def time_naive(X: np.ndarray, y: np.ndarray, gamma: float = 1e-3) -> tuple[float, np.ndarray]:
    """The O(d^3) transcription of Eq. 12, with the paper's triplets (same RNG draws)."""
    d = X.shape[1]
    L = np.eye(d)
    rng = np.random.default_rng(0)
    buffer: dict[int, np.ndarray] = {}
    order: list[int] = []
    eye = np.eye(d)
    start = time.perf_counter()
    for x, label in zip(X, y, strict=True):
        k = int(label)
        u = rng.random()  # the learner draws one uniform per sample (Sec. III-A)
        if k not in buffer:
            buffer[k] = x
            order.append(k)
            continue
        if len(order) == 1:  # OPML without pre-stage: buffered only (single_class)
            buffer[k] = x
            continue
        slot = order.index(k)
        j = int(u * (len(order) - 1))
        j += j >= slot
        a, b = x - buffer[k], x - buffer[order[j]]
        A = np.outer(a, a) - np.outer(b, b)
        L = L @ np.linalg.inv(eye + gamma * A)  # hinge always active (margin 1e9)
        buffer[k] = x
    return (time.perf_counter() - start) / len(y), L


def copy_bandwidth() -> float:
    """Bytes per second of a large array copy (read + write counted)."""
    src = np.ones(64 * 1024 * 1024 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def measure(quick: bool) -> dict[str, Any]:
    """Every figure of a run (what ``core_timing.json`` keeps and the report renders)."""
    load_start = [round(v, 2) for v in os.getloadavg()]
    bandwidth = copy_bandwidth()
    rows = []
    for d in DIMS:
        n = {21: 20000, 64: 20000, 128: 10000, 310: 4000, 512: 1500, 1024: 500}[d]
        n_naive = {21: 5000, 64: 2000, 128: 500, 310: 100, 512: 30, 1024: 12}[d]
        if quick:
            n, n_naive = max(n // 10, 50), max(n_naive // 4, 6)
        X, y = stream(n, d)
        many, learner = time_learn_many(X, y)
        one = time_learn_one(X[: min(n, 3000)], y[: min(n, 3000)])
        naive, L_naive = time_naive(X[:n_naive], y[:n_naive])
        check = Learner(config(d))
        check.learn_many(X[:n_naive], y[:n_naive])
        agree = float(np.abs(check.L - L_naive).max())
        floor = 3 * 8 * d * d / bandwidth
        rows.append(
            {
                "d": d,
                "learn_many_ms": many * 1e3,
                "learn_one_ms": one * 1e3,
                "naive_ms": naive * 1e3,
                "speedup_vs_naive": naive / many,
                "floor_ms": floor * 1e3,
                "ratio_to_floor": many / floor,
                "paper_ms": PAPER_MS.get(d),
                "below_paper": (many * 1e3 < PAPER_MS[d]) if d in PAPER_MS else None,
                "max_abs_diff_vs_naive": agree,
                "updates": learner.counts["triplet_update"],
            }
        )
        print(rows[-1], flush=True)
    # 128 <= d <= 512: L (<= 2 MiB) stays in cache, the step is arithmetic-bound: slope ~2.
    ds = np.array([r["d"] for r in rows if 128 <= r["d"] <= 512], dtype=float)
    ts = np.array([r["learn_many_ms"] for r in rows if 128 <= r["d"] <= 512])
    ds_n = np.array([r["d"] for r in rows if r["d"] >= 128], dtype=float)
    tn = np.array([r["naive_ms"] for r in rows if r["d"] >= 128])
    return {
        "command": command_line("benchmarks.perf.core_timing"),
        "quick": quick,
        "machine": machine_info(),
        "load_start": load_start,
        "load_end": [round(v, 2) for v in os.getloadavg()],
        "copy_bandwidth_bytes_per_s": bandwidth,
        "rows": rows,
        "slope_ours": float(np.polyfit(np.log(ds), np.log(ts), 1)[0]),
        "slope_naive": float(np.polyfit(np.log(ds_n), np.log(tn), 1)[0]),
    }


def report(data: dict[str, Any]) -> str:
    """``core_timing.md`` of a run (``data`` as measured, or as saved in the JSON)."""
    lines = [
        "# Core update: time per sample, ours vs naive inverse vs the paper",
        "",
        f"Command: `{data['command']}`" + (" (quick)" if data["quick"] else ""),
        "",
        machine_block(data["machine"]),
        "",
        f"Copy bandwidth: {data['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (read + write). "
        "Every step is an active triplet update (worst case). Load average (1, 5, 15 min) at "
        f"start {data['load_start']}, at end {data['load_end']} "
        "(a shared 2-core machine: more than ~1 means other work competed for the cores).",
        "",
        "| d | learn_many (ms) | learn_one (ms) | naive O(d^3) (ms) | naive / ours | "
        "bandwidth floor (ms) | ours / floor | paper Table I (ms) | max abs diff vs naive |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        paper = f"{r['paper_ms']}" if r["paper_ms"] is not None else ""
        lines.append(
            f"| {r['d']} | {r['learn_many_ms']:.4f} | {r['learn_one_ms']:.4f} | "
            f"{r['naive_ms']:.3f} | {r['speedup_vs_naive']:.0f}x | {r['floor_ms']:.4f} | "
            f"{r['ratio_to_floor']:.2f} | {paper} | {r['max_abs_diff_vs_naive']:.1e} |"
        )
    lines += [
        "",
        f"Log-log slope of our time vs d for 128 <= d <= 512: {data['slope_ours']:.2f} (O(d^2) "
        "predicts 2; there L, at most 2 MiB, stays in cache). At d = 1024 L (8 MiB) no longer "
        "fits and the step runs at the memory-bandwidth floor (column 'ours / floor'); below "
        "d ~ 100 a fixed per-sample cost dominates. Naive, d >= 128: "
        f"{data['slope_naive']:.2f} (O(d^3) predicts 3; LAPACK's inverse is far from its "
        "asymptote at these sizes).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = parse(parser, argv)
    data = measure(args.quick)
    text = report(data)
    print(text)
    write_results(result_stem("core_timing", args.quick), [text], data)


if __name__ == "__main__":
    main()
