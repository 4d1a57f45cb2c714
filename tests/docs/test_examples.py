"""``examples/digits_roc.py``, run as examples/README.md says, prints the AUCs that page
reports, against an ``opml serve`` of its own (the page's ``serve`` line, on a free port)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.support import served
from tests.service.support import ROOT, free_port


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    with served(address, tmp_path / "serve.log", "--port", str(port), "--data-dir", str(tmp_path)):
        yield address


def test_examples_readme_command_prints_its_numbers(url: str, tmp_path: Path) -> None:
    readme = (ROOT / "examples" / "README.md").read_text()
    assert ".venv/bin/python examples/digits_roc.py --url http://127.0.0.1:8765" in readme
    expected = re.findall(r"`((?:before \(Euclidean\)|after OPML stream): AUC [0-9.]+)`", readme)
    assert len(expected) == 2
    done = subprocess.run(
        [sys.executable, "examples/digits_roc.py", "--url", url, "--out", str(tmp_path / "r.png")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    printed = [line for line in done.stdout.split("\n") if ": AUC " in line]
    assert printed == expected
