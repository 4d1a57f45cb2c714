#!/usr/bin/env python3
"""Bootstrap and run opml-service with nothing but Python 3.11+.

    python3 dev.py serve [options]   # create .venv if needed, install, run the service
    python3 dev.py test [pytest args]  # same venv plus test extras; ruff, mypy, then pytest
    python3 dev.py bench [NAME [--quick]]  # benchmark extras; run one (--list names them)
    python3 dev.py docs [--serve]    # build the docs site into site/ (mkdocs --strict), or serve it

The virtual environment lives in ``.venv``. Each extra (the base install, ``test``, ``bench``)
is installed once per content of ``pyproject.toml``: ``.venv/.opml-stamp`` records, for each
one installed, the hash of the ``pyproject.toml`` it was installed from, so switching between
the commands installs nothing once every extra they need is there (an edit of
``pyproject.toml`` installs again, once). Arguments after the command are passed on: to the
service (``python3 dev.py serve --help`` lists its options) or to pytest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".opml-stamp"
#: The extras each command needs ("base": the project itself).
EXTRAS = {
    "serve": ("base",),
    "test": ("base", "test"),
    "bench": ("base", "test", "bench"),
    "docs": ("base", "docs"),
}


def say(message: str) -> None:
    print(f"dev.py: {message}", file=sys.stderr, flush=True)


def installed(stamp: str, digest: str) -> set[str]:
    """The extras a stamp records as installed from the ``pyproject.toml`` hashed ``digest``.

    >>> sorted(installed("base abc\\ntest abc\\nbench old\\n", "abc"))
    ['base', 'test']
    """
    done = dict(line.split(" ", 1) for line in stamp.splitlines() if " " in line)
    return {extra for extra, recorded in done.items() if recorded == digest}


def ensure_venv(wanted: tuple[str, ...]) -> None:
    """Install the project with the ``wanted`` extras unless the stamp says they are there."""
    if sys.version_info < (3, 11):  # noqa: UP036 -- this script may run on an older python3
        sys.exit("opml-service needs Python 3.11 or newer")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamp = STAMP.read_text() if STAMP.exists() else ""
    have = installed(stamp, digest) if PY.exists() else set()
    if set(wanted) <= have:
        return
    started = time.monotonic()
    if not PY.exists():
        say(f"creating the virtual environment {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    extras = ",".join(e for e in wanted if e != "base")
    target = f"{ROOT}[{extras}]" if extras else str(ROOT)
    say(
        f"installing opml-service{f' [{extras}]' if extras else ''} and its dependencies into "
        ".venv (a minute or two the first time; once per change of pyproject.toml) ..."
    )
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", target], check=True)
    records = dict(line.split(" ", 1) for line in stamp.splitlines() if " " in line)
    records.update({extra: digest for extra in wanted})
    STAMP.write_text("".join(f"{e} {d}\n" for e, d in sorted(records.items())))
    say(f"installed in {time.monotonic() - started:.0f} s")


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
    if command == "bench":  # benchmarks/__main__.py: the runner and its --list
        if not rest:
            say("benchmark extras installed; `python3 dev.py bench --list` lists the benchmarks")
            return 0
        return run([str(PY), "-m", "benchmarks", *rest])
    if command == "docs":
        # The reference pages are generated from the code first; mkdocs then builds offline.
        code = run([str(PY), "docs/gen_reference.py"])
        if code != 0:
            return code
        os.environ["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs' banner about its successor
        if rest[:1] == ["--serve"]:  # port 8001: the service itself uses 8000
            return run([str(PY), "-m", "mkdocs", "serve", "-a", "127.0.0.1:8001", *rest[1:]])
        return run([str(PY), "-m", "mkdocs", "build", "--strict", "--site-dir", "site", *rest])
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
