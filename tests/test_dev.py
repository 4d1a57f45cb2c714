"""``dev.py`` as a newcomer runs it, on a small project of its own (a copy of ``dev.py``, a
server and an SDK distribution with their ``pyproject.toml`` files, a lock, a ``service`` that
prints its arguments): the locked environment is installed once per content of the lock and the
``pyproject.toml`` files, a lock older than the dependency tables stops every command, and a
mistyped command is named. Also: the repository's own lock is up to date and installed."""

from __future__ import annotations

import doctest
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dev

SERVER = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "devpy-probe"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = []

[project.optional-dependencies]
test = []

[tool.setuptools.packages.find]
include = ["service*"]
"""

CLIENT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "devpy-probe-client"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = []

[tool.setuptools]
package-dir = { "clients" = "." }
packages = ["clients"]
"""


def test_dev_doctests() -> None:
    assert doctest.testmod(dev).failed == 0


def dev_py(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "dev.py", *args], cwd=project, capture_output=True, text=True, timeout=600
    )


def write_lock(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock of the probe (it has no dependencies: only the header and its inputs digest)."""
    monkeypatch.setattr(dev, "PROJECTS", (project / "clients", project))
    (project / "requirements").mkdir(exist_ok=True)
    (project / "requirements" / "dev.lock").write_text(
        f"# python3 dev.py lock\n{dev.INPUTS}{dev.inputs_digest()}\n"
    )


def test_the_locked_environment_is_installed_once_per_lock_and_pyproject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "probe"
    (project / "service").mkdir(parents=True)
    (project / "clients").mkdir()
    shutil.copy(dev.ROOT / "dev.py", project / "dev.py")
    (project / "pyproject.toml").write_text(SERVER)
    (project / "clients" / "pyproject.toml").write_text(CLIENT)
    (project / "clients" / "__init__.py").write_text("")
    (project / "service" / "__init__.py").write_text("")
    (project / "service" / "__main__.py").write_text("import sys\nprint('served', sys.argv[1:])\n")
    write_lock(project, monkeypatch)

    served = dev_py(project, "serve", "--port", "18433")
    assert served.returncode == 0, served.stderr
    assert "dev.py: installing the locked environment" in served.stderr
    assert served.stdout.strip() == "served ['--port', '18433']"
    probe = [str(project / ".venv" / "bin" / "python"), "-c", "import clients, service"]
    assert subprocess.run(probe, cwd=tmp_path).returncode == 0  # both distributions installed
    again = dev_py(project, "bench")  # one environment for every command: nothing to install
    assert again.returncode == 0 and "installing" not in again.stderr

    (project / "pyproject.toml").write_text(SERVER + "# a comment, no dependency changed\n")
    changed = dev_py(project, "serve")
    assert changed.stderr.count("dev.py: installing the locked environment") == 1
    assert "installing" not in dev_py(project, "serve").stderr

    (project / "pyproject.toml").write_text(SERVER.replace("test = []", "test = []\ndocs = []"))
    stale = dev_py(project, "serve")
    assert stale.returncode == 1 and "run python3 dev.py lock" in stale.stderr
    assert "installing" not in stale.stderr and "served" not in stale.stdout


def test_an_unknown_command_is_named_with_the_commands() -> None:
    typo = subprocess.run(
        [sys.executable, str(dev.ROOT / "dev.py"), "start"], capture_output=True, text=True
    )
    assert typo.returncode == 2
    assert "dev.py: unknown command 'start'; the commands are serve, test, bench, docs, lock" in (
        typo.stderr
    )
    helped = subprocess.run(
        [sys.executable, str(dev.ROOT / "dev.py"), "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0 and "python3 dev.py test --quick" in helped.stdout


def locked_pins() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", dev.LOCK.read_text(), flags=re.MULTILINE)
    return {name.lower().replace("_", "-"): version for name, version in pins}


def test_the_lock_is_compiled_from_the_current_dependency_tables() -> None:
    assert dev.locked_digest(dev.LOCK.read_text()) == dev.inputs_digest(), (
        "requirements/dev.lock is older than the dependency tables of pyproject.toml and "
        "clients/pyproject.toml: run python3 dev.py lock"
    )
    entries = dev.LOCK.read_text().split("\n" + "\\\n")
    assert all("--hash=sha256:" in chunk for chunk in entries if "==" in chunk)


def test_this_environment_is_the_lock() -> None:
    """What the tests run on is what the lock pins (dev.py installed it)."""
    pins = locked_pins()
    assert {"fastapi", "redis", "numpy", "pytest", "httpx"} <= pins.keys()
    installed = {
        d.metadata["Name"].lower().replace("_", "-"): d.version
        for d in importlib.metadata.distributions()
    }
    wrong = {name: (pin, installed.get(name)) for name, pin in pins.items()
             if installed.get(name) != pin}  # fmt: skip
    assert not wrong, f"installed versions differ from requirements/dev.lock: {wrong}"
