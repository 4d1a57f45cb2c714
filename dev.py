#!/usr/bin/env python3
"""Bootstrap and run opml-service with nothing but Python 3.11+.

    python3 dev.py serve     # create .venv if needed, install, run the service (embedded Redis)
    python3 dev.py test      # same venv plus test extras; ruff, mypy, then pytest
    python3 dev.py bench     # install the benchmark extras; then run scripts in benchmarks/

The virtual environment lives in ``.venv``; it is re-installed whenever
``pyproject.toml`` changes (a hash of it is kept in ``.venv/.opml-stamp``).
Extra arguments after the command are passed on (to the service or to pytest).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
EXTRAS = {"serve": "", "test": "[test]", "bench": "[test,bench]"}


def ensure_venv(extras: str) -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 -- this script may run on an older python3
        sys.exit("opml-service needs Python 3.11 or newer")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    stamp = VENV / ".opml-stamp"
    wanted = set(extras.strip("[]").split(",")) - {""}
    if stamp.exists():
        done = dict(line.split(" ", 1) for line in stamp.read_text().splitlines() if " " in line)
        if all(done.get(e) == digest for e in wanted | {"base"}):
            return
    if not PY.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", f"{ROOT}{extras}"], check=True)
    stamp.write_text("".join(f"{e} {digest}\n" for e in sorted(wanted | {"base"})))


def run(cmd: list[str]) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in EXTRAS:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    ensure_venv(EXTRAS[command])
    if command == "serve":
        os.execv(str(PY), [str(PY), "-m", "service", *rest])
    if command == "bench":
        return 0
    for check in (
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "mypy")],
        [str(PY), "-m", "pytest", *rest],
    ):
        code = run(check)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
