"""Stream scikit-learn's digits into a model with the SDK; print the verification AUC of
held-out pairs before and after learning, and plot their ROC.

    python3 dev.py bench                                            # scikit-learn, matplotlib
    .venv/bin/opml serve --port 8765 --data-dir /tmp/opml-example &
    .venv/bin/python examples/digits_roc.py --url http://127.0.0.1:8765   # writes the .png here

Needs scikit-learn (the data set and the ROC); matplotlib draws the plot and is optional (the
AUCs are printed without it). The model is deleted first if it exists, so the script can be
rerun; every run prints the same figures (seeded split, pairs and model).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util

import numpy as np
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score, roc_curve

from clients import NotFound, OPMLClient, Progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="digits-example")
    parser.add_argument("--out", default="examples/digits_roc.png")
    args = parser.parse_args()

    X, y = load_digits(return_X_y=True)  # 1797 x 64, 10 classes, ships inside scikit-learn
    rng = np.random.default_rng(0)
    order = rng.permutation(len(X))
    train, test = order[:1400], order[1400:]
    pairs = rng.integers(0, len(test), size=(3000, 2))
    A, B = X[test][pairs[:, 0]], X[test][pairs[:, 1]]
    same = y[test][pairs[:, 0]] == y[test][pairs[:, 1]]

    with OPMLClient(args.url) as client:
        with contextlib.suppress(NotFound):
            client.delete_model(args.model)
        # l2-normalised inputs; step "scaled" (the default): gamma in units of the typical
        # squared difference of the stream
        client.create_model(
            args.model, 64, algorithm="copml", gamma=0.1, gamma_pair=0.1, normalize="l2", seed=0
        )

        def scores() -> np.ndarray:
            # ||L(a - b)||^2 = ||z_a - z_b||^2 with z = x L^T (normalisation included)
            diff = client.transform(args.model, A).z - client.transform(args.model, B).z
            return -np.einsum("ij,ij->i", diff, diff)  # higher = more similar

        before = scores()  # L = I: Euclidean distance of the normalised digits

        def report(p: Progress) -> None:
            print(f"\racked {p.acked_samples} samples ({p.samples_per_s:.0f}/s)", end="")

        with client.stream(args.model, window=16, on_progress=report) as stream:
            for lo in range(0, len(train), 50):
                rows = train[lo : lo + 50]
                stream.send(X[rows], y[rows])
        print()
        client.metric(args.model, min_version=len(train))  # wait until all are applied
        after = scores()

    curves = {"before (Euclidean)": before, "after OPML stream": after}
    for name, s in curves.items():
        print(f"{name}: AUC {roc_auc_score(same, s):.3f}")
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed (python3 dev.py bench installs it): no plot")
        return
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    plt.figure(figsize=(5, 5))
    for name, s in curves.items():
        fpr, tpr, _ = roc_curve(same, s)
        plt.plot(fpr, tpr, label=f"{name}, AUC {roc_auc_score(same, s):.3f}")
    plt.plot([0, 1], [0, 1], ":", color="grey")
    plt.xlabel("false accept rate")
    plt.ylabel("true accept rate")
    plt.title(f"digits: verification of {len(same)} held-out pairs")
    plt.legend(loc="lower right")
    plt.tight_layout()
    plt.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
