"""``dev.py`` as a newcomer runs it, on a small project of its own (a copy of ``dev.py``, a
``pyproject.toml`` with the same extras and a ``service`` that prints its arguments): each extra
is installed once per content of ``pyproject.toml``, whatever the order of the commands, and the
arguments after ``serve`` reach the service."""

from __future__ import annotations

import doctest
import shutil
import subprocess
import sys
from pathlib import Path

import dev
from tests.service.support import ROOT

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "devpy-probe"
version = "0.1.0"
requires-python = ">=3.11"

[project.optional-dependencies]
test = []
bench = []

[tool.setuptools.packages.find]
include = ["service*"]
"""


def test_dev_doctests() -> None:
    assert doctest.testmod(dev).failed == 0


def dev_py(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "dev.py", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_each_extra_is_installed_once_per_pyproject_and_serve_passes_its_arguments(
    tmp_path: Path,
) -> None:
    project = tmp_path / "probe"
    (project / "service").mkdir(parents=True)
    shutil.copy(ROOT / "dev.py", project / "dev.py")
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "service" / "__init__.py").write_text("")
    (project / "service" / "__main__.py").write_text("import sys\nprint('served', sys.argv[1:])\n")

    bench = dev_py(project, "bench")
    assert bench.returncode == 0, bench.stderr
    assert "dev.py: installing opml-service [test,bench]" in bench.stderr
    assert "dev.py: installed in" in bench.stderr

    served = dev_py(project, "serve", "--port", "18433")
    assert served.returncode == 0, served.stderr
    assert "installing" not in served.stderr  # base came with bench: nothing to install
    assert served.stdout.strip() == "served ['--port', '18433']"

    (project / "pyproject.toml").write_text(PYPROJECT + "# changed\n")
    changed = dev_py(project, "serve")
    assert changed.stderr.count("dev.py: installing opml-service and its dependencies") == 1
    again = dev_py(project, "serve")
    assert "installing" not in again.stderr and again.stdout.strip() == "served []"
    bench = dev_py(project, "bench")  # its extras were installed from the old pyproject.toml
    assert "dev.py: installing opml-service [test,bench]" in bench.stderr
    assert "installing" not in dev_py(project, "bench").stderr
