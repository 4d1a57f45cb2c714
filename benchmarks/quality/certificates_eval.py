"""Do the certificates hold? Certified bound vs the error on data the service never saw.

Protocol (per data set, per split s = 0..S-1; issue 16's benchmark):

1. random stratified 50/50 split (``train_test_split(stratify=y, random_state=seed+s)``),
   features z-scored with the training half's mean/std (as ``benchmarks/table2.py``), fitted
   on the training rows the learner will NOT hold out (found by :func:`routed`), so that no
   part of what is certified depends on the held-out samples;
2. for each holdout fraction ``rho`` in {0.1, 0.2}: a :class:`~service.core.Learner` with the
   library defaults (``copml``, ``normalize="none"``, its default steps), ``holdout=rho``,
   ``seed=seed+s`` and a reservoir window that keeps every held-out sample, is fed the training
   half in the split's (random) order with one ``learn_many``; then ``learner.certificate``
   at ``delta = 0.05`` with ``method="binomial"`` and ``"kl"``, at the served threshold (the
   calibrated EER threshold of the training stream);
3. the **test rates** of the same frozen ``L`` and threshold on the unseen test half: tuples
   built exactly as the certificate builds them
   (:func:`service.core.certificates.tuples.build_tuples`, errors by
   :func:`~service.core.certificates.held_out.tuple_errors`: triplets ``d(a, p) >= d(a, n)``,
   negative pairs ``d <= theta``, positive pairs ``d > theta``), averaged over
   ``--test-draws`` independent tuple draws of the test half (each draw is an unbiased
   estimate of the same class-mix-averaged rate; averaging only lowers its noise);
4. **coverage**: over the splits, the fraction where the bound is >= the test rate, per
   quantity and jointly (the certificate's three bounds hold together with probability
   >= 1 - delta = 0.95); the test rate is itself an estimate (its tuple count is printed), so
   a bound within its noise of the test rate can miss by chance;
5. the **cost of holding out**: 5-NN test error (``benchmarks.quality.common.knn_error``, tie to the
   nearest tied neighbour) on ``transform`` of both halves for ``rho`` = 0, 0.1 and 0.2; the
   5-NN reference set is the whole training half in every case (the held-out samples are still
   the user's labelled data), so the difference is only the metric learned from fewer samples;
6. **PAC-Bayes** (``--pac-bayes`` sets, ``rho = 0``): ``pac_bayes_prefix`` = 20 % of the
   training half (seed 001's prior share), ``pac_bayes_window`` = the rest, the certificate of
   the Gibbs metric and its exact Gibbs test rates on the test tuples at the certificate's
   sigma and grid thresholds (:func:`~service.core.certificates.pac_bayes.gibbs_triplet_error`,
   :func:`~service.core.certificates.pac_bayes.gibbs_accept`); the served metric's test rates
   beside.

Data: the Table II sets that load (``benchmarks/quality/datasets.py``;
``bash benchmarks/quality/get_data.sh``),
scikit-learn's digits, and ``waveform-100k``: Breiman's generator at n = 100,000 (seed 0), the
one set here large enough for ``m >= 1000`` tuples per quantity (issue 16's gap target); its
5-NN cost is not measured (50,000 x 50,000 brute-force neighbours). Sets whose held-out half
cannot form 10 tuples of each kind are reported with what the certificate says is missing.

Run from the repository root (2-5 minutes on 2 shared cores, depending on their load)::

    python -m benchmarks.quality.certificates_eval   # writes benchmarks/results/certificates_eval.*
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.model_selection import train_test_split

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_info
from benchmarks.harness.results import command_line, result_stem, suffixed
from benchmarks.quality.common import (
    FloatArray,
    IntArray,
    knn_error,
    report_head,
    skipped_lines,
    write_report,
    zscore,
)
from benchmarks.quality.datasets import (
    LOADERS,
    load,
    load_digits,
    load_waveform,
    present,
)
from service.core import Learner, LearnerConfig, NotEnoughHeldOut, normalize_rows
from service.core.certificates import QUANTITIES, Method
from service.core.certificates.held_out import tuple_errors
from service.core.certificates.pac_bayes import gibbs_accept, gibbs_triplet_error
from service.core.certificates.tuples import build_tuples
from service.core.holdout import HELD_OUT, MAX_WINDOW

DATASETS = (*LOADERS, "digits", "waveform-100k")
HOLDOUTS = (0.1, 0.2)
CERT_METHODS: tuple[Method, ...] = ("binomial", "kl")
PAC_BAYES_SETS = ("waveform", "optdigits", "digits")
PRIOR_SHARE = 0.2
#: Sets whose 5-NN error is not measured (brute force on the halves is too slow here).
NO_KNN = ("waveform-100k",)
LABELS = {"triplet_error": "triplet error", "false_accept": "FAR", "false_reject": "FRR"}


@functools.cache
def load_set(name: str) -> tuple[FloatArray, IntArray]:
    """A data set by name (parsed once per process; callers must not mutate it)."""
    if name == "digits":
        return load_digits()
    if name == "waveform-100k":
        return load_waveform(n=100_000, seed=0)
    return load(name)


def routed(rho: float, seed: int, y: IntArray) -> NDArray[np.bool_]:
    """Which training rows a learner with ``holdout=rho`` and ``seed`` will hold out: routing
    looks at neither features nor labels, so a dry run of a 1-d learner on zeros finds them.
    The z-score is then fitted on the other rows only, so that nothing the certified pipeline
    uses (scaling, ``L``, threshold) depends on the held-out samples."""
    dry = Learner(LearnerConfig(dim=1, seed=seed, holdout=rho))
    held: NDArray[np.bool_] = dry.learn_many(np.zeros((len(y), 1)), y).codes == HELD_OUT
    return held


def test_rates(
    L: FloatArray, X: FloatArray, y: IntArray, threshold: float, seed: int, draws: int
) -> dict[str, dict[str, float]]:
    """Per quantity, the frozen ``(L, threshold)``'s error rate on disjoint tuples of ``X``
    (built as the certificate builds them), averaged over ``draws`` tuple draws, and the
    tuples per draw."""
    errs: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    sizes: dict[str, int] = {}
    for r in range(draws):
        tuples = build_tuples(y, np.random.default_rng((seed, r)))
        for q, e in tuple_errors(L, X, tuples, threshold).items():
            errs[q].append(float(e.mean()))
            sizes[q] = len(e)
    return {q: {"rate": float(np.mean(errs[q])), "m": sizes[q]} for q in QUANTITIES}


def gibbs_test_rates(
    L: FloatArray, X: FloatArray, y: IntArray, cert: dict[str, Any], seed: int, draws: int
) -> dict[str, float]:
    """Exact Gibbs error rates on the test half of the randomised metric a PAC-Bayes
    certificate certifies: ``L/||L||_F`` plus noise at each quantity's chosen sigma, at the
    grid thresholds the false accept / reject bounds are stated at."""
    Lh = L / np.linalg.norm(L)
    details = cert["details"]
    far_theta, frr_theta = details["false_accept_threshold"], details["false_reject_threshold"]
    out: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for r in range(draws):
        t = build_tuples(y, np.random.default_rng((seed, r)))
        a = X[t.triplets[:, 0]] - X[t.triplets[:, 1]]
        b = X[t.triplets[:, 0]] - X[t.triplets[:, 2]]
        dneg = X[t.negative_pairs[:, 0]] - X[t.negative_pairs[:, 1]]
        dpos = X[t.positive_pairs[:, 0]] - X[t.positive_pairs[:, 1]]
        s3, sa, sr = (float(cert[q]["sigma"]) for q in QUANTITIES)
        out["triplet_error"].append(float(gibbs_triplet_error(Lh, a, b, s3).mean()))
        out["false_accept"].append(float(gibbs_accept(Lh, dneg, far_theta, sa)[1].mean()))
        out["false_reject"].append(float((1.0 - gibbs_accept(Lh, dpos, frr_theta, sr)[0]).mean()))
    return {q: float(np.mean(v)) for q, v in out.items()}


def _bounds(cert: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {
        q: {k: cert[q][k] for k in ("m", "errors", "bound")}  # empirical = errors / m
        for q in QUANTITIES
    }


def _rate(bound: dict[str, float]) -> float:
    return bound["errors"] / bound["m"]


def split_result(name: str, seed: int, delta: float, draws: int, pac_bayes: bool) -> dict[str, Any]:
    """Everything measured on one split of one data set."""
    X, y = load_set(name)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=0.5, stratify=y, random_state=seed, shuffle=True
    )
    n_tr, dim = X_tr.shape
    out: dict[str, Any] = {"knn": {}, "cert": {}}
    for rho in (0.0, *HOLDOUTS):
        held = routed(rho, seed, y_tr)
        X_tr_z, X_te_z = zscore(X_tr[~held], X_tr, X_te)[1:]
        prefix = max(1, round(PRIOR_SHARE * n_tr))
        with_pb = pac_bayes and rho == 0.0
        config = LearnerConfig(
            dim=dim,
            seed=seed,
            holdout=rho,
            holdout_window=min(MAX_WINDOW, n_tr),
            pac_bayes_prefix=prefix,
            pac_bayes_window=min(MAX_WINDOW, n_tr - prefix) if with_pb else 0,
        )
        learner = Learner(config)
        codes = learner.learn_many(X_tr_z, y_tr).codes
        if not np.array_equal(codes == HELD_OUT, held):
            raise RuntimeError("the learner routed other samples than the dry run")
        L = np.array(learner.L)
        key = f"{rho:g}"
        if name not in NO_KNN:
            Z_tr, Z_te = learner.transform(X_tr_z), learner.transform(X_te_z)
            finite = bool(np.isfinite(Z_tr).all() and np.isfinite(Z_te).all())
            out["knn"][key] = knn_error(Z_tr, y_tr, Z_te, y_te) if finite else float("nan")
        X_seen = normalize_rows(X_te_z, config.normalize)  # as the metric sees queries
        if with_pb:
            try:
                pb = learner.certificate(delta=delta, method="pac-bayes").to_dict()
            except NotEnoughHeldOut as exc:
                out["pac_bayes"] = {"needed": exc.needed}
            else:
                out["pac_bayes"] = {
                    "bounds": {q: {**_bounds(pb)[q], "sigma": pb[q]["sigma"]} for q in QUANTITIES},
                    "bound_set": pb["samples"],
                    "prefix": prefix,
                    "threshold": pb["threshold"],
                    "gibbs_test": gibbs_test_rates(L, X_seen, y_te, pb, seed, draws),
                    "served_test": test_rates(L, X_seen, y_te, pb["threshold"], seed, draws),
                }
        if rho == 0.0:
            continue
        entry: dict[str, Any] = {"held_out": len(learner.holdout.reservoir)}
        try:
            certs = {
                method: learner.certificate(delta=delta, method=method).to_dict()
                for method in CERT_METHODS
            }
        except NotEnoughHeldOut as exc:
            entry["needed"] = exc.needed
            out["cert"][key] = entry
            continue
        theta = certs["binomial"]["threshold"]
        entry.update(
            threshold=theta,
            threshold_source=certs["binomial"]["threshold_source"],
            bounds={method: _bounds(c) for method, c in certs.items()},
            test=test_rates(L, X_seen, y_te, theta, seed, draws),
        )
        out["cert"][key] = entry
    return out


def _task(args: tuple[str, int, float, int, bool]) -> tuple[str, int, dict[str, Any]]:
    name, seed, delta, draws, pac_bayes = args
    return name, seed, split_result(name, seed, delta, draws, pac_bayes)


def summarize(per_split: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Means over splits, gaps and coverage counts per data set and holdout."""
    summary: dict[str, dict[str, Any]] = {}
    for name, splits in per_split.items():
        row: dict[str, Any] = {"cert": {}}
        if splits[0]["knn"]:
            row["knn"] = {
                k: (float(np.nanmean(v)), float(np.nanstd(v, ddof=1)) if len(v) > 1 else 0.0)
                for k in splits[0]["knn"]
                for v in [[s["knn"][k] for s in splits]]
            }
        for rho in HOLDOUTS:
            key = f"{rho:g}"
            entries = [s["cert"][key] for s in splits]
            ok = [e for e in entries if "bounds" in e]
            cell: dict[str, Any] = {
                "held_out": float(np.mean([e["held_out"] for e in entries])),
                "certified_splits": len(ok),
                "splits": len(entries),
            }
            if len(ok) < len(entries):
                cell["needed_max"] = max(e["needed"] for e in entries if "needed" in e)
            if ok:
                cell["test_m"] = {q: ok[0]["test"][q]["m"] for q in QUANTITIES}
                cell["test"] = {
                    q: float(np.mean([e["test"][q]["rate"] for e in ok])) for q in QUANTITIES
                }
                cell["threshold_sources"] = sorted({e["threshold_source"] for e in ok})
                for method in CERT_METHODS:
                    per_q: dict[str, Any] = {}
                    joint = np.ones(len(ok), dtype=bool)
                    for q in QUANTITIES:
                        bound = np.array([e["bounds"][method][q]["bound"] for e in ok])
                        test = np.array([e["test"][q]["rate"] for e in ok])
                        held = np.array([_rate(e["bounds"][method][q]) for e in ok])
                        held_ok = bound >= test
                        joint &= held_ok
                        per_q[q] = {
                            "m": float(np.mean([e["bounds"][method][q]["m"] for e in ok])),
                            "empirical": float(held.mean()),
                            "bound": float(bound.mean()),
                            "gap": float((bound - test).mean()),
                            "covered": int(held_ok.sum()),
                        }
                    per_q["joint_covered"] = int(joint.sum())
                    cell[method] = per_q
            row["cert"][key] = cell
        pbs = [s["pac_bayes"] for s in splits if "pac_bayes" in s]
        pb_ok = [p for p in pbs if "bounds" in p]
        if pbs:
            pb_cell: dict[str, Any] = {"certified_splits": len(pb_ok), "splits": len(pbs)}
            if pb_ok:
                joint = np.ones(len(pb_ok), dtype=bool)
                for q in QUANTITIES:
                    bound = np.array([p["bounds"][q]["bound"] for p in pb_ok])
                    gibbs = np.array([p["gibbs_test"][q] for p in pb_ok])
                    joint &= bound >= gibbs
                    pb_cell[q] = {
                        "m": float(np.mean([p["bounds"][q]["m"] for p in pb_ok])),
                        "empirical": float(np.mean([_rate(p["bounds"][q]) for p in pb_ok])),
                        "bound": float(bound.mean()),
                        "gibbs_test": float(gibbs.mean()),
                        "served_test": float(np.mean([p["served_test"][q]["rate"] for p in pb_ok])),
                        "covered": int((bound >= gibbs).sum()),
                    }
                pb_cell["joint_covered"] = int(joint.sum())
                pb_cell["bound_set"] = round(float(np.mean([p["bound_set"] for p in pb_ok])))
            row["pac_bayes"] = pb_cell
        summary[name] = row
    return summary


