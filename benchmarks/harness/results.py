"""Where results go and what each one records.

One current result per benchmark: ``benchmarks/results/NAME.{json,md,png}``, overwritten by
each full run (git holds the history). A ``--quick`` run writes the same files under
``benchmarks/results/quick/`` (not tracked), so a smoke run never replaces a real result.
``OPML_BENCH_RESULTS`` names another results folder (the tests point it at a temporary dir).

Every JSON result carries a ``run`` record (:func:`run_record`): the command that reproduces
it, the commit, the machine, the load average and the date.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.machine import core_version, loadavg, machine_info

#: The results folder (``OPML_BENCH_RESULTS`` overrides it).
RESULTS_DIR = Path(
    os.environ.get("OPML_BENCH_RESULTS") or Path(__file__).resolve().parents[1] / "results"
)

#: Profiles and other bulky by-products of a run: kept out of git (``.gitignore``).
PROFILES_DIR = RESULTS_DIR / "profiles"


def result_stem(name: str, quick: bool = False) -> Path:
    """The stem of a benchmark's results files: ``RESULTS_DIR/NAME`` (``quick/NAME`` for a
    quick run).

    >>> result_stem("ingest").name, result_stem("ingest", quick=True).parent.name
    ('ingest', 'quick')
    """
    return (RESULTS_DIR / "quick" if quick else RESULTS_DIR) / name


def run_record(module: str | None = None) -> dict[str, Any]:
    """What reproduces and situates a run: command, commit, machine, load average, date."""
    module = module or _main_module()
    info = machine_info()
    return {
        "command": command_line(module),
        "commit": core_version(),
        "machine": f"{info['cpu']} ({info['cores']} cores), {info['platform']}",
        "load_average": loadavg(),
        "date": info["date"],
    }


def _main_module() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name != "benchmarks.__main__":
        return str(spec.name)
    return sys.argv[0]  # the runner (benchmarks/__main__.py) puts the module's name there


def command_line(module: str) -> str:
    """The command that reproduces this run (from the repository root)."""
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


def suffixed(stem: Path, suffix: str) -> Path:
    """``stem`` with ``suffix`` appended (not ``with_suffix``: stems may contain dots)."""
    return stem.with_name(stem.name + suffix)


def write_results(out: Path, md: list[str], data: dict[str, Any]) -> None:
    """``out``.md (the report's lines) and ``out``.json (``data``, one-space indent, with a
    ``run`` record unless it has one)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"run": run_record(), **data} if "run" not in data else data
    suffixed(out, ".md").write_text("\n".join(md), encoding="utf-8")
    suffixed(out, ".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
