"""What importing the SDK and starting the command line load (each in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys


def loaded(code: str) -> list[str]:
    """The heavy modules loaded once ``code`` has run (it may exit through argparse)."""
    probe = (
        "import atexit, json, sys\n"
        "heavy = ('numba', 'scipy', 'sklearn', 'numpy', 'httpx', 'websockets')\n"
        "atexit.register(lambda: print(json.dumps(sorted(m for m in heavy if m in sys.modules))))\n"
        + code
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return names


def test_import_clients_loads_neither_numba_nor_scipy() -> None:
    """The SDK does not pay for the algorithm core (~1 s) unless ``to_sklearn`` is called."""
    assert loaded("import clients\nfrom clients import OPMLClient, AsyncOPMLClient") == [
        "httpx",
        "numpy",
        "websockets",
    ]


def test_opml_help_and_usage_errors_load_no_client_library() -> None:
    """``opml --help`` (and a mistyped command) answers without httpx, websockets, numpy."""
    for argv in (["--help"], ["serve", "--help"], ["models", "frobnicate"]):
        call = f"main({argv!r})"
        run = f"from clients.cli import main\ntry:\n    {call}\nexcept SystemExit:\n    pass"
        assert loaded(run) == [], argv
