#!/usr/bin/env python3
"""Bootstrap and run opml-service with nothing but Python 3.11+.

    python3 dev.py serve [options]      # create .venv if needed, install, run the service
    python3 dev.py test [pytest args]   # ruff, mypy, then the whole suite (its 15 slowest named)
    python3 dev.py test --quick [args]  # ruff, mypy, then the quick tier (well under 2 minutes)
    python3 dev.py bench [NAME [--quick]]  # run a benchmark (``bench --list`` names them)
    python3 dev.py docs [--serve]       # build the docs site (mkdocs --strict) or serve it
    python3 dev.py lock [pip-compile args]  # refresh requirements/dev.lock (e.g. --upgrade)

The virtual environment lives in ``.venv``, installed from the lock file
``requirements/dev.lock``: every package of the development environment (the server's and the
SDK's dependencies and every extra of ``pyproject.toml``: test, bench, ...) pinned with its
hashes (``pip install --require-hashes``), then the two distributions of this repository, the
SDK (``clients/``, opml-client) and the server (``.``, opml-service), editable and without
dependencies. One environment serves every command, and CI tests exactly what the lock says.
``.venv/.opml-stamp`` records the hash of the lock and of both ``pyproject.toml`` files, so
nothing is installed again until one of them changes.

The lock is pip-tools' (``pip-compile --generate-hashes --all-extras``) rather than uv's: it is
a plain requirements file that pip itself installs, so the bootstrap needs nothing but Python
(only ``lock`` installs pip-tools). It records a digest of the dependency tables it was compiled
from; after an edit of those tables (a new dependency or extra) every command stops and asks for
``python3 dev.py lock``, which puts the change in the lock (keeping every other pin unless
``--upgrade`` is passed on).

Both tiers run on one pytest-xdist worker per core (at most four; ``-n 0`` runs them in one
process). The quick tier is the tests marked ``quick`` (``pytest -m quick``): the algorithm
core's tests (``tests/core``), the in-process contract tests (``tests/contract``: the app
called through httpx's ASGI transport on a real redis-server, parsing included) and the SDK's
doctests; the marker is given by directory in ``tests/conftest.py``. Arguments after the
command are passed on: to the service (``python3 dev.py serve --help`` lists its options), to
pytest, or to pip-compile.
"""

from __future__ import annotations

import hashlib
import json
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
LOCK = ROOT / "requirements" / "dev.lock"
#: The distributions of this repository, as pip installs them (the SDK first: the server's
#: tests import it).
PROJECTS = (ROOT / "clients", ROOT)
COMMANDS = ("serve", "test", "bench", "docs", "lock")
#: The line of the lock that records what it was compiled from.
INPUTS = "# inputs-sha256: "


def say(message: str) -> None:
    print(f"dev.py: {message}", file=sys.stderr, flush=True)


def dependency_tables(pyproject: str) -> dict[str, object]:
    """What a lock depends on in a ``pyproject.toml``: its name, Python and dependency tables.

    >>> dependency_tables('[project]\\nname = "x"\\ndependencies = ["a>=1"]\\n')["dependencies"]
    ['a>=1']
    """
    import tomllib  # 3.11+: imported after the version check

    project = tomllib.loads(pyproject).get("project", {})
    keys = ("name", "requires-python", "dependencies", "optional-dependencies")
    return {key: project.get(key) for key in keys}


def inputs_digest() -> str:
    """The digest of the dependency tables of every ``pyproject.toml`` the lock covers."""
    tables = [dependency_tables((p / "pyproject.toml").read_text()) for p in PROJECTS]
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def locked_digest(lock: str) -> str | None:
    """The inputs digest a lock file records (None: none).

    >>> locked_digest("# header\\n# inputs-sha256: abc\\nx==1\\n")
    'abc'
    """
    for line in lock.splitlines():
        if line.startswith(INPUTS):
            return line[len(INPUTS) :].strip()
    return None


def environment_digest() -> str:
    """What the installed environment was made from: the lock and both ``pyproject.toml``."""
    h = hashlib.sha256(LOCK.read_bytes())
    for project in PROJECTS:
        h.update((project / "pyproject.toml").read_bytes())
    return h.hexdigest()


