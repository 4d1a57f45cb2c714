"""The SDK and CLI examples of README.md and examples/README.md run as written, against an
``opml serve`` of their own (default limits, embedded Redis), and print what the docs say."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.clients.conftest import OPML, served
from tests.service.support import ROOT, free_port


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("docs")
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    with served(address, tmp / "serve.log", "--port", str(port), "--data-dir", str(tmp / "d")):
        yield address


def fenced(markdown: str, heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading``."""
    section = markdown[markdown.index(f"\n{heading}\n") :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert match is not None, heading
    return match.group(1)


def test_readme_sdk_example(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = fenced((ROOT / "README.md").read_text(), "### SDK", "python")
    assert '"http://127.0.0.1:8000"' in code
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace("http://127.0.0.1:8000", url), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "600"
    same, squared, source = lines[1].split()
    assert same in ("True", "False") and float(squared) >= 0 and source == "calibrated"
    assert np.load(tmp_path / "L.npy").shape == (3, 3)


def test_readme_cli_example(url: str, tmp_path: Path) -> None:
    """Each command of the README's CLI block, as written, with ``$OPML_URL`` set to this
    test's service (the first line, ``serve``, is what the fixture runs on another port)."""
    lines = fenced((ROOT / "README.md").read_text(), "### CLI", "sh").splitlines()
    assert lines[0].startswith(".venv/bin/opml serve --port 8000 --data-dir data &")
    for line in lines[1:]:
        command = line.replace(".venv/bin/opml", OPML)
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env={"OPML_URL": url, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (line, done.stderr)
        if " verify " in line:
            assert done.stdout.startswith("same: ") and "(caller, version 4)" in done.stdout
    assert np.load(tmp_path / "L.npy").shape == (3, 3)


def test_examples_readme_command_prints_its_numbers(url: str, tmp_path: Path) -> None:
    """``examples/digits_roc.py``, run as examples/README.md says, prints the AUCs it reports
    (the numbers in the docs come from the committed command)."""
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
