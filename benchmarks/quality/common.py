"""Shared pieces of the paper reproductions: scaling, k-NN error, learners, mean ± std.

Not a script; imported by ``table2``, ``table4``, ``gamma_grid``, ``learners``, ``scales``,
``certificates_eval`` and ``step_ceiling``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler

from benchmarks.harness.machine import machine_block
from benchmarks.harness.results import write_results

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


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1, as MATLAB's std), ignoring NaN."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return float("nan"), float("nan")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def skipped_lines(skipped: dict[str, str]) -> list[str]:
    """The report's list of data sets left out for missing data (none: no lines)."""
    if not skipped:
        return []
    return ["Skipped (data missing):", "", *(f"- {n}: {m}" for n, m in skipped.items()), ""]


def report_head(
    title: str,
    script: str,
    command: str,
    info: dict[str, Any],
    elapsed: float,
    jobs: int,
    remark: str = "",
) -> list[str]:
    """The report's opening lines: title, the command that reproduces it (``remark`` follows
    the script's name), the machine and the wall time."""
    return [
        title,
        "",
        f"Generated by `benchmarks/{script}`{remark}; do not edit by hand. "
        "Command (repository root):",
        "",
        f"    {command}",
        "",
        machine_block(info),
        f"- Wall time: {elapsed:.0f} s with {jobs} worker process(es)",
        "",
    ]


def write_report(
    out: Path,
    md: list[str],
    *,
    notes: Sequence[str],
    files: str,
    command: str,
    info: dict[str, Any],
    settings: dict[str, Any],
    **data: Any,
) -> None:
    """Append the hand-written ``notes`` (a "Notes" section, none if empty) and the line
    naming the result files to ``md``, then write ``out``.md and ``out``.json: the command,
    machine and ``settings`` first, then ``data`` in the order given."""
    if notes:
        md += ["## Notes", "", *notes, ""]
    md += [files, ""]
    write_results(out, md, {"command": command, "machine": info, "settings": settings, **data})


def fmt(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"


def itml_shim() -> None:
    """metric-learn 0.7 passes ``force_all_finite``, removed in scikit-learn 1.9."""
    import metric_learn._util as util

    def renamed(check: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if "force_all_finite" in kwargs:
                kwargs["ensure_all_finite"] = kwargs.pop("force_all_finite")
            return check(*args, **kwargs)

        return call

    if not getattr(util, "_opml_shimmed", False):
        util.check_array = renamed(util.check_array)
        util.check_X_y = renamed(util.check_X_y)
        util._opml_shimmed = True
