"""The examples of README.md (the Tour, its WebSocket example, the SDK and the CLI) and of
examples/README.md run as written, against an ``opml serve`` of their own (default limits,
embedded Redis), and print what the docs say they print."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.clients.support import OPML, served
from tests.service.support import ROOT, free_port


def own_service(tmp: Path) -> Iterator[str]:
    """An ``opml serve`` on a free port with its data in ``tmp``; its address."""
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    with served(address, tmp / "serve.log", "--port", str(port), "--data-dir", str(tmp / "d")):
        yield address


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from own_service(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def tour_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A service of the Tour's own: it starts from no model, as a reader's does."""
    yield from own_service(tmp_path_factory.mktemp("tour"))


def fenced(markdown: str, heading: str, language: str, nth: int = 0) -> str:
    """The ``nth`` ``language`` code block after ``heading``."""
    section = markdown[markdown.index(f"\n{heading}\n") :]
    blocks = re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert len(blocks) > nth, heading
    return str(blocks[nth])


def shown(text: str) -> Any:
    """An output the docs show: JSON where ``...`` stands for members or items left out and
    numbers may be rounded (kept as ``Decimal``, so :func:`matches` knows to how many places)."""
    return json.loads(re.sub(r",\s*\.\.\.", "", text), parse_float=Decimal)


def matches(doc: Any, actual: Any) -> bool:
    """``actual`` is what ``doc`` shows: the members shown, equal; numbers to the places shown."""
    if isinstance(doc, dict):
        return isinstance(actual, dict) and all(
            key in actual and matches(value, actual[key]) for key, value in doc.items()
        )
    if isinstance(doc, list):
        same_length = isinstance(actual, list) and len(doc) == len(actual)
        return same_length and all(map(matches, doc, actual))
    if isinstance(doc, Decimal):
        places = doc.as_tuple().exponent
        assert isinstance(places, int)
        tolerance = Decimal(5).scaleb(places - 1)
        return type(actual) in (int, float) and abs(Decimal(repr(actual)) - doc) <= tolerance
    return type(doc) is type(actual) and bool(doc == actual)


def commands_and_outputs(block: str) -> list[tuple[str, str]]:
    """A shell block as (commands, the output its following ``# `` comment lines show); a
    command with no comment after it prints nothing."""
    steps: list[tuple[str, str]] = []
    command: list[str] = []
    output: list[str] = []
    for line in [*block.splitlines(), ""]:
        if line.startswith("#"):
            output.append(line[1:].strip())
            continue
        if output or (command and not line):
            steps.append(("\n".join(command), "".join(output)))
            command, output = [], []
        if line:
            command.append(line)
    return steps


def printed(source: str) -> list[Any]:
    """What a Python example prints, line by line (dict lines as dicts)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(source, {})
    lines = out.getvalue().splitlines()
    return [ast.literal_eval(line) if line.startswith("{") else line for line in lines]


@pytest.mark.skipif(shutil.which("curl") is None, reason="the Tour uses curl; not installed")
def test_readme_tour_and_its_websocket_example_print_what_they_show(
    tour_url: str, tmp_path: Path
) -> None:
    """Each command of the Tour, as written (``localhost:8000`` made this test's service),
    prints what the comment under it shows (``-o L.npy`` prints nothing and writes L). Then
    the WebSocket example prints the ack and ``5 5 2`` it shows; run again, the replayed ack
    (nothing logged); an edited sample under the same id is a 409 error frame; a new id is a
    new sample: what the text under the example says."""
    readme = (ROOT / "README.md").read_text()
    steps = commands_and_outputs(fenced(readme, "### Tour", "sh"))
    assert len(steps) == 6 and all("localhost:8000" in command for command, _ in steps)
    address = tour_url.removeprefix("http://")
    for command, output in steps:
        done = subprocess.run(
            ["bash", "-c", command.replace("localhost:8000", address)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (command, done.stderr)
        assert matches(shown(output), json.loads(done.stdout)), (command, done.stdout)
    assert np.load(tmp_path / "L.npy").shape == (3, 3)

    code = fenced(readme, "### Tour", "python")
    assert code.count("ws://localhost:8000") == 2
    code = code.replace("ws://localhost:8000", tour_url.replace("http://", "ws://"))
    comments = re.findall(r"# (\{.*\}|\d+ \d+ \d+)$", code, re.MULTILINE)
    documented = [ast.literal_eval(c) if c.startswith("{") else c for c in comments]
    assert documented == [{"ack": 1, "first_seq": 5, "last_seq": 5}, "5 5 2"]
    assert printed(code) == documented
    assert printed(code) == [{**documented[0], "replayed": True}, "5 5 2"]
    edited = printed(code.replace('"y": "ann"', '"y": "bob"'))
    assert edited[0]["error"]["status"] == 409 and edited[0]["id"] == 1
    fresh = printed(code.replace('"id": 1', '"id": 2').replace("< 5", "< 6"))
    assert fresh == [{"ack": 2, "first_seq": 6, "last_seq": 6}, "6 6 2"]


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


def test_readme_certificate_example_prints_what_the_readme_says(url: str) -> None:
    readme = (ROOT / "README.md").read_text()
    code = fenced(readme, "### Certificates (`GET /v1/models/{name}/certificate`)", "python")
    printed = readme[readme.index(code) + len(code) :]
    match = re.search(r"prints\n\n```\n(.*?)```", printed, re.DOTALL)
    assert match is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace("http://127.0.0.1:8000", url), {})
    assert out.getvalue() == match.group(1)
