"""The long chaos run: unavailability per fault kind, and the acknowledgement latency during
faults, with the checker's verdict.

Runs :func:`tests.chaos.engine.run` (service processes on a local Redis Cluster with replicas,
SDK clients retrying with idempotency keys, a seeded nemesis; the module docstring there says
what each fault does and how unavailability is counted), checks it, and writes
``benchmarks/results/chaos.{json,md}``: per fault kind the unavailability p50/p99/max over every
(fault, model) pair and over the models the faulted process held, the acknowledgement latency
(first attempt to acknowledgement, retries included) in the faults' windows against the one
outside them, the time until every model is served again after a kill -9 against the lease TTL
plus one placement round, and for rolling restarts the moves and interruptions per model.
The targets come from the design (at most the lease TTL plus one round after a kill -9; at most
two moves and 1 s per move in a rolling restart): the report states each figure beside its
target, as a ratio.

    python -m benchmarks.perf.chaos --seed 1 --faults 25 --services 3 --models 6
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import parse
from benchmarks.harness.results import result_stem
from tests.chaos.engine import Config, check, measure, run

ROOT = Path(__file__).resolve().parents[2]


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def q(stats: dict[str, Any]) -> str:
    if not stats.get("n"):
        return "-"
    return f"{stats['p50']:.2f} / {stats['p99']:.2f} / {stats['max']:.2f}"


def report(data: dict[str, Any]) -> list[str]:
    m = data["measured"]
    cfg = data["config"]
    bound = m["lease_ttl_plus_round_s"]
    md = [
        "# Chaos run: unavailability per fault kind",
        "",
        f"Command: `{data['command']}`",
        "",
        f"- Machine: {data['machine']['cpu']} ({data['machine']['cores']} cores), "
        f"{data['machine']['platform']}, Python {data['machine']['python']}; 1-minute load "
        f"average at the end {data['machine']['load_average_1m']} (shared machine)",
        f"- Commit {data['commit']}, {data['date']}",
        f"- {cfg['services']} service processes, Redis Cluster of {cfg['masters']} masters with "
        f"one replica each (WAIT 1, node timeout {cfg['node_timeout_ms']} ms), {cfg['models']} "
        f"models (d = {cfg['dim']}), one writer per model ({cfg['batch']} samples a request) and "
        f"a metric reader per model; lease TTL {cfg['lease_ttl_s']} s, placement round "
        f"{cfg['lease_ttl_s'] / 3:g} s; {cfg['faults']} faults, seed {cfg['seed']}; "
        f"{m['duration_s']} s",
        f"- {m['acknowledged_samples']} samples acknowledged in {m['acknowledged_batches']} "
        f"requests, {m['served_reads']} metric reads served; answers other than 2xx seen by "
        f"the clients (each retried): {m['statuses']}",
        "",
        "## Checker",
        "",
    ]
    if data["problems"]:
        md += [f"**{len(data['problems'])} violations:**", ""]
        md += [f"- {p}" for p in data["problems"][:20]]
    else:
        md.append(
            "Every acknowledged sample in its model's log once, at its acknowledged seqs; every "
            "served L equal to the core learner's replay of the log; no 500; no process left."
        )
    md += [
        "",
        "## Unavailability and acknowledgement latency (seconds, p50 / p99 / max)",
        "",
        "Per fault and model, the longest stretch without an acknowledged write (ingest) or "
        "without a served metric read (query; each model is read every 0.1 s, a failed read "
        "tries the next process at once), from the fault's start until every model is written "
        "and read again. Held: the models the faulted process held when the fault began. Ack "
        "latency: first attempt to acknowledgement, retries included, of the writes "
        "acknowledged in the faults' windows. Interruptions: stretches over 0.5 s without a "
        "served read, per fault and model. Moves: lease hand-overs per fault and model.",
        "",
        "| fault | n | ingest unavailable | query unavailable | query unavailable (held) | "
        "ack latency | interruptions (p50 / max) | moves (p50 / max) | 500s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, k in m["kinds"].items():
        cuts, moves = k["query_interruptions"], k["moves"]
        md.append(f"| {kind} | {k['faults']} | {q(k['ingest_unavailable'])} | "
                  f"{q(k['query_unavailable'])} | {q(k['query_unavailable_held'])} | "
                  f"{q(k['ack_latency_s'])} | {cuts['p50']:g} / {cuts['max']:g} | "
                  f"{moves['p50']:g} / {moves['max']:g} | {k['server_errors']} |")  # fmt: skip
    md.append(f"| (no fault) | | | | | {q(m['ack_latency_without_fault_s'])} | | | |")
    for kind, title in (("service_kill", "kill -9"), ("service_pause", "SIGSTOP past the lease")):
        k = m["kinds"].get(kind)
        if not k or not k["query_unavailable_held"]["n"]:
            continue
        held = k["query_unavailable_held"]
        md += [
            "",
            f"## Recovery after a {title}",
            "",
            f"Queries of the models the process held were unavailable p50 / p99 / max "
            f"{q(held)} s; the target is the lease TTL plus one placement round, {bound:g} s: "
            f"ratio of the max {held['max'] / bound:.2f}. Interruptions per held model and "
            f"fault up to {k['query_interruptions']['max']:g} (the process comes back and "
            f"takes its models again: a second interruption unless that hand-over is seamless).",
        ]
    rolling = m["kinds"].get("rolling_restart")
    if rolling:
        inter = rolling["query_interruption_s"]
        md += [
            "",
            "## Rolling restarts",
            "",
            f"Per model and rolling restart (SIGTERM one process at a time, each back before "
            f"the next): moves p50 / max {rolling['moves']['p50']:g} / "
            f"{rolling['moves']['max']:g} (target at most 2); query interruptions p50 / max "
            f"{rolling['query_interruptions']['p50']:g} / "
            f"{rolling['query_interruptions']['max']:g}, each p50 / p99 / max {q(inter)} s "
            f"(target at most 1 s a move: ratio of the max {(inter['max'] or 0) / 1.0:.2f}).",
        ]
    md.append("")
    return md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=25)
    parser.add_argument("--services", type=int, default=3)
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument(
        "--out", type=Path, default=None, help="results stem (default: results/chaos)"
    )
    parser.add_argument("--report-only", action="store_true",
                        help="write the .md again from the .json of the last run")  # fmt: skip
    args = parse(parser, argv, {"faults": 3, "services": 2, "models": 2})
    args.out = args.out or result_stem("chaos", args.quick)
    if args.report_only:
        data = json.loads(args.out.with_name(args.out.name + ".json").read_text())
        args.out.with_name(args.out.name + ".md").write_text("\n".join(report(data)))
        return 0
    config = Config(seed=args.seed, faults=args.faults, services=args.services,
                    masters=args.masters, models=args.models)  # fmt: skip
    outcome = run(config)
    problems = check(outcome)
    data = {
        "command": shlex.join(["python", "-m", "benchmarks.perf.chaos", *sys.argv[1:]]),
        "machine": machine(),
        "commit": commit(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "config": config.__dict__,
        "measured": measure(outcome),
        "problems": problems,
        "service_log_errors": outcome.log_excerpts,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(data, indent=1))
    args.out.with_name(args.out.name + ".md").write_text("\n".join(report(data)))
    print("\n".join(report(data)))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
