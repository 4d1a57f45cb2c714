"""Every code block of README.md and of the docs pages runs as written, in reading order,
against a service started for that page alone, and prints what the page shows.

How a page is read (the conventions the pages follow):

* A ``sh`` block is a sequence of commands, each run by bash in the page's working directory
  (a fresh temporary dir standing for the repository root), in order. Lines starting with
  ``# `` right after a command are what it prints: JSON where ``...`` stands for members left
  out and numbers are rounded to the places shown, or text where ``...`` stands for anything.
  A command with no such lines may print anything; every command must exit 0.
* A ``python`` block runs in one namespace per page (blocks share variables, in order); a
  ``text`` block right after it is what it prints, exactly (``...`` stands for anything).
* ``json`` and ``yaml`` blocks are data: they must parse.
* A block after ``<!-- not run: why; checked by tests/... -->`` is not run here (it needs
  docker, a cloud, or is the service itself); the comment names the test that checks its
  files another way, which must exist.
* The service address ``localhost:8000`` / ``127.0.0.1:8000`` is the page's own service, and
  ``.venv/bin/`` is this interpreter's directory.

The README must also leave nothing behind: its tour ends with a cleanup, so the working dir
is empty again after its last block (a reader's repository root gets no stray file).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.launcher import ServiceProcess
from tests.service.support import ROOT

BIN = Path(sys.executable).parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
#: The pages docs/gen_reference.py writes (git ignores them).
GENERATED = {
    Path("docs/reference") / n for n in ("settings.md", "metrics.md", "problems.md", "http-api.md")
}
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->", re.DOTALL)
#: A fenced block, also one indented in a list item (its indentation is removed).
FENCE = re.compile(r"^([ \t]*)```([\w-]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)


@dataclass
class Block:
    language: str
    code: str
    expected: str | None  # a following ``text`` block: what a python block prints
    not_run: str | None  # the reason of a ``not run`` marker


def blocks(markdown: str) -> list[Block]:
    """The page's code blocks in reading order (an output ``text`` block joins its code)."""
    found: list[Block] = []
    end = 0
    for match in FENCE.finditer(markdown):
        language, code = match.group(2), textwrap.dedent(match.group(3))
        between = markdown[end : match.start()]
        end = match.end()
        if language == "text" and found and not between.strip() and found[-1].expected is None:
            found[-1].expected = code
            continue
        marker = NOT_RUN.search(between)
        found.append(Block(language, code, None, marker.group(1).strip() if marker else None))
    return found


def commands(block: str) -> list[tuple[str, str]]:
    """A ``sh`` block as (command, what its ``# `` lines show); continuation lines (after a
    ``\\`` or inside a quoted string) and here-documents belong to their command."""
    steps: list[tuple[str, list[str]]] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            assert steps, f"output before any command: {line!r}"
            steps[-1][1].append(line[1:].removeprefix(" "))
            i += 1
            continue
        command = [line]
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        while i + 1 < len(lines) and (
            command[-1].endswith("\\") or "\n".join(command).count("'") % 2
        ):
            i += 1
            command.append(lines[i])
        if heredoc:
            while i + 1 < len(lines) and lines[i].strip() != heredoc.group(1):
                i += 1
                command.append(lines[i])
        steps.append(("\n".join(command), []))
        i += 1
    return [(command, "\n".join(output)) for command, output in steps]


def shown_json(text: str) -> Any:
    """JSON as a page shows it (``...`` members or items left out, numbers rounded), or None."""
    squeezed = re.sub(r",\s*\.\.\.", "", "".join(text.splitlines()))
    if not squeezed.startswith(("{", "[")):
        return None
    try:
        return json.loads(squeezed, parse_float=Decimal)
    except json.JSONDecodeError:
        return None


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


def text_matches(shown: str, printed: str) -> bool:
    """``printed`` is ``shown`` where ``...`` stands for anything (trailing spaces ignored)."""
    pattern = ".*?".join(map(re.escape, shown.rstrip().split("...")))
    lines = "\n".join(line.rstrip() for line in printed.rstrip().splitlines())
    return re.fullmatch(pattern, lines, re.DOTALL) is not None


def check_output(what: str, shown: str, printed: str) -> None:
    doc = shown_json(shown)
    if doc is not None:
        assert matches(doc, json.loads(printed)), f"{what}\nshows  {shown}\nprints {printed}"
    else:
        assert text_matches(shown, printed), f"{what}\nshows:\n{shown}\nprints:\n{printed}"


