"""Shared pieces of the benchmarks: scaling, k-NN error, learners, the machine, CPU from /proc.

Not a script; imported by the paper reproductions (``table2.py``, ``table4.py``,
``gamma_grid.py``) and the timing and service benchmarks. The service benchmarks start the
service with :class:`devkit.launcher.ServiceProcess`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler

RESULTS_DIR = Path(__file__).resolve().parent / "results"
METHODS = ("euclidean", "opml", "copml")

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


class Learner(Protocol):
    """What the benchmarks use of ``service.core.OPML`` / ``COPML``."""

    def fit(self, X: FloatArray, y: IntArray) -> Learner: ...

    def transform(self, X: FloatArray) -> FloatArray: ...


@dataclass(frozen=True)
class Config:
    """Hyperparameters passed to the learners (same names as service.core). ``step="paper"``
    (the paper's literal rule, what Tables II and IV reproduce) unless said otherwise."""

    gamma: float = 1e-3
    gamma_pair: float = 1e-3
    margin: float = 1.0
    normalize: Literal["none", "l2"] = "none"
    step: Literal["paper", "scaled"] = "paper"

    def label(self) -> str:
        return (
            f"gamma={self.gamma:g}, gamma_pair={self.gamma_pair:g}, margin={self.margin:g}, "
            f"normalize={self.normalize}, step={self.step}"
        )


#: Learners beside the paper's rule, as a user gets them: COPML with the library's defaults
#: (``step="scaled"``, gamma 0.05, gamma_pair 0.1, margin 1), with ``gamma="auto"``, and with
#: ``gamma="auto"`` and ``rehearsal=2`` (``service.core.rehearsal``). Only ``normalize`` is
#: taken from the Config.
LIBRARY_METHODS = ("default", "auto", "auto_rehearsal")


def make_learner(method: str, config: Config, seed: int) -> Learner:
    """A fresh OPML or COPML from service.core (imported lazily so loaders work without it)."""
    from service.core import COPML, OPML

    learner: Learner
    if method == "opml":
        learner = OPML(
            gamma=config.gamma,
            margin=config.margin,
            normalize=config.normalize,
            step=config.step,
            random_state=seed,
        )
    elif method == "copml":
        learner = COPML(
            gamma=config.gamma,
            gamma_pair=config.gamma_pair,
            margin=config.margin,
            normalize=config.normalize,
            step=config.step,
            random_state=seed,
        )
    elif method == "default":
        learner = COPML(normalize=config.normalize, random_state=seed)
    elif method == "auto":
        learner = COPML(gamma="auto", normalize=config.normalize, random_state=seed)
    elif method == "auto_rehearsal":
        learner = COPML(gamma="auto", rehearsal=2, normalize=config.normalize, random_state=seed)
    else:
        raise ValueError(f"unknown learner {method!r}")
    return learner


def zscore(X_train: FloatArray, *others: FloatArray) -> list[FloatArray]:
    """Z-score with mean/std fitted on ``X_train`` (constant features get scale 1)."""
    scaler = StandardScaler().fit(X_train)
    return [scaler.transform(X_train), *(scaler.transform(X) for X in others)]


TIE_BREAKS = ("nearest", "smallest")
TIE_TEXT = {
    "nearest": "a tie of votes goes to the class of the nearest tied neighbour, as MATLAB "
    "knnclassify's default rule",
    "smallest": "a tie of votes goes to the smallest class index, as scikit-learn's "
    "KNeighborsClassifier",
}


def knn_predict(
    X_train: FloatArray,
    y_train: IntArray,
    X_test: FloatArray,
    k: int = 5,
    tie_break: str = "nearest",
) -> IntArray:
    """k-NN majority vote (Euclidean distance, uniform weights) with an explicit tie rule.

    ``tie_break="nearest"``: among the classes tied for most votes, the class of the nearest
    tied neighbour wins (MATLAB ``knnclassify``'s default rule 'nearest', presumably what the
    paper's MATLAB code used). ``"smallest"``: the smallest class index wins (what
    scikit-learn's ``KNeighborsClassifier`` does).

    >>> Xtr = np.array([[0.0], [1.0], [2.0], [3.0]])
    >>> ytr = np.array([1, 0, 0, 1])
    >>> knn_predict(Xtr, ytr, np.array([[0.1]]), k=4, tie_break="nearest").tolist()
    [1]
    >>> knn_predict(Xtr, ytr, np.array([[0.1]]), k=4, tie_break="smallest").tolist()
    [0]
    """
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break: one of {TIE_BREAKS}, got {tie_break!r}")
    nn = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(X_train)
    idx = nn.kneighbors(X_test, return_distance=False)  # sorted nearest first
    labels = y_train[idx]  # (m, k)
    n_classes = int(y_train.max()) + 1
    counts = (labels[:, :, None] == np.arange(n_classes)).sum(axis=1)  # (m, C)
    tied = counts == counts.max(axis=1, keepdims=True)
    rows = np.arange(labels.shape[0])
    pred: IntArray
    if tie_break == "smallest":
        pred = tied.argmax(axis=1).astype(np.int64)
    else:
        first = tied[rows[:, None], labels].argmax(axis=1)  # nearest neighbour of a tied class
        pred = labels[rows, first].astype(np.int64)
    return pred


def knn_error(
    X_train: FloatArray,
    y_train: IntArray,
    X_test: FloatArray,
    y_test: IntArray,
    k: int = 5,
    tie_break: str = "nearest",
) -> float:
    """Test error of :func:`knn_predict` on the given features."""
    return float(np.mean(knn_predict(X_train, y_train, X_test, k, tie_break) != y_test))


def method_errors(
    X_train: FloatArray,
    y_train: IntArray,
    X_test: FloatArray,
    y_test: IntArray,
    config: Config,
    seed: int,
    methods: Sequence[str] = METHODS,
    k: int = 5,
    tie_break: str = "nearest",
) -> dict[str, float]:
    """k-NN test error of each method; learners are fitted on the training stream in order."""
    out: dict[str, float] = {}
    for method in methods:
        if method == "euclidean":
            out[method] = knn_error(X_train, y_train, X_test, y_test, k, tie_break)
            continue
        learner = make_learner(method, config, seed).fit(X_train, y_train)
        Z_train = np.asarray(learner.transform(X_train), dtype=np.float64)
        Z_test = np.asarray(learner.transform(X_test), dtype=np.float64)
        if not (np.isfinite(Z_train).all() and np.isfinite(Z_test).all()):
            out[method] = float("nan")
            continue
        out[method] = knn_error(Z_train, y_train, Z_test, y_test, k, tie_break)
    return out


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
    root = Path(__file__).resolve().parents[1]
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


def command_line(module: str) -> str:
    """The command that reproduces this run (from the repository root)."""
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


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


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1, as MATLAB's std), ignoring NaN."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return float("nan"), float("nan")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def suffixed(stem: Path, suffix: str) -> Path:
    """``stem`` with ``suffix`` appended (not ``with_suffix``: stems may contain dots)."""
    return stem.with_name(stem.name + suffix)


def skipped_lines(skipped: dict[str, str]) -> list[str]:
    """The report's list of data sets left out for missing data (none: no lines)."""
    if not skipped:
        return []
    return ["Skipped (data missing):", "", *(f"- {n}: {m}" for n, m in skipped.items()), ""]


def write_results(out: Path, md: list[str], data: dict[str, Any]) -> None:
    """``out``.md (the report's lines) and ``out``.json (``data``, one-space indent)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    suffixed(out, ".md").write_text("\n".join(md), encoding="utf-8")
    suffixed(out, ".json").write_text(json.dumps(data, indent=1), encoding="utf-8")


def fmt(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"


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
