"""What an open console costs the service: its CPU with the console's pages open against closed,
side by side in one run, under paced ingestion into one of many models.

    python3 dev.py bench console_load [--rate 20000] [--models 100] [--quick]

One service (embedded Redis) holds ``--models`` models (``--dim``); one of them, ``hot``,
receives binary WebSocket frames of 64 samples paced at ``--rate`` samples/s by
``benchmarks.harness.loadgen`` (its own process) for ``--seconds`` per phase. Phases alternate
``closed`` (no browser page) and ``open`` (headless Chromium, driven by Selenium, showing the
models table in one tab and the hot model's page in another, as a person would watch it), for
``--rounds`` rounds. Per phase: the service process's CPU seconds per wall second (from
``/proc``; the embedded redis-server and the browser are other processes), the ingestion the
generator achieved, and for ``open`` the ``/events`` frames the page received per second and
how far its counters trailed the service's version when the phase ended (responsiveness).

Target (ratios): median service CPU open / closed <= 1.10, per wall second and per sample
ingested (the browser shares the machine and may slow the generator), i.e. the throttled live
updates cost at most a tenth more service CPU.
Results: ``benchmarks/results/console_load.{md,json}`` (``--quick``: under ``results/quick/``).
Needs Debian's ``chromium`` and ``chromium-driver`` and selenium (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import cpu_seconds, machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem, write_results
from benchmarks.harness.targets import start_service
from devkit.launcher import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
#: chromedriver's pid (the browser's processes are its descendants).
BROWSER_PID = [0]
TARGET_RATIO = 1.10


def browser(profile: Path) -> Any:
    """Headless Debian Chromium through Debian's chromedriver (nothing downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(shutil.which("chromium"))
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 "--window-size=1280,2000"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(
        options=options, service=Service(executable_path=str(shutil.which("chromedriver")))
    )


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root``'s descendants (the browser: chromedriver's children), now."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - tree
        tree |= frontier
    total = 0.0
    for pid in tree:
        try:
            total += cpu_seconds(Path(f"/proc/{pid}/stat"))
        except (OSError, IndexError):
            continue
    return total


def page_state(driver: Any) -> tuple[int, int]:
    """(frames the model page received, the version its counters show)."""
    frames, version = driver.execute_script(
        "const p = document.getElementById('progress');"
        "const c = document.getElementById('counters');"
        "return [p ? Number(p.dataset.frames || 0) : 0, c ? Number(c.dataset.version || 0) : 0];"
    )
    return int(frames), int(version)


def run_phase(
    svc: ServiceProcess, args: argparse.Namespace, first_id: int, driver: Any | None
) -> dict[str, Any]:
    stat = Path(f"/proc/{svc.pid}/stat")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", "benchmarks.harness.loadgen", "ws", "--url", svc.url,
           "--model", "hot", "--dim", str(args.dim), "--frame", "64", "--encoding", "binary",
           "--rate", str(args.rate), "--seconds", str(args.seconds),
           "--first-id", str(first_id), "--out", str(out)]  # fmt: skip
    before = page_state(driver) if driver is not None else None
    browser_pid = BROWSER_PID[0]
    browser0 = tree_cpu(browser_pid)
    cpu0, t0 = cpu_seconds(stat), time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True)
    cpu1, t1 = cpu_seconds(stat), time.monotonic()
    browser1 = tree_cpu(browser_pid)
    result = json.loads(out.read_text())
    out.unlink()
    phase: dict[str, Any] = {
        "service_cpu_per_s": (cpu1 - cpu0) / (t1 - t0),
        "wall_s": t1 - t0,
        "throughput": result["throughput"],
        "samples_acked": result["samples_acked"],
        "service_cpu_ms_per_1000": 1e6 * (cpu1 - cpu0) / max(1, result["samples_acked"]),
        "frame_errors": result["frame_errors"],
        "generator_cpu_per_s": result["generator_cpu_s"] / (t1 - t0),
        "browser_cpu_per_s": (browser1 - browser0) / (t1 - t0),
    }
    if driver is not None and before is not None:
        with httpx.Client(base_url=svc.url) as client:
            version = client.get("/v1/models/hot").json()["version"]
        frames, shown = page_state(driver)
        phase["page_frames_per_s"] = (frames - before[0]) / (t1 - t0)
        phase["page_trails_by_samples"] = version - shown
    return phase


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    phases: dict[str, list[dict[str, Any]]] = {"closed": [], "open": []}
    # the harness's launch: its readiness wait covers a first start's kernel compilation
    max_dim = str(max(64, args.dim))
    with start_service("service", workdir / "svc", OPML_MAX_DIM=max_dim) as (_, svc):
        rng = np.random.default_rng(0)
        with httpx.Client(base_url=svc.url, timeout=60) as client:
            for k in range(args.models - 1):
                assert client.post("/v1/models", json={"name": f"m{k:03d}", "dim": args.dim})
            assert client.post("/v1/models", json={"name": "hot", "dim": args.dim})
            X = rng.normal(size=(300, args.dim)) + np.repeat(np.eye(3, args.dim) * 4, 100, 0)
            samples = [{"x": x, "y": f"c{i // 100}"} for i, x in enumerate(X.tolist())]
            client.post("/v1/models/hot/samples?wait=true", json={"samples": samples})
        driver = browser(workdir / "profile")
        BROWSER_PID[0] = driver.service.process.pid
        try:
            first_id = 1
            for _ in range(args.rounds):
                for name in ("closed", "open"):
                    page = None
                    if name == "open":
                        driver.get(svc.url + "/ui/")
                        driver.switch_to.new_window("tab")
                        driver.get(svc.url + "/ui/#/models/hot")
                        deadline = time.monotonic() + 60
                        while page_state(driver)[1] == 0 and time.monotonic() < deadline:
                            time.sleep(0.1)
                        page = driver
                    phases[name].append(run_phase(svc, args, first_id, page))
                    first_id += 1
                    if name == "open":  # close both tabs' pages: no socket, no timers
                        driver.get("about:blank")
                        driver.close()
                        driver.switch_to.window(driver.window_handles[0])
                        driver.get("about:blank")
        finally:
            driver.quit()
    return phases


