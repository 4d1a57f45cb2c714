"""A newcomer's first start, before / after: ``python3 dev.py serve`` on a fresh copy.

    .venv/bin/python -m benchmarks.perf.first_start --baseline b089f79 [--skip-bench-switch]

For this checkout (its working tree) and for the ``--baseline`` revision of this repository
(``git archive``), each copied to a temporary dir of its own (no ``.venv``, no numba cache),
measures from the launch of ``python3 dev.py serve`` (``OPML_PORT`` / ``OPML_DATA_DIR`` in the
environment, which both versions read):

* **first start**: the install (until ``dev.py`` writes its stamp), ``/livez`` answering, and
  ``/readyz`` answering 200 (the numba kernels compiled, the models loaded);
* **second start**: the same command again (installed, kernels in numba's cache);
* **serve after bench** (unless ``--skip-bench-switch``): ``python3 dev.py bench`` (installs
  the test and bench extras), then ``dev.py serve`` again: whether switching reinstalls.

pip runs with ``PIP_NO_CACHE_DIR=1`` so that neither version profits from the other's
downloads. The machine is shared: one run per version, figures are indicative; compare the
ratios. Writes ``benchmarks/results/first_start.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem, write_results
from service.storage.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"


@dataclass
class Start:
    """Seconds from the launch of ``dev.py serve`` (None: did not happen)."""

    installed: float | None
    livez: float | None
    ready: float | None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def serve_once(src: Path, tmp: Path, log: Path, timeout: float = 900) -> Start:
    """``python3 dev.py serve`` in ``src`` until ``/readyz`` is 200, then SIGTERM."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPML_", "VIRTUAL_ENV"))}
    env.update(OPML_PORT=str(port), OPML_DATA_DIR=str(tmp / "data"), PIP_NO_CACHE_DIR="1")
    stamp = src / ".venv" / ".opml-stamp"
    before = stamp.stat().st_mtime if stamp.exists() else None
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as sink:
        started = time.time()
        proc = subprocess.Popen(
            [PYTHON, "dev.py", "serve"], cwd=src, env=env, stdout=sink, stderr=sink
        )
    livez = ready = None
    try:
        while ready is None and time.time() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text()[-3000:])
            now = time.time() - started
            if livez is None and _answers(url + "/livez"):
                livez = now
            if livez is not None and _answers(url + "/readyz"):
                ready = time.time() - started
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    after = stamp.stat().st_mtime if stamp.exists() else None
    installed = after - started if after is not None and after != before else None
    return Start(installed, livez, ready)


def fresh_copy(label: str, revision: str | None, tmp: Path) -> Path:
    """The sources of ``revision`` (None: this working tree's tracked files) in ``tmp``."""
    src = tmp / label / "src"
    src.mkdir(parents=True)
    if revision is None:
        files = (
            subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
            .stdout.decode()
            .split("\0")
        )
        for name in filter(None, files):
            if (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, src / name)
    else:
        archive = tmp / label / "src.tar"
        subprocess.run(["git", "archive", "-o", str(archive), revision], cwd=ROOT, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(src, filter="data")
    return src


def measure(label: str, revision: str | None, tmp: Path, bench_switch: bool) -> dict[str, Any]:
    src = fresh_copy(label, revision, tmp)
    log = tmp / label / "serve.log"
    result: dict[str, Any] = {"first": asdict(serve_once(src, tmp / label, log))}
    print(label, "first start", result["first"], flush=True)
    result["second"] = asdict(serve_once(src, tmp / label, log))
    print(label, "second start", result["second"], flush=True)
    if bench_switch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
        env["PIP_NO_CACHE_DIR"] = "1"
        with log.open("ab") as sink:
            subprocess.run(
                [PYTHON, "dev.py", "bench"], cwd=src, env=env, stdout=sink, stderr=sink, check=True
            )
        result["after_bench"] = asdict(serve_once(src, tmp / label, log))
        print(label, "serve after bench", result["after_bench"], flush=True)
    return result


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(before: float | None, after: float | None) -> str:
    return "-" if not before or not after else f"{before / after:.1f}x"


def report(results: dict[str, dict[str, Any]], baseline: str, info: dict[str, Any]) -> str:
    base, ours = results["before"], results["after"]
    lines = [
        "# First start of `python3 dev.py serve`, before / after",
        "",
        f"`{command_line('benchmarks.perf.first_start')}`; before = `{baseline}`, after = this "
        "checkout. Seconds from the launch of `python3 dev.py serve` on a fresh copy (no `.venv`,"
        " no numba cache, `PIP_NO_CACHE_DIR=1`); one run each on a shared machine.",
        "",
        machine_block(info),
        "",
        "| start | event | before (s) | after (s) | before / after |",
        "|---|---|---|---|---|",
    ]
    names = {"first": "first", "second": "second", "after_bench": "serve after `dev.py bench`"}
    events = {"installed": "install done", "livez": "`/livez` answers", "ready": "`/readyz` 200"}
    for start, title in names.items():
        if start not in ours:
            continue
        for event, what in events.items():
            b, a = base[start][event], ours[start][event]
            lines.append(f"| {title} | {what} | {_s(b)} | {_s(a)} | {_ratio(b, a)} |")
    lines += [
        "",
        "Before, the server listened only once the kernels were compiled (~25-45 s of "
        "'Waiting for application startup.' here), so `/livez` and `/readyz` came together; "
        "after, it listens first and `/readyz` says 503 'compiling the learning kernels (first "
        "start only)' until they are. 'install done' is `-` when nothing was installed.",
    ]
    return "\n".join(lines) + "\n"


#: ``--quick``: the start alone, not the switch from ``bench`` back to ``serve``.
QUICK = {"skip_bench_switch": True}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument(
        "--skip-bench-switch", action="store_true", help="do not measure serve after bench"
    )
    args = parse(parser, argv, QUICK)
    with tempfile.TemporaryDirectory(prefix="first-start-") as tmp:
        results = {
            "before": measure("before", args.baseline, Path(tmp), not args.skip_bench_switch),
            "after": measure("after", None, Path(tmp), not args.skip_bench_switch),
        }
    info = machine_info()
    text = report(results, args.baseline, info)
    write_results(
        result_stem("first_start", args.quick),
        [text],
        {"machine": info, "baseline": args.baseline, "results": results},
    )
    print(text)


if __name__ == "__main__":
    main()
