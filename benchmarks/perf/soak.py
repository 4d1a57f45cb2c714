"""Soak: stream at a fixed rate for N minutes; watch memory, the log and the lag.

Starts ``python -m service`` (:class:`devkit.launcher.ServiceProcess`) on the embedded default
(its own redis-server, AOF, ``appendfsync always``) in a temporary data dir, creates one model
and POSTs batches at a fixed rate, each with its own ``Idempotency-Key`` (as a retrying client
would; the service keeps those records for ``OPML_IDEMPOTENCY_TTL_S``, here 60 s, so their
memory reaches its plateau after a minute).
Every ``--every`` seconds it records the service's RSS (``/proc/<pid>/status``), Redis
``used_memory``, the log length (``XLEN``: trimmed behind each checkpoint), the idempotency
records and the ingestion lag (``logged_seq - version``).

The bar: after warm-up (``--warmup`` minutes) memory grows by at most 5 %: the mean of the last
``--window`` minutes against the mean of the first ``--window`` minutes after warm-up, for RSS and
Redis memory (means over whole checkpoint cycles: the log is a sawtooth, trimmed at each
checkpoint). The log and the idempotency records must stay under their design bounds:
``OPML_CHECKPOINT_EVERY + OPML_BATCH_MAX`` entries, and requests/s x retention records (+5 %).

    .venv/bin/python -m benchmarks.perf.soak --minutes 10

Writes ``benchmarks/results/soak.{md,json,png}`` (:func:`measure` returns the series,
:func:`judge` the verdict, :func:`markdown` and :func:`plot` render; ``--report-only``
re-renders a saved ``soak.json``). Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem, suffixed, write_results
from devkit.launcher import ServiceProcess

BAR = 0.05
IDEMPOTENCY_TTL_S = 60
#: The service's defaults: a checkpoint after 10000 samples, batches of 512 entries.
LOG_BOUND = 10_000 + 512


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def sender(
    url: str, args: argparse.Namespace, stop: threading.Event, stats: dict[str, int]
) -> None:
    """POST ``--batch`` samples every ``batch / rate`` seconds on a fixed schedule."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(args.classes, args.dim)) * 2
    period = args.batch / args.rate
    next_at = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as client:
        k = 0
        while not stop.is_set():
            labels = rng.integers(args.classes, size=args.batch)
            X = centers[labels] + rng.normal(size=(args.batch, args.dim))
            rows = zip(X, labels, strict=True)
            body = {"samples": [{"x": x.tolist(), "y": int(c)} for x, c in rows]}
            response = client.post(
                "/v1/models/soak/samples", json=body, headers={"Idempotency-Key": f"soak-{k}"}
            )
            stats["accepted" if response.status_code == 202 else "failed"] += 1
            k += 1
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                stats["late"] += 1


def growth(t: np.ndarray, v: np.ndarray, start: float, window: float, how: str) -> float:
    """Relative change of ``how`` (mean or max) of the last window vs the first after start."""
    first = v[(t >= start) & (t < start + window)]
    last = v[t >= t[-1] - window]
    agg = np.mean if how == "mean" else np.max
    base = float(agg(first))
    return float(agg(last)) / base - 1 if base else 0.0