def report(result: dict[str, Any]) -> str:
    """``console_load.md`` of a run (``result`` as measured, or as saved in the JSON)."""
    phases, a = result["phases"], argparse.Namespace(**result["args"])

    def median(name: str, key: str) -> float:
        return float(statistics.median(p[key] for p in phases[name]))

    ratio = median("open", "service_cpu_per_s") / median("closed", "service_cpu_per_s")
    per_sample = median("open", "service_cpu_ms_per_1000") / median(
        "closed", "service_cpu_ms_per_1000"
    )
    verdict = "met" if max(ratio, per_sample) <= TARGET_RATIO else "NOT met"
    lines = [
        "# The console's cost to the service",
        "",
        f"`{result['command']}` (rate {a.rate:g} samples/s, models {a.models}, dim {a.dim}, "
        f"{a.seconds:g} s per phase, {a.rounds} rounds): paced binary WebSocket ingestion into "
        "one model; phases alternate without and with the console open (models table and the "
        "model's page, headless Chromium).",
        "",
        machine_block(result["machine"]),
        "",
        "| round | phase | service CPU (cores) | CPU ms / 1000 samples | ingested (samples/s) "
        "| browser CPU (cores) | generator CPU (cores) | page frames/s | page trails by "
        "(samples) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in range(a.rounds):
        for name in ("closed", "open"):
            p = phases[name][r]
            frames = f"{p['page_frames_per_s']:.2f}" if "page_frames_per_s" in p else "-"
            trails = str(p.get("page_trails_by_samples", "-"))
            lines.append(
                f"| {r + 1} | {name} | {p['service_cpu_per_s']:.3f} | "
                f"{p['service_cpu_ms_per_1000']:.2f} | {p['throughput']:,.0f} | "
                f"{p['browser_cpu_per_s']:.3f} | {p['generator_cpu_per_s']:.3f} | "
                f"{frames} | {trails} |"
            )
    lines += [
        "",
        f"Median service CPU open / closed: **{ratio:.3f}** per second, **{per_sample:.3f}** "
        f"per sample ingested (target: both <= {TARGET_RATIO:.2f}; {verdict}). The service's "
        "CPU is its own process's (the embedded redis-server and the browser are others), over "
        "each generator run including its start; 'page trails by' is the service's version "
        "minus the version the page's counters showed when the phase ended.",
        "",
    ]
    return "\n".join(lines)


#: ``--quick``: 10 models, 8 s phases, one round.
QUICK = {"models": 10, "seconds": 8.0, "rounds": 1}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20_000.0, help="samples/s into one model")
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2)
    args = parse(parser, argv, QUICK)
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install ...)")
    with tempfile.TemporaryDirectory(prefix="console-load-") as tmp:
        phases = measure(args, Path(tmp))
    result = {
        "command": command_line("benchmarks.perf.console_load"),
        "machine": machine_info(),
        "args": vars(args),
        "phases": phases,
    }
    text = report(result)
    write_results(result_stem("console_load", args.quick), [text], result)
    print(text)


if __name__ == "__main__":
    main()
