"""Shared pieces of the paper-reproduction benchmarks: scaling, k-NN error, learners, reporting.

Not a script; imported by ``benchmarks/table2.py``, ``table4.py`` and ``gamma_grid.py``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray
from sklearn.neighbors import KNeighborsClassifier
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
    """Hyperparameters passed to the learners (same names as service.core)."""

    gamma: float = 1e-3
    gamma_pair: float = 1e-3
    margin: float = 1.0
    normalize: str = "none"

    def label(self) -> str:
        return (
            f"gamma={self.gamma:g}, gamma_pair={self.gamma_pair:g}, margin={self.margin:g}, "
            f"normalize={self.normalize}"
        )


def make_learner(method: str, config: Config, seed: int) -> Learner:
    """A fresh OPML or COPML from service.core (imported lazily so loaders work without it)."""
    from service.core import COPML, OPML

    learner: Learner
    if method == "opml":
        learner = OPML(
            gamma=config.gamma,
            margin=config.margin,
            normalize=config.normalize,
            random_state=seed,
        )
    elif method == "copml":
        learner = COPML(
            gamma=config.gamma,
            gamma_pair=config.gamma_pair,
            margin=config.margin,
            normalize=config.normalize,
            random_state=seed,
        )
    else:
        raise ValueError(f"unknown learner {method!r}")
    return learner


def zscore(X_train: FloatArray, *others: FloatArray) -> list[FloatArray]:
    """Z-score with mean/std fitted on ``X_train`` (constant features get scale 1)."""
    scaler = StandardScaler().fit(X_train)
    return [scaler.transform(X_train), *(scaler.transform(X) for X in others)]


def knn_error(
    X_train: FloatArray, y_train: IntArray, X_test: FloatArray, y_test: IntArray, k: int = 5
) -> float:
    """Test error of a k-NN classifier (Euclidean distance, uniform vote) on the given features."""
    clf = KNeighborsClassifier(n_neighbors=k, algorithm="brute")
    clf.fit(X_train, y_train)
    return float(np.mean(clf.predict(X_test) != y_test))


def method_errors(
    X_train: FloatArray,
    y_train: IntArray,
    X_test: FloatArray,
    y_test: IntArray,
    config: Config,
    seed: int,
    methods: Sequence[str] = METHODS,
    k: int = 5,
) -> dict[str, float]:
    """k-NN test error of each method; learners are fitted on the training stream in order."""
    out: dict[str, float] = {}
    for method in methods:
        if method == "euclidean":
            out[method] = knn_error(X_train, y_train, X_test, y_test, k)
            continue
        learner = make_learner(method, config, seed).fit(X_train, y_train)
        Z_train = np.asarray(learner.transform(X_train), dtype=np.float64)
        Z_test = np.asarray(learner.transform(X_test), dtype=np.float64)
        if not (np.isfinite(Z_train).all() and np.isfinite(Z_test).all()):
            out[method] = float("nan")
            continue
        out[method] = knn_error(Z_train, y_train, Z_test, y_test, k)
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
            f"- Date: {info['date']}",
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


def fmt(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"