def overall(summary: dict[str, dict[str, Any]], method: str) -> dict[str, Any]:
    """Coverage pooled over every certified (data set, holdout, split), and the gaps of the
    cells with at least 1000 tuples per quantity (issue 16's target: gap < 0.05 there)."""
    total = joint = 0
    covered = dict.fromkeys(QUANTITIES, 0)
    large: list[dict[str, Any]] = []
    for name, row in summary.items():
        for key, cell in row["cert"].items():
            if not cell["certified_splits"]:
                continue
            res = cell[method]
            total += cell["certified_splits"]
            joint += res["joint_covered"]
            for q in QUANTITIES:
                covered[q] += res[q]["covered"]
            if min(res[q]["m"] for q in QUANTITIES) >= 1000:
                large.append(
                    {"data": name, "holdout": key, **{q: res[q]["gap"] for q in QUANTITIES}}
                )
    return {"certificates": total, "joint_covered": joint, "covered": covered, "large_m": large}


def cert_table(summary: dict[str, dict[str, Any]], method: str) -> list[str]:
    lines = [
        "| data | holdout | held out | m (3 / FA / FR) | quantity | held-out rate | bound "
        "| test rate | bound - test | covered | jointly covered |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        for key, cell in row["cert"].items():
            if not cell["certified_splits"]:
                continue
            res = cell[method]
            ms = " / ".join(f"{res[q]['m']:.0f}" for q in QUANTITIES)
            n_ok = cell["certified_splits"]
            for i, q in enumerate(QUANTITIES):
                r = res[q]
                lines.append(
                    f"| {name if i == 0 else ''} | {key if i == 0 else ''} "
                    f"| {cell['held_out']:.0f} | {ms if i == 0 else ''} | {LABELS[q]} "
                    f"| {r['empirical']:.4f} | {r['bound']:.4f} | {cell['test'][q]:.4f} "
                    f"| {r['gap']:+.4f} | {r['covered']}/{n_ok} "
                    f"| {str(res['joint_covered']) + '/' + str(n_ok) if i == 0 else ''} |"
                )
    return lines


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        (name, key, cell)
        for name, row in summary.items()
        for key, cell in row["cert"].items()
        if cell["certified_splits"]
    ]
    fig, axes = plt.subplots(3, 1, figsize=(max(8.0, 1.0 * len(rows)), 10.0), sharex=True)
    x = np.arange(len(rows))
    for ax, q in zip(axes, QUANTITIES, strict=True):
        test = [c["test"][q] for _, _, c in rows]
        held = [c["binomial"][q]["empirical"] for _, _, c in rows]
        for method, marker, color in (("binomial", "v", "#d62728"), ("kl", "1", "#ff7f0e")):
            ax.scatter(
                x,
                [c[method][q]["bound"] for _, _, c in rows],
                marker=marker,
                color=color,
                s=60,
                label=f"bound ({method})",
                zorder=3,
            )
        ax.scatter(
            x,
            held,
            marker="o",
            facecolors="none",
            edgecolors="#7f7f7f",
            label="held-out rate",
            zorder=2,
        )
        ax.scatter(x, test, marker="o", color="#1f77b4", label="test rate (unseen)", zorder=4)
        ax.set_ylabel(f"{LABELS[q]} (mean over splits)")
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(x)
    axes[-1].set_xticklabels(
        [f"{n}\nholdout {k}\n{c['certified_splits']}/{c['splits']} splits" for n, k, c in rows],
        fontsize=7,
    )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, 0.97))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--splits", type=int, default=30)
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated names")
    parser.add_argument("--pac-bayes", default=",".join(PAC_BAYES_SETS), help="sets for PAC-Bayes")
    parser.add_argument("--seed", type=int, default=0, help="split s uses random_state seed+s")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--test-draws", type=int, default=20, help="tuple draws of the test half")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, default=result_stem("certificates_eval"))
    quick = {"splits": 2, "datasets": "iris,wine,digits", "pac_bayes": "digits", "test_draws": 5,
             "out": result_stem("certificates_eval", quick=True)}  # fmt: skip
    args = parse(parser, argv, quick)

    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    pb_names = {n.strip() for n in args.pac_bayes.split(",") if n.strip()}
    available, skipped = present(names, load_set)
    tasks = [
        (name, args.seed + s, args.delta, args.test_draws, name in pb_names)
        for name in available
        for s in range(args.splits)
    ]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(_task, tasks))
    else:
        results = [_task(task) for task in tasks]
    elapsed = time.perf_counter() - t0
    per_split: dict[str, list[dict[str, Any]]] = {name: [] for name in available}
    for name, _, res in sorted(results, key=lambda r: (available.index(r[0]), r[1])):
        per_split[name].append(res)
    summary = summarize(per_split)
    info = machine_info()
    command = command_line("benchmarks.quality.certificates_eval")
    shapes = {}
    for name in available:
        X, y = load_set(name)
        shapes[name] = (X.shape[0], X.shape[1], int(np.unique(y).size))

    md = report_head(
        "# Certificates against unseen data: certified bound vs test error",
        "certificates_eval.py",
        command,
        info,
        elapsed,
        args.jobs,
        remark=" (protocol in its docstring)",
    )
    md += [
        f"Per data set, {args.splits} random stratified 50/50 splits (random_state = "
        f"{args.seed} + split), z-score fitted on the training rows the learner does not "
        "hold out; a `Learner` with the library defaults (copml, normalize none) and "
        "`holdout` = 0.1 or 0.2 streams the "
        f"training half; `certificate(delta={args.delta:g})` at the served threshold; test rates "
        "of the same L and threshold on the test half with the certificate's own tuple rule, "
        f"averaged over {args.test_draws} tuple draws. The three bounds of one certificate hold "
        f"together with probability >= {1 - args.delta:g} (each at delta/3). Covered: splits "
        "where bound >= test rate (each bound alone misses with probability <= delta/3; the "
        "test rate is itself an estimate, its tuple count is listed below). Rates and bounds "
        "are means over the certified splits.",
        "",
    ]
    for method in CERT_METHODS:
        md += [f"## Held-out certificate, method `{method}`", "", *cert_table(summary, method), ""]
    md += ["## Verdict", ""]
    verdict: dict[str, Any] = {}
    for method in CERT_METHODS:
        v = verdict[method] = overall(summary, method)
        n = v["certificates"]
        if not n:
            continue
        per_q = ", ".join(f"{LABELS[q]} {v['covered'][q]}/{n}" for q in QUANTITIES)
        md.append(
            f"- `{method}`: all three bounds held together in {v['joint_covered']}/{n} "
            f"certificates ({v['joint_covered'] / n:.1%}; the guarantee is >= "
            f"{1 - args.delta:.0%}); per quantity: {per_q}."
        )
        for cell in v["large_m"]:
            gaps = ", ".join(f"{LABELS[q]} {cell[q]:+.4f}" for q in QUANTITIES)
            below = all(cell[q] < 0.05 for q in QUANTITIES)
            md.append(
                f"  - m >= 1000 ({cell['data']}, holdout {cell['holdout']}): mean bound - "
                f"test rate {gaps}: {'under' if below else 'NOT under'} 0.05 (issue target)."
            )
    md += [
        "",
        "Seed 001's certificates (CIFAR-10 probabilistic CNNs, e.g. 0.21 on the N = 3 tuple "
        "error) bound a stochastic network's error with a PAC-Bayes bound; the held-out bounds "
        "here bound the deterministic served linear metric and threshold, so the numbers are "
        "not comparable, only the kind of statement is.",
        "",
        "Test tuples per draw (3 / FA / FR) and threshold source:",
        "",
    ]
    for name, row in summary.items():
        for key, cell in row["cert"].items():
            if cell["certified_splits"]:
                tm = " / ".join(str(cell["test_m"][q]) for q in QUANTITIES)
                md.append(
                    f"- {name} {key}: {tm} tuples per draw; threshold "
                    f"{', '.join(cell['threshold_sources'])}"
                )
    md.append("")
    not_certified = [
        (name, key, cell)
        for name, row in summary.items()
        for key, cell in row["cert"].items()
        if cell["certified_splits"] < cell["splits"]
    ]
    if not_certified:
        md += [
            "Not certified (the held-out samples form fewer than 10 tuples of some kind; the "
            "certificate answers `NotEnoughHeldOut`, the service 409):",
            "",
        ]
        md += [
            f"- {name} (n = {shapes[name][0]}, c = {shapes[name][2]}) holdout {key}: "
            f"{cell['held_out']:.0f} held out on average, "
            f"{cell['splits'] - cell['certified_splits']}/{cell['splits']} splits refused, "
            f"up to {cell['needed_max']} more samples needed"
            for name, key, cell in not_certified
        ]
        md.append("")
    md += [
        "## Cost of holding out: 5-NN test error",
        "",
        "5-NN on `transform` of both halves, the whole training half as reference set; mean ± "
        "std over splits. holdout 0 is the learner trained on the whole training half.",
        "",
        "| data | n | d | c | holdout 0 | 0.1 | 0.2 | 0.2 - 0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        if "knn" not in row:
            continue
        k = row["knn"]
        n, d, c = shapes[name]
        md.append(
            f"| {name} | {n} | {d} | {c} | "
            + " | ".join(f"{k[key][0]:.3f} ± {k[key][1]:.3f}" for key in ("0", "0.1", "0.2"))
            + f" | {k['0.2'][0] - k['0'][0]:+.3f} |"
        )
    md.append("")
    pb_rows = [(n, r["pac_bayes"]) for n, r in summary.items() if "pac_bayes" in r]
    if pb_rows:
        md += [
            "## PAC-Bayes (no samples held out)",
            "",
            f"`holdout = 0`, `pac_bayes_prefix` = {PRIOR_SHARE:.0%} of the training half, "
            "`pac_bayes_window` = the rest (the bound set). It certifies the RANDOMISED metric "
            "`L/||L||_F + sigma E`; its test rate is the exact Gibbs error on the test tuples at "
            "the certificate's sigma (and, for FAR / FRR, at the grid thresholds the bound is "
            "stated at). The served deterministic metric's test rate is beside, for reference "
            "(not what is certified).",
            "",
            "| data | bound set | quantity | m | Gibbs rate (bound set) | bound | Gibbs test "
            "rate | covered | served test rate | jointly covered |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, cell in pb_rows:
            n_ok = cell["certified_splits"]
            if not n_ok:
                md.append(f"| {name} | not certified in any split | | | | | | | | |")
                continue
            for i, q in enumerate(QUANTITIES):
                r = cell[q]
                md.append(
                    f"| {name if i == 0 else ''} | {cell['bound_set'] if i == 0 else ''} "
                    f"| {LABELS[q]} | {r['m']:.0f} | {r['empirical']:.4f} | {r['bound']:.4f} "
                    f"| {r['gibbs_test']:.4f} | {r['covered']}/{n_ok} | {r['served_test']:.4f} "
                    f"| {str(cell['joint_covered']) + '/' + str(n_ok) if i == 0 else ''} |"
                )
        md.append("")
    md += skipped_lines(skipped)
    write_report(
        args.out,
        md,
        notes=(),
        files=f"Raw per-split numbers: `{args.out.name}.json`. Chart: `{args.out.name}.png` "
        "(means over splits: binomial and kl bounds, held-out rate, test rate).",
        command=command,
        info=info,
        settings={
            "splits": args.splits,
            "seed": args.seed,
            "delta": args.delta,
            "holdouts": HOLDOUTS,
            "methods": CERT_METHODS,
            "test_draws": args.test_draws,
            "pac_bayes_sets": sorted(pb_names & set(available)),
            "prior_share": PRIOR_SHARE,
            "learner": "LearnerConfig defaults (copml, normalize none)",
        },
        shapes=shapes,
        summary=summary,
        verdict=verdict,
        skipped=skipped,
        seconds=elapsed,
        per_split=per_split,
    )
    print("\n".join(md))
    plot(
        summary,
        suffixed(args.out, ".png"),
        f"certified bound (delta {args.delta:g}) vs unseen test rate, {args.splits} splits",
    )
    print(f"wrote {args.out}.md/.json/.png ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