class Reader:
    """Runs one page's blocks as a reader would, against ``service``, in ``workdir``."""

    def __init__(self, service: ServiceProcess | None, workdir: Path) -> None:
        # No service: an address nothing listens on, so a stray request fails loudly.
        self.url = service.url if service is not None else "http://127.0.0.1:9"
        self.address = self.url.removeprefix("http://")
        self.workdir = workdir
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OPML_")},
            "OPML_URL": self.url,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def localise(self, code: str) -> str:
        for address in ("localhost:8000", "127.0.0.1:8000"):
            code = code.replace(address, self.address)
        return code.replace(".venv/bin/", f"{BIN}/")

    def sh(self, block: Block) -> None:
        for command, shown in commands(block.code):
            done = subprocess.run(
                ["bash", "-c", self.localise(command)],
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            if shown:
                check_output(command, shown, done.stdout)

    def python(self, block: Block) -> None:
        out = io.StringIO()
        previous = Path.cwd()
        os.chdir(self.workdir)
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(self.localise(block.code), "<docs>", "exec"), self.namespace)
        finally:
            os.chdir(previous)
        if block.expected is not None:
            check_output(block.code, block.expected, out.getvalue())


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page.read_text()) if b.not_run is None and b.language in RUN]


RUN = {"sh": Reader.sh, "python": Reader.python}
DATA = {"json": json.loads, "yaml": yaml.safe_load}


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_is_run_or_checked(page: Path) -> None:
    """Each block is runnable, data that parses, or marked with the test that checks it."""
    for block in blocks(page.read_text()):
        if block.not_run is not None:
            named = re.findall(r"tests/[\w/]+\.py", block.not_run)
            assert named, f"{page_id(page)}: a block not run must name its check: {block.code}"
            for test in named:
                assert (ROOT / test).exists(), test
        elif block.language in DATA:
            DATA[block.language](re.sub(r",\s*\.\.\.", "", block.code))
        else:
            assert block.language in RUN, f"{page_id(page)}: unmarked {block.language!r} block"


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=page_id)
def test_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    """The page's blocks in order, against a service of the page's own (it starts with no
    model, as a reader's does; not started for a page that never talks to one)."""
    workdir = tmp_path / "reader"
    workdir.mkdir()
    code = [block.code for block in runnable(page)]
    talks = any(re.search(r"(localhost|127\.0\.0\.1):8000|bin/opml ", c) for c in code)
    with ServiceProcess(tmp_path / "service") if talks else contextlib.nullcontext() as service:
        reader = Reader(service, workdir)
        for block in runnable(page):
            RUN[block.language](reader, block)
    if page.name == "README.md":
        assert sorted(p.name for p in workdir.iterdir()) == [], "the tour leaves files behind"


def test_readme_is_short() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250 and len(text.encode()) <= 16 * 1024


def test_no_lab_notebook_in_readme_or_pages() -> None:
    """No commit hashes, "ad hoc", issue numbers or the internal spec files outside the design
    records (which may name a results file) and the changelog. The generated reference pages
    (not committed) say what the code's help texts say; the code is checked on its own."""
    commit = r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b"  # digits and letters
    banned = re.compile(rf"\bad hoc\b|seed-specs|api\.md|\bissue \d+|{commit}")
    for page in PAGES:
        if "design" in page.parts or page.relative_to(DOCS.parent) in GENERATED:
            continue
        found = banned.findall(page.read_text())
        assert not found, (page_id(page), found)


# -- the conventions themselves -----------------------------------------------------------


def test_commands_split_output_continuations_and_heredocs() -> None:
    block = "a \\\n  b\n# {\"x\": 1}\npython - <<'EOF'\n# not output\nEOF\n# 2\nc\n"
    assert commands(block) == [
        ("a \\\n  b", '{"x": 1}'),
        ("python - <<'EOF'\n# not output\nEOF", "2"),
        ("c", ""),
    ]


def test_blocks_in_reading_order_with_their_outputs_and_markers() -> None:
    page = (
        "```sh\necho 1\n```\n\n* item\n\n  ```python\n  print(2)\n  ```\n  ```text\n  2\n  ```\n"
        "<!-- not run: docker; checked by tests/x.py -->\n```sh\ndocker compose up\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.code, b.expected) for b in found] == [
        ("sh", "echo 1\n", None),
        ("python", "print(2)\n", "2\n"),
        ("sh", "docker compose up\n", None),
    ]
    assert [b.not_run for b in found] == [None, None, "docker; checked by tests/x.py"]


def test_shown_outputs_can_fail() -> None:
    assert matches(shown_json('{"a": 0.012, ...}'), {"a": 0.0122, "b": 1})
    assert not matches(shown_json('{"a": 0.012}'), {"a": 0.013})
    assert not matches(shown_json('{"a": 1, ...}'), {"b": 1})
    assert text_matches("x ... z", "x y z\n")
    assert not text_matches("x ... z", "x y")
    with pytest.raises(AssertionError):
        check_output("cmd", "same: true", "same: false")
