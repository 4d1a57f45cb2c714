"""The long chaos run: unavailability per fault kind, and the acknowledgement latency during
faults, with the checker's verdict.

Runs :func:`tests.chaos.engine.run` (service processes on a local Redis Cluster with replicas,
SDK clients retrying with idempotency keys, a seeded nemesis; the module docstring there says
what each fault does and how unavailability is counted), checks it, and writes
``benchmarks/results/chaos.{json,md}``: per fault kind the unavailability p50/p99/max over every
(fault, model) pair and over the models the faulted process held, the acknowledgement latency
(first attempt to acknowledgement, retries included) in the faults' windows against the one
outside them, the time until every model is served again after a kill -9 against the lease TTL
plus one placement round, and for rolling restarts the interruptions per model and process step.
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

from tests.chaos.engine import Config, check, measure, run

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "chaos"


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
        f"one metric reader; lease TTL {cfg['lease_ttl_s']} s, placement round "
        f"{cfg['poll_interval_s']} s; {cfg['faults']} faults, seed {cfg['seed']}; "
        f"{m['duration_s']} s",
        f"- {m['acknowledged_samples']} samples acknowledged in {m['acknowledged_batches']} "
        f"requests; answers other than 2xx seen by the clients: {m['statuses']}",
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
        "Unavailable: per fault and model, the longest stretch without an acknowledgement from "
        "the fault's start until every model is acknowledged again. Held: the models the "
        "faulted process held when the fault began. Latency: first attempt to acknowledgement, "
        "retries included, of the requests acknowledged in the faults' windows. Interruptions: "
        "stretches over 0.3 s without an acknowledgement, per fault and model (a model that "
        "moves away and back counts two).",
        "",
        "| fault | n | unavailable (all models) | unavailable (held) | ack latency | "
        "interruptions per model (p50 / max) | 500s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, k in m["kinds"].items():
        held = q(k["unavailable_held_s"]) if "unavailable_held_s" in k else "-"
        cuts = k["interruptions_per_model"]
        md.append(f"| {kind} | {k['faults']} | {q(k['unavailable_s'])} | {held} | "
                  f"{q(k['ack_latency_s'])} | {cuts['p50']:g} / {cuts['max']:g} | "
                  f"{k['server_errors']} |")  # fmt: skip
    md.append(f"| (no fault) | | | | {q(m['ack_latency_without_fault_s'])} | | |")
    kill = m["kinds"].get("service_kill")
    if kill:
        served = [d["served_again_s"] for d in kill["details"]]
        md += [
            "",
            "## Recovery after a service kill -9",
            "",
            f"Time until every model was acknowledged again (the other processes took the dead "
            f"one's models over; it was restarted after): max {max(served):.2f} s, target the "
            f"lease TTL plus one round, {bound:g} s: ratio {max(served) / bound:.2f}. The held "
            f"models' unavailability p99 {kill['unavailable_held_s']['p99']} s.",
        ]
    pause = m["kinds"].get("service_pause")
    if pause and pause["unavailable_held_s"]["n"]:
        md += [
            "",
            f"SIGSTOP past the lease (paused {pause['details'][0]['paused_s']} s): the held "
            f"models' unavailability p99 {pause['unavailable_held_s']['p99']} s, against the "
            f"same {bound:g} s: ratio {pause['unavailable_held_s']['p99'] / bound:.2f}.",
        ]
    rolling = m["kinds"].get("rolling_restart")
    if rolling:
        inter = rolling["interruptions_s"]
        md += [
            "",
            "## Rolling restarts",
            "",
            f"Interruptions (stretches over 0.3 s without an acknowledgement) per model and "
            f"rolling restart: {rolling['interruptions_per_model_and_restart']}; their length "
            f"p50 / p99 / max {q(inter)} s (target at most 1 s a move: ratio of the max "
            f"{(inter['max'] or 0) / 1.0:.2f}); lease holder changes per model seen at the "
            f"process steps {q(rolling['owner_changes_per_model'])} (target at most 2).",
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
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
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
