"""The learners side by side: OPML, COPML, sgd (hinge / smooth), sgd_psd and brm (issue 15).

    python3 dev.py bench && bash benchmarks/quality/get_data.sh
    .venv/bin/python -m benchmarks.quality.learners [--quick] [--parts table2,timing,brm]

Three parts, one run, one results file (``benchmarks/results/learners.{md,json,png}``):

1. **Table II protocol** (``seed-specs.md`` 1.10.6): per data set, ``--splits`` random
   stratified 50/50 splits, z-score fitted on the training half, one pass of each learner over
   the training half in the split's order (learner seed = split seed), 5-NN error on the
   transformed features (ties to the nearest tied neighbour, as ``benchmarks/table2.py``).
   Learners: ``opml``, ``copml`` (``gamma = gamma_pair = 1e-3``, as ``table2.py``),
   ``sgd_hinge`` (``mu = 0``, constant ``eta = gamma / 2 = 5e-4``: OPML's explicit twin),
   ``sgd_smooth`` (``mu = 0.1``, the default ``descent`` rule), ``sgd_psd`` and ``brm``
   (their defaults); the sgd variants' cold-start pair step uses ``gamma_pair = 1e-3`` too.
   Pass criterion of 1.10.6: hinge sgd within one std of the paper's OPML column.
   **Verification** on ``digits`` (scikit-learn's 1797 x 64) and ``optdigits``: on the test
   half (at most 1000 samples, drawn by the split seed), every pair is scored with the
   learner's distance (``||L(a - b)||^2``; for ``brm`` its restricted ``D_R^2``, the score its
   calibrator and the service's verify use) and ROC AUC / EER (where false accept = false
   reject on the ROC curve) are computed.
2. **Time per sample** at d in {21, 64, 310, 512}, all algorithms in one run, worst case
   (unit-norm samples, 10 classes, margins so large that every step is an update), ``learn_many``
   on one BLAS thread; every algorithm is timed ``--repeats`` times in alternation and the
   fastest run's CPU time kept (the machine is shared; the load is recorded). 1.10.7's
   criterion: sgd within 1.3x of OPML at d = 64 and d = 512; sgd_psd's O(d^3) shows in its
   log-log slope.
3. **BRM on seed 003's Table 3 protocol** (3.7.6): pima, segment, vehicle, australian (KEEL
   copies), ``--trials`` random stratified 80/20 splits, z-scored on the training part, 5-NN;
   online BRM-R vs hinge L-SGD with the same budget (one pass over the same training stream,
   the same triplets), each at its default, plus a small step-size grid for both (the brm
   default ``eta = 0.3`` was chosen from this grid: disclosed, not hidden). Criterion: brm not
   worse than hinge sgd by more than one pooled std; and the spread of the restricted distance
   ``D_R^2`` over negative test pairs (brm: its own ``L``; sgd: the canonical factor), the
   paper's Fig. 6/10 claim. The paper's numbers are printed beside, with why they cannot be
   matched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import auc, roc_curve
from sklearn.model_selection import train_test_split

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_block, machine_info
from benchmarks.harness.results import command_line, result_stem
from benchmarks.quality.common import FloatArray, IntArray, fmt, knn_error, mean_std, zscore
from benchmarks.quality.datasets import (
    LOADERS,
    load,
    load_australian,
    load_digits,
    load_pima,
    load_segment,
    load_vehicle,
    present,
)
from benchmarks.quality.table2 import PAPER
from service.core import BRM, COPML, OPML, SGD, SGDPSD, Learner, LearnerConfig
from service.core.brm import restricted_squared_norms

METHODS = ("euclidean", "opml", "copml", "sgd_hinge", "sgd_smooth", "sgd_psd", "brm")
LABELS = {
    "euclidean": "Euclidean",
    "opml": "OPML",
    "copml": "COPML",
    "sgd_hinge": "sgd hinge (eta=gamma/2)",
    "sgd_smooth": "sgd mu=0.1 (descent)",
    "sgd_psd": "sgd_psd",
    "brm": "brm",
}
VERIFICATION_SETS = ("digits", "optdigits")
PAIR_SAMPLES = 1000
TIMING_DIMS = (21, 64, 310, 512)
BRM_SETS = ("pima", "segment", "vehicle", "australian")

#: Seed 003's Table 3 (k-NN error %, 20 trials of 80/20): BRM-R, BRM-C, best baseline.
PAPER_BRM = {
    "pima": {"brm_r": "21.31 ± 0.18", "brm_c": "20.31 ± 1.72", "best": "CERML 24.02"},
    "segment": {"brm_r": "2.21 ± 0.12", "brm_c": "2.81 ± 0.02", "best": "LMNN 2.73"},
    "vehicle": {"brm_r": "15.51", "brm_c": "15.51", "best": "CERML 19.02"},
    "australian": {"brm_r": "15.98", "brm_c": "15.72", "best": "GMML 14.36"},
}
#: Euclidean 5-NN error % measured for seed-specs 3.6 on the same KEEL copies (a cross-check).
SPEC_EUCLIDEAN = {
    "pima": "25.16 ± 2.71",
    "segment": "5.74 ± 1.06",
    "vehicle": "27.71 ± 3.73",
    "australian": "15.22 ± 2.91",
}
#: Facts about the protocols, printed under the results (they do not depend on the run).
NOTES = [
    "**Why seed 003's Table 3 numbers cannot be matched** (seed-specs 3.6): the paper trains "
    "by mini-batch SGD over 1000 C(C-1) random training pairs for an unreported number of "
    "epochs, with unreported learning rate, regulariser and projection size; here brm is one "
    "online pass over the training stream with the buffer's triplets (BRM-R, the service's "
    "setting). Several of its standard deviations are impossible for 20 random 80/20 splits "
    "(segment 2.81 ± 0.02 where one test error is 0.216 points, pima 21.31 ± 0.18 where one "
    "error is 0.649 points), and its baselines are not reproducible either (its vowel "
    "Euclidean-type baselines are 38-47 %, 9.4 % on the KEEL copy). Our Euclidean column "
    "agrees with the values measured for seed-specs 3.6 on the same files. Hence the "
    "relative criterion of 3.7.6 (brm against hinge sgd with the same one-pass budget).",
    "**3.7.6 criterion**: brm's mean error minus hinge sgd's is at most the pooled std "
    "sqrt((s_sgd² + s_brm²) / 2). The D_R² spread is the std of the restricted squared "
    "distance over all negative pairs among (at most) 600 test samples, averaged over "
    "trials; sgd's D_R² uses the canonical factor of its M (the only factor-free choice), "
    "brm's its own L.",
    "**Defaults**: brm's eta = 0.3 is the best mean of the step grid above at the default "
    "tau = 0.1 (chosen on these four data sets: its Table 3 errors are not held-out "
    "estimates of a tuned method, and hinge sgd's grid is shown beside for that reason). "
    "sgd_psd's eta = 2e-3 = 2 gamma is OPML's step in M to first order (no tuning).",
    "**Table II settings**: OPML/COPML as `benchmarks/table2.py` (gamma = gamma_pair = 1e-3, "
    "margin 1); the sgd variants' cold-start pair step uses gamma_pair = 1e-3 too; "
    "sgd_psd and brm at their defaults; every learner sees the same triplets (same seed).",
    "**Timing**: learn_many on one BLAS thread (what the service runs), CPU time of the "
    "process (wall time, which also counts waiting for a core on this shared 2-core VM, is in "
    "the JSON); sgd_psd is timed on fewer samples at large d (each active step is an "
    "eigendecomposition). OPML and COPML run the same code on this stream (ten classes from "
    "the start, no single-class phase): their gap shows the measurement noise, against which "
    "the 1.3x criterion has to be read.",
]
BRM_GRID = {"eta": (0.01, 0.03, 0.1, 0.3, 1.0), "margin": (0.05, 0.1, 0.3)}
SGD_GRID = {"eta": (1e-4, 5e-4, 2e-3, 1e-2, 5e-2)}


def make(method: str, seed: int, **overrides: Any) -> Any:
    """A fresh estimator of ``method`` (see the module docstring for the settings)."""
    pair = {"gamma_pair": 1e-3}
    makers: dict[str, Callable[[], Any]] = {
        # the paper's rule: sgd's eta = gamma / 2 is its twin in the same (input) units
        "opml": lambda: OPML(gamma=1e-3, step="paper", random_state=seed),
        "copml": lambda: COPML(gamma=1e-3, step="paper", random_state=seed, **pair),
        "sgd_hinge": lambda: SGD(eta=5e-4, mu=0.0, step="constant", random_state=seed, **pair),
        "sgd_smooth": lambda: SGD(mu=0.1, random_state=seed, **pair),
        "sgd_psd": lambda: SGDPSD(random_state=seed),
        "brm": lambda: BRM(random_state=seed),
    }
    model = makers[method]()
    return model.set_params(**overrides) if overrides else model


# -- part 1: Table II protocol and verification --------------------------------------------


def pair_scores(model: Any, method: str, X: FloatArray) -> FloatArray:
    """The learner's verification score of every pair i < j of ``X`` (smaller = same).

    ``brm``: ``D_R^2`` of ``z = L a - L b`` (= ``L (a - b)``) with ``restricted_squared_norms``,
    the function behind ``Learner.restricted_squared_distances``, on the pairwise differences
    of the transformed samples (same values; the learner's query path re-maps every pair).
    """
    i, j = np.triu_indices(len(X), k=1)
    Z = X if model is None else np.asarray(model.transform(X))
    if method == "brm":
        out = np.empty(len(i))
        for start in range(0, len(i), 1 << 16):
            rows = slice(start, start + (1 << 16))
            out[rows] = restricted_squared_norms(Z[i[rows]] - Z[j[rows]])
        return out
    sq = np.einsum("ij,ij->i", Z, Z)
    D = np.maximum(sq[:, None] + sq[None, :] - 2 * (Z @ Z.T), 0.0)
    scores: FloatArray = D[i, j]
    return scores


def auc_eer(scores: FloatArray, same: np.ndarray) -> tuple[float, float]:
    """ROC AUC of ``-scores`` for ``same`` and the equal error rate (FAR = FRR point)."""
    fpr, tpr, _ = roc_curve(same, -scores)
    fnr = 1.0 - tpr
    k = int(np.argmin(np.abs(fnr - fpr)))
    return float(auc(fpr, tpr)), float((fpr[k] + fnr[k]) / 2)


def table2_task(args: tuple[str, int]) -> tuple[str, int, dict[str, dict[str, float]]]:
    name, seed = args
    X, y = load_digits() if name == "digits" else load(name)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=0.5, stratify=y, random_state=seed, shuffle=True
    )
    X_tr, X_te = zscore(X_tr, X_te)
    verify = name in VERIFICATION_SETS
    if verify:
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(X_te), size=min(PAIR_SAMPLES, len(X_te)), replace=False)
        i, j = np.triu_indices(len(pick), k=1)
        same = y_te[pick][i] == y_te[pick][j]
    out: dict[str, dict[str, float]] = {}
    for method in METHODS:
        row: dict[str, float] = {}
        model = None
        if method == "euclidean":
            row["error"] = knn_error(X_tr, y_tr, X_te, y_te)
        else:
            model = make(method, seed).fit(X_tr, y_tr)
            Z_tr, Z_te = model.transform(X_tr), model.transform(X_te)
            row["error"] = knn_error(Z_tr, y_tr, Z_te, y_te)
        if verify:
            row["auc"], row["eer"] = auc_eer(pair_scores(model, method, X_te[pick]), same)
            if method == "brm":  # its Mahalanobis distance, for comparison
                plain = pair_scores(model, "mahalanobis", X_te[pick])
                row["auc_mahalanobis"], row["eer_mahalanobis"] = auc_eer(plain, same)
        out[method] = row
    return name, seed, out


def run_table2(names: Sequence[str], splits: int, jobs: int) -> dict[str, Any]:
    available, skipped = present(names, lambda n: load_digits() if n == "digits" else load(n))
    tasks = [(name, s) for name in available for s in range(splits)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(table2_task, tasks, chunksize=2))
    raw: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name, _, out in results:
        for method, row in out.items():
            for key, value in row.items():
                raw.setdefault(name, {}).setdefault(method, {}).setdefault(key, []).append(value)
    summary = {
        name: {
            method: {key: mean_std(values) for key, values in per.items()}
            for method, per in methods.items()
        }
        for name, methods in raw.items()
    }
    return {"raw": raw, "summary": summary, "skipped": skipped}


def twin_criterion(name: str, summary: dict[str, Any]) -> str:
    """1.10.6: hinge sgd within one std of the paper's OPML column."""
    if name not in PAPER:
        return ""
    mean, std = PAPER[name]["opml"]
    ours = summary["sgd_hinge"]["error"][0]
    return ("pass" if abs(ours - mean) <= std + 1e-12 else "**FAIL**") + f" (|Δ| ≤ {std:.3f})"


def table2_markdown(part: dict[str, Any]) -> list[str]:
    summary = part["summary"]
    head = "| data | " + " | ".join(LABELS[m] for m in METHODS) + " | paper OPML | 1.10.6 |"
    lines = [head, "|---" * (len(METHODS) + 3) + "|"]
    for name, per in summary.items():
        cells = [name] + [fmt(*per[m]["error"]) for m in METHODS]
        cells.append(fmt(*PAPER[name]["opml"]) if name in PAPER else "-")
        cells.append(twin_criterion(name, per) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Verification (pairs of the test half; mean ± std over splits):", ""]
    lines += ["| data | metric | " + " | ".join(LABELS[m] for m in METHODS) + " |"]
    lines += ["|---" * (len(METHODS) + 2) + "|"]
    for name in VERIFICATION_SETS:
        if name not in summary:
            continue
        for key in ("auc", "eer"):
            cells = [name, "ROC AUC" if key == "auc" else "EER"]
            cells += [fmt(*summary[name][m][key]) for m in METHODS]
            lines.append("| " + " | ".join(cells) + " |")
        brm = summary[name]["brm"]
        lines.append(
            f"| {name} | brm scored by ‖L(a-b)‖² instead of D_R² | AUC "
            f"{fmt(*brm['auc_mahalanobis'])}, EER {fmt(*brm['eer_mahalanobis'])} |"
            + " |"
            * (len(METHODS) - 1)
        )
    return lines


# -- part 2: time per sample -----------------------------------------------------------------

TIMED: dict[str, dict[str, Any]] = {
    "opml": {"algorithm": "opml", "step": "paper", "gamma": 1e-3, "margin": 1e9},
    "copml": {"algorithm": "copml", "step": "paper", "gamma": 1e-3, "margin": 1e9},
    "sgd_hinge": {"algorithm": "sgd", "eta": 5e-4, "step": "constant", "margin": 1e9},
    "sgd_smooth": {"algorithm": "sgd", "mu": 0.1, "margin": 1e9},
    "sgd_psd": {"algorithm": "sgd_psd", "margin": 1e9},
    "brm": {"algorithm": "brm", "margin": 0.999},
}
CLASSES = 10
SAMPLES = {21: 20000, 64: 20000, 310: 4000, 512: 1500}
PSD_SAMPLES = {21: 2000, 64: 400, 310: 24, 512: 8}


def timing_stream(n: int, d: int) -> tuple[FloatArray, IntArray]:
    """``CLASSES`` samples, one per class (to fill the buffer, untimed), then ``n`` more."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(CLASSES + n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.concatenate([np.arange(CLASSES), rng.integers(0, CLASSES, size=n)])
    return X, y


def run_timing(repeats: int, quick: bool) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for d in TIMING_DIMS:
        n_max = SAMPLES[d] // (10 if quick else 1)
        X, y = timing_stream(n_max, d)
        best: dict[str, float] = {}  # CPU time: robust to waiting for a core on a busy host
        wall: dict[str, float] = {}
        updates: dict[str, float] = {}
        for kwargs in TIMED.values():  # compile / warm the BLAS thread control
            Learner(LearnerConfig(dim=d, **kwargs)).learn_many(X[:20], y[:20])
        for _ in range(repeats):
            for method, kwargs in TIMED.items():
                n = min(n_max, PSD_SAMPLES[d]) if method == "sgd_psd" else n_max
                learner = Learner(LearnerConfig(dim=d, **kwargs))
                learner.learn_many(X[:CLASSES], y[:CLASSES])  # the buffer: no step
                batch, labels = X[CLASSES : CLASSES + n], y[CLASSES : CLASSES + n]
                start, start_cpu = time.perf_counter(), time.process_time()
                learner.learn_many(batch, labels)
                cpu = (time.process_time() - start_cpu) / n
                wall[method] = min(wall.get(method, math.inf), (time.perf_counter() - start) / n)
                best[method] = min(best.get(method, math.inf), cpu)
                counts = learner.counts
                active = counts["triplet_update"] + counts["shrunk_update"] + counts["sgd_update"]
                updates[method] = active / n
        rows[str(d)] = {
            "us_per_sample": {m: v * 1e6 for m, v in best.items()},
            "wall_us_per_sample": {m: v * 1e6 for m, v in wall.items()},
            "update_share": updates,
        }
        print(d, {m: f"{v * 1e6:.2f} us" for m, v in best.items()}, flush=True)
    slopes = {}
    for method in TIMED:
        ds = np.array(TIMING_DIMS[1:], dtype=float)
        ts = np.array([rows[str(d)]["us_per_sample"][method] for d in TIMING_DIMS[1:]])
        slopes[method] = float(np.polyfit(np.log(ds), np.log(ts), 1)[0])
    ratios = {
        str(d): rows[str(d)]["us_per_sample"]["sgd_hinge"] / rows[str(d)]["us_per_sample"]["opml"]
        for d in TIMING_DIMS
    }
    return {"rows": rows, "slopes_64_512": slopes, "sgd_over_opml": ratios}


def timing_markdown(part: dict[str, Any]) -> list[str]:
    methods = list(TIMED)
    lines = [
        "| d | " + " | ".join(LABELS[m] for m in methods) + " | sgd hinge / OPML |",
        "|---" * (len(methods) + 2) + "|",
    ]
    for d in TIMING_DIMS:
        row = part["rows"][str(d)]["us_per_sample"]
        ratio = part["sgd_over_opml"][str(d)]
        verdict = ""
        if d in (64, 512):
            verdict = " (≤ 1.3: " + ("met" if ratio <= 1.3 else "**not met**") + ")"
        cells = [str(d)] + [f"{row[m]:,.2f}" for m in methods] + [f"{ratio:.2f}{verdict}"]
        lines.append("| " + " | ".join(cells) + " |")
    slopes = ", ".join(f"{LABELS[m]} {s:.2f}" for m, s in part["slopes_64_512"].items())
    shares = {m: min(part["rows"][str(d)]["update_share"][m] for d in TIMING_DIMS) for m in methods}
    lines += [
        "",
        f"Log-log slope of time vs d over 64 ≤ d ≤ 512: {slopes}. Share of timed samples "
        "that were updates (smallest over d): "
        + ", ".join(f"{LABELS[m]} {v:.3f}" for m, v in shares.items())
        + ".",
    ]
    return lines


# -- part 3: BRM on seed 003's Table 3 protocol ---------------------------------------------

BRM_LOADERS = {
    "pima": load_pima,
    "segment": load_segment,
    "vehicle": load_vehicle,
    "australian": load_australian,
}


def negative_spread(
    learner: Learner | None, X: FloatArray, y: IntArray
) -> tuple[FloatArray, FloatArray]:
    """``D_R^2`` of the negative and positive pairs of ``X`` (at most 600 samples)."""
    keep = np.arange(min(len(X), 600))
    i, j = np.triu_indices(len(keep), k=1)
    A, B = X[keep][i], X[keep][j]
    if learner is None:  # Euclidean: the identity's restricted distance
        learner = Learner(LearnerConfig(dim=X.shape[1], algorithm="opml"))
    d2 = learner.restricted_squared_pairs(A, B)
    same = y[keep][i] == y[keep][j]
    return d2[~same], d2[same]


def brm_task(args: tuple[str, int, bool]) -> tuple[str, int, dict[str, Any]]:
    name, seed, grid = args
    X, y = BRM_LOADERS[name]()
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=0.2, stratify=y, random_state=seed, shuffle=True
    )
    X_tr, X_te = zscore(X_tr, X_te)
    out: dict[str, Any] = {"euclidean": knn_error(X_tr, y_tr, X_te, y_te)}
    models = {
        "sgd": SGD(random_state=seed),  # hinge, descent, eta = 5e-4: the service default
        "brm": BRM(random_state=seed),
    }
    for key, model in models.items():
        model.fit(X_tr, y_tr)
        out[key] = knn_error(model.transform(X_tr), y_tr, model.transform(X_te), y_te)
        neg, pos = negative_spread(model.learner_, X_te, y_te)
        out[f"{key}_neg_std"], out[f"{key}_neg_iqr"] = (
            float(neg.std()),
            float(np.subtract(*np.percentile(neg, [75, 25]))),
        )
        out[f"{key}_pos_mean"], out[f"{key}_neg_mean"] = float(pos.mean()), float(neg.mean())
        if seed == 0:
            out[f"{key}_hist"] = {"neg": neg.tolist()[:20000], "pos": pos.tolist()[:20000]}
    if grid:
        for eta in BRM_GRID["eta"]:
            for margin in BRM_GRID["margin"]:
                m = BRM(eta=eta, margin=margin, random_state=seed).fit(X_tr, y_tr)
                err = knn_error(m.transform(X_tr), y_tr, m.transform(X_te), y_te)
                out[f"grid_brm_eta={eta:g}_tau={margin:g}"] = err
        for eta in SGD_GRID["eta"]:
            m = SGD(eta=eta, random_state=seed).fit(X_tr, y_tr)
            out[f"grid_sgd_eta={eta:g}"] = knn_error(
                m.transform(X_tr), y_tr, m.transform(X_te), y_te
            )
    return name, seed, out


def run_brm(trials: int, jobs: int, grid: bool) -> dict[str, Any]:
    available, skipped = present(BRM_SETS, lambda n: BRM_LOADERS[n]())
    tasks = [(name, s, grid) for name in available for s in range(trials)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(brm_task, tasks, chunksize=2))
    raw: dict[str, dict[str, list[float]]] = {}
    hist: dict[str, Any] = {}
    for name, _, out in results:
        for key, value in out.items():
            if key.endswith("_hist"):
                hist.setdefault(name, {})[key] = value
            else:
                raw.setdefault(name, {}).setdefault(key, []).append(value)
    summary = {name: {k: mean_std(v) for k, v in per.items()} for name, per in raw.items()}
    return {"raw": raw, "summary": summary, "hist": hist, "skipped": skipped}


def brm_markdown(part: dict[str, Any]) -> list[str]:
    lines = [
        "| data | Euclidean (%) | spec 3.6 Euclidean | hinge sgd (%) | brm (%) | brm - sgd | "
        "pooled std | 3.7.6 | D_R² neg. spread (std) sgd → brm | paper BRM-R | "
        "paper BRM-C | paper best baseline |",
        "|---" * 12 + "|",
    ]
    for name, s in part["summary"].items():
        eu, sgd, brm = (s[k] for k in ("euclidean", "sgd", "brm"))
        pooled = math.sqrt((sgd[1] ** 2 + brm[1] ** 2) / 2)
        diff = brm[0] - sgd[0]
        ok = "pass" if diff <= pooled else "**FAIL**"
        spread = f"{s['sgd_neg_std'][0]:.4f} → {s['brm_neg_std'][0]:.4f}"
        spread += " (smaller)" if s["brm_neg_std"][0] < s["sgd_neg_std"][0] else " (**larger**)"
        paper = PAPER_BRM[name]
        lines.append(
            f"| {name} | {100 * eu[0]:.2f} ± {100 * eu[1]:.2f} | {SPEC_EUCLIDEAN[name]} | "
            f"{100 * sgd[0]:.2f} ± {100 * sgd[1]:.2f} | {100 * brm[0]:.2f} ± {100 * brm[1]:.2f} | "
            f"{100 * diff:+.2f} | {100 * pooled:.2f} | {ok} | {spread} | {paper['brm_r']} | "
            f"{paper['brm_c']} | {paper['best']} |"
        )
    grid_keys = sorted(
        {k for s in part["summary"].values() for k in s if k.startswith("grid_")},
        key=lambda k: (k.split("_")[1], k),
    )
    if grid_keys:
        names = list(part["summary"])
        lines += ["", "Step-size grid (5-NN error %, mean over trials):", ""]
        lines += ["| setting | " + " | ".join(names) + " | mean |", "|---" * (len(names) + 2) + "|"]
        for key in grid_keys:
            vals = [part["summary"][n][key][0] for n in names]
            cells = [key[5:]] + [f"{100 * v:.2f}" for v in vals] + [f"{100 * np.mean(vals):.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


# -- chart -----------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    colors = dict(zip(METHODS, plt.get_cmap("tab10").colors, strict=False))
    if "table2" in results:
        ax = axes[0, 0]
        summary = results["table2"]["summary"]
        names = list(summary)
        x = np.arange(len(names))
        width = 0.8 / len(METHODS)
        for k, m in enumerate(METHODS):
            vals = np.array([summary[n][m]["error"] for n in names])
            ax.bar(x + (k - len(METHODS) / 2) * width, vals[:, 0], width, yerr=vals[:, 1],
                   color=colors[m], capsize=1.5, label=LABELS[m])  # fmt: skip
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=25, fontsize=8)
        ax.set_ylabel("5-NN error (Table II protocol)")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(axis="y", alpha=0.3)
        ax = axes[0, 1]
        sets = [n for n in VERIFICATION_SETS if n in summary]
        for k, m in enumerate(METHODS):
            vals = np.array([summary[n][m]["eer"] for n in sets])
            ax.bar(np.arange(len(sets)) + (k - len(METHODS) / 2) * width, vals[:, 0], width,
                   yerr=vals[:, 1], color=colors[m], capsize=2, label=LABELS[m])  # fmt: skip
        ax.set_xticks(np.arange(len(sets)))
        ax.set_xticklabels(sets)
        ax.set_ylabel("verification EER (lower is better)")
        ax.grid(axis="y", alpha=0.3)
    if "timing" in results:
        ax = axes[1, 0]
        rows = results["timing"]["rows"]
        for m in TIMED:
            ax.loglog(TIMING_DIMS, [rows[str(d)]["us_per_sample"][m] for d in TIMING_DIMS],
                      "o-", color=colors[m], label=LABELS[m])  # fmt: skip
        ax.set_xlabel("d")
        ax.set_ylabel("µs per sample (every step an update)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    if "brm" in results and results["brm"]["hist"]:
        ax = axes[1, 1]
        hist = results["brm"]["hist"]
        for k, name in enumerate(hist):
            for key, style in (("sgd_hist", ":"), ("brm_hist", "-")):
                neg = np.asarray(hist[name][key]["neg"])
                ax.hist(neg + 1.1 * k, bins=60, range=(1.1 * k, 1.1 * k + 1), histtype="step",
                        linestyle=style, color=f"C{k}", density=True,
                        label=f"{name} {key[:3]}")  # fmt: skip
        ax.set_xlabel("D_R² of negative test pairs (trial 0), data sets side by side")
        ax.set_yticks([])
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--parts", default="table2,timing,brm")
    parser.add_argument("--splits", type=int, default=100)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--datasets", default=",".join([*LOADERS, "digits"]))
    parser.add_argument("--no-grid", action="store_true", help="skip the BRM/SGD step grid")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="3 splits/trials, fewer samples")
    args = parse(parser, argv, {"splits": 3, "trials": 3, "repeats": 2})
    parts = {p.strip() for p in args.parts.split(",")}
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    if "table2" in parts:
        t0 = time.perf_counter()
        names = [n.strip() for n in args.datasets.split(",") if n.strip()]
        results["table2"] = run_table2(names, args.splits, args.jobs)
        seconds["table2"] = time.perf_counter() - t0
    if "brm" in parts:
        t0 = time.perf_counter()
        results["brm"] = run_brm(args.trials, args.jobs, grid=not args.no_grid)
        seconds["brm"] = time.perf_counter() - t0
    if "timing" in parts:
        t0 = time.perf_counter()
        results["timing"] = run_timing(args.repeats, args.quick)
        seconds["timing"] = time.perf_counter() - t0
    info = machine_info()
    command = command_line("benchmarks.quality.learners")
    md = [
        "# The learners side by side: OPML, COPML, sgd, sgd_psd, brm",
        "",
        "Generated by `benchmarks/learners.py` (its docstring has the protocols); do not edit "
        "by hand. Command (repository root):",
        "",
        f"    {command}",
        "",
        machine_block(info),
        f"- Load average (1, 5, 15 min) at start {[round(v, 2) for v in load_start]}, at end "
        f"{[round(v, 2) for v in os.getloadavg()]}; wall time per part (s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()),
        "",
    ]
    if "table2" in results:
        md += [
            f"## Table II protocol ({args.splits} splits, 5-NN error, mean ± std)",
            "",
            *table2_markdown(results["table2"]),
            "",
        ]
    if "timing" in results:
        md += [
            "## Time per sample (CPU µs, learn_many, worst case: every step an update; "
            f"fastest of {args.repeats} alternated runs)",
            "",
            *timing_markdown(results["timing"]),
            "",
        ]
    if "brm" in results:
        md += [
            f"## BRM on seed 003's Table 3 protocol ({args.trials} trials of 80/20, 5-NN)",
            "",
            *brm_markdown(results["brm"]),
            "",
        ]
    md += ["## Notes", "", *[f"- {note}" for note in NOTES], ""]
    md += ["Raw per-split values: the `.json` beside this file; chart: the `.png`.", ""]
    stem = result_stem("learners", args.quick)
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(md) + "\n"
    print(text)
    stem.with_suffix(".md").write_text(text, encoding="utf-8")
    raw = {k: {kk: vv for kk, vv in v.items() if kk != "hist"} for k, v in results.items()}
    stem.with_suffix(".json").write_text(
        json.dumps({"command": command, "machine": info, "seconds": seconds, **raw}, indent=1),
        encoding="utf-8",
    )
    plot(results, stem.with_suffix(".png"))
    print(f"wrote {stem}.md/.json/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
