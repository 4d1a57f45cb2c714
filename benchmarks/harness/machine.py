"""The machine a benchmark runs on: CPU model, versions, commit, load; CPU seconds from /proc.

Every results file records :func:`machine_info` (see :mod:`benchmarks.harness.results`), so a
figure always travels with the machine, the commit and the load it was measured under.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np


def loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages, rounded (recorded beside CPU figures: the machine
    may be shared)."""
    return [round(v, 2) for v in os.getloadavg()]


#: Why a profile is missing when py-spy is (see :func:`py_spy`).
NO_PY_SPY = "py-spy not installed (python3 dev.py bench installs it)"


def py_spy() -> str | None:
    """The py-spy executable (on the PATH or beside this Python), or None without one."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return spy if Path(spy).exists() else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def core_version() -> str:
    """The git commit of the checkout, with ``+dirty`` when ``service/core`` has local edits."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "service/core"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    import scipy
    import sklearn

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "core": core_version(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def machine_block(info: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"- CPU: {info['cpu']} ({info['cores']} cores), {info['platform']}",
            f"- Python {info['python']}, numpy {info['numpy']}, scipy {info['scipy']}, "
            f"scikit-learn {info['scikit-learn']}",
            f"- service.core at git {info['core']}",
            f"- Date: {info['date']}; 1-minute load average when the run ended: "
            f"{info['load_average_1m']} (the machine is shared; wall times are indicative)",
        ]
    )


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds from a ``/proc/<pid>[/task/<tid>]/stat`` file."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of (the main thread, every other thread) of ``pid`` (threads that end
    meanwhile are skipped)."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu = cpu_seconds(task / "stat")
        except (OSError, IndexError):
            continue
        if int(task.name) == pid:
            main = cpu
        else:
            other += cpu
    return main, other