def create_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 -- this script may run on an older python3
        sys.exit("opml-service needs Python 3.11 or newer")
    if not PY.exists():
        say(f"creating the virtual environment {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)


def ensure_venv() -> None:
    """Install the locked environment and this repository's two distributions, unless the
    stamp says that exactly this lock and these ``pyproject.toml`` files are installed."""
    create_venv()
    if not LOCK.exists():
        sys.exit(f"dev.py: {LOCK.relative_to(ROOT)} is missing: run python3 dev.py lock")
    if locked_digest(LOCK.read_text()) != inputs_digest():
        sys.exit(
            f"dev.py: {LOCK.relative_to(ROOT)} was compiled from other dependencies than the "
            "pyproject.toml files declare now: run python3 dev.py lock"
        )
    digest = environment_digest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        return
    started = time.monotonic()
    say(
        f"installing the locked environment ({LOCK.relative_to(ROOT)}) and opml-service into "
        ".venv (a minute or two the first time; once per change of the lock) ..."
    )
    pip = [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--require-hashes", "-r", str(LOCK)], check=True)
    editable = [arg for project in PROJECTS for arg in ("-e", str(project))]
    subprocess.run([*pip, "--no-deps", *editable], check=True)
    STAMP.write_text(digest + "\n")
    say(f"installed in {time.monotonic() - started:.0f} s")


def lock(args: list[str]) -> int:
    """Compile ``requirements/dev.lock`` with pip-tools (installed into .venv if missing)."""
    create_venv()
    if not (BIN / "pip-compile").exists():
        say("installing pip-tools into .venv (for the lock only)")
        subprocess.run(
            [str(PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "pip-tools>=7.4"],
            check=True,
        )  # fmt: skip
    LOCK.parent.mkdir(exist_ok=True)
    cmd = [
        str(BIN / "pip-compile"), "--quiet", "--generate-hashes", "--all-extras",
        "--strip-extras", "--allow-unsafe", "--no-emit-index-url", "--no-emit-find-links",
        "--newline", "LF",
        "--output-file", str(LOCK.relative_to(ROOT)),
        *args,
        *(str((p / "pyproject.toml").relative_to(ROOT)) for p in PROJECTS),
    ]  # fmt: skip
    print("+", " ".join(cmd), flush=True)
    env = {**os.environ, "CUSTOM_COMPILE_COMMAND": "python3 dev.py lock"}  # the lock's header
    code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    if code != 0:
        return code
    text = LOCK.read_text()
    lines = [line for line in text.splitlines() if not line.startswith(INPUTS)]
    end = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    lines.insert(end, f"{INPUTS}{inputs_digest()}")
    LOCK.write_text("\n".join(lines) + "\n")
    say(f"wrote {LOCK.relative_to(ROOT)}")
    return 0


def run(cmd: list[str]) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


#: Most pytest-xdist workers ``test`` starts: the tests mostly wait on the Redis servers and
#: service processes they start, so two workers on two cores finish in about two thirds of the
#: time of one; more than four only add contention.
MAX_WORKERS = 4


def pytest_args(rest: list[str], cpus: int | None = None) -> list[str]:
    """pytest's arguments for ``test [args]``: ``--quick`` selects the quick tier; the whole
    suite names its 15 slowest tests. Both run on one pytest-xdist worker per core (at most
    :data:`MAX_WORKERS`) unless the arguments choose (``-n 0``: one process, e.g. for
    ``--pdb``).

    >>> pytest_args(["--quick", "-x"], cpus=2), pytest_args(["tests/core"], cpus=8)
    (['-n', '2', '-m', 'quick', '-x'], ['-n', '4', '--durations=15', 'tests/core'])
    >>> pytest_args(["-n", "0", "tests/core"], cpus=2), pytest_args([], cpus=1)
    (['--durations=15', '-n', '0', 'tests/core'], ['--durations=15'])
    """
    if cpus is None:  # the cores this process may use (a container's share, not the host's)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        cpus = cpus or os.cpu_count() or 1
    chosen = any(
        arg.startswith(("-n", "--numprocesses", "--dist")) or arg.endswith("no:xdist")
        for arg in rest
    )
    workers = [] if chosen or cpus < 2 else ["-n", str(min(cpus, MAX_WORKERS))]
    if "--quick" in rest:
        return [*workers, "-m", "quick", *(arg for arg in rest if arg != "--quick")]
    return [*workers, "--durations=15", *rest]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        say(f"unknown command {command!r}; the commands are {', '.join(COMMANDS)}")
        print(__doc__, file=sys.stderr)
        return 2
    if command == "lock":
        return lock(rest)
    ensure_venv()
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
        [str(PY), "-m", "pytest", *pytest_args(rest)],
    ):
        code = run(check)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