def measure(args: argparse.Namespace) -> tuple[list[dict[str, float]], dict[str, int]]:
    """Run the soak: the series (one row every ``--every`` seconds) and the request counts."""
    with (
        tempfile.TemporaryDirectory(prefix="opml-soak-") as tmp,
        ServiceProcess(Path(tmp), None, OPML_IDEMPOTENCY_TTL_S=str(IDEMPOTENCY_TTL_S)) as service,
    ):
        embedded = service.embedded_redis()
        assert embedded is not None  # the soak runs on the embedded default
        rdb = redis.Redis(port=embedded[1])
        httpx.post(f"{service.url}/v1/models", json={"name": "soak", "dim": args.dim,
                                                      "gamma": 0.01})  # fmt: skip
        stop = threading.Event()
        stats = {"accepted": 0, "failed": 0, "late": 0}
        thread = threading.Thread(target=sender, args=(service.url, args, stop, stats), daemon=True)
        rows: list[dict[str, float]] = []
        began = time.monotonic()
        thread.start()
        try:
            with service.client() as client:
                while (elapsed := time.monotonic() - began) < args.minutes * 60:
                    model = client.get("/v1/models/soak").json()
                    rows.append(
                        {
                            "t_s": round(elapsed, 2),
                            "rss_mb": rss_bytes(service.pid) / 2**20,
                            "redis_used_mb": int(rdb.info("memory")["used_memory"]) / 2**20,
                            "log_entries": int(rdb.xlen("opml:{soak}:log")),
                            "idempotency_records": int(rdb.hlen("opml:{soak}:idem")),
                            "logged_seq": model["logged_seq"],
                            "lag": model["logged_seq"] - model["version"],
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
                    time.sleep(args.every)
        finally:
            stop.set()
            thread.join(30)
            rdb.close()
        service.stop(timeout=60)
    return rows, stats


def judge(
    rows: list[dict[str, float]], args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, tuple[float, float]], bool]:
    """Growth after warm-up of RSS and Redis memory, peaks against their design bounds, and
    whether everything is within the bar."""
    t = np.array([r["t_s"] for r in rows])
    start, window = args.warmup * 60, args.window * 60
    judged = {
        key: growth(t, np.array([r[key] for r in rows]), start, window, "mean")
        for key in ("rss_mb", "redis_used_mb")
    }
    after = [r for r in rows if r["t_s"] >= start]
    bounds = {
        "log_entries": (max(r["log_entries"] for r in after), LOG_BOUND),
        "idempotency_records": (
            max(r["idempotency_records"] for r in after),
            args.rate / args.batch * IDEMPOTENCY_TTL_S * (1 + BAR),
        ),
    }
    passed = all(g <= BAR for g in judged.values()) and all(
        peak <= bound for peak, bound in bounds.values()
    )
    return judged, bounds, passed


#: ``--quick``: half a minute, measured every 2 s, judged after 6 s.
QUICK = {"minutes": 0.5, "every": 2.0, "warmup": 0.1, "window": 0.1}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=400, help="samples per second")
    parser.add_argument("--batch", type=int, default=20, help="samples per request")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--every", type=float, default=5, help="seconds between measurements")
    parser.add_argument("--warmup", type=float, default=3, help="minutes not judged")
    parser.add_argument("--window", type=float, default=3, help="minutes averaged at each end")
    parser.add_argument(
        "--report-only", action="store_true",
        help="re-render soak.md and soak.png from the saved soak.json (no measurement)",
    )  # fmt: skip
    args = parse(parser, argv, QUICK)
    stem = result_stem("soak", args.quick)
    if args.report_only:
        result = json.loads(suffixed(stem, ".json").read_text())
    else:
        rows, stats = measure(args)
        judged, bounds, passed = judge(rows, args)
        result = {
            "command": command_line("benchmarks.perf.soak"),
            "machine": machine_info(),
            "settings": vars(args),
            "requests": stats,
            "samples_sent": stats["accepted"] * args.batch,
            "growth_after_warmup": judged,
            "peak_and_bound_after_warmup": bounds,
            "bar": BAR,
            "passed": passed,
            "series": rows,
        }
    if args.report_only:  # a re-render: the JSON (and its run record) stays as measured
        suffixed(stem, ".md").write_text(markdown(result))
    else:
        write_results(stem, [markdown(result)], result)
    plot(result["series"], result["settings"]["warmup"] * 60, suffixed(stem, ".png"))
    print(
        f"growth after warm-up: {result['growth_after_warmup']}; peaks/bounds: "
        f"{result['peak_and_bound_after_warmup']}; passed={result['passed']}"
    )


def markdown(result: dict[str, Any]) -> str:
    """``soak.md`` of a run (``result`` as measured, or as saved in ``soak.json``)."""
    rows = result["series"]
    judged = result["growth_after_warmup"]
    bounds = result["peak_and_bound_after_warmup"]
    passed = result["passed"]
    s = result["settings"]
    first, last = rows[0], rows[-1]
    lines = [
        "# Soak: fixed-rate ingestion against the embedded default",
        "",
        f"`{result['command']}`",
        "",
        machine_block(result["machine"]),
        "",
        f"{s['minutes']:g} min at {s['rate']:g} samples/s ({s['batch']} per POST, each with an "
        f"Idempotency-Key, retention 60 s), d = {s['dim']}, {s['classes']} classes; "
        f"{result['samples_sent']} samples acknowledged, {result['requests']['failed']} failed "
        f"requests, {result['requests']['late']} sends behind schedule.",
        "",
        "| series | first | last | min | max |",
        "|---|---|---|---|---|",
    ]
    for key in ("rss_mb", "redis_used_mb", "log_entries", "idempotency_records", "lag"):
        values = [r[key] for r in rows]
        lines.append(
            f"| {key} | {first[key]:.4g} | {last[key]:.4g} | {min(values):.4g} | "
            f"{max(values):.4g} |"
        )
    lines += [
        "",
        f"Growth after the {s['warmup']:g}-minute warm-up (last {s['window']:g} min vs the first "
        f"{s['window']:g} min after warm-up; bar {BAR:.0%}):",
        "",
        "| series | growth |",
        "|---|---|",
        *(f"| {k} | {v:+.2%} |" for k, v in judged.items()),
        "",
        "Bounded by design (peak after warm-up vs the bound):",
        "",
        "| series | peak | bound |",
        "|---|---|---|",
        *(f"| {k} | {peak:.0f} | {bound:.0f} |" for k, (peak, bound) in bounds.items()),
        "",
        f"**{'PASS' if passed else 'FAIL'}**: "
        + (
            "no growth beyond 5 % after warm-up; log and idempotency records within bounds."
            if passed
            else "growth beyond 5 % or a bound exceeded."
        ),
        "",
        "![soak](soak.png)",
        "",
    ]
    return "\n".join(lines)


def plot(rows: list[dict[str, float]], warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["t_s"] / 60 for r in rows]
    panels = [
        ("rss_mb", "service RSS (MiB)"),
        ("redis_used_mb", "Redis used_memory (MiB)"),
        ("log_entries", "log entries (XLEN)"),
        ("lag", "lag (logged - applied)"),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 9), sharex=True)
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.plot(minutes, [r[key] for r in rows], lw=1.2)
        ax.axvspan(0, warmup_s / 60, color="0.9", label="warm-up")
        ax.set_ylabel(title, fontsize=8)
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("opml-service soak (embedded Redis)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
