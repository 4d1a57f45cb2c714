"""Generate the blocking client ``clients/sync.py`` from the asyncio client ``clients/aio.py``.

    python scripts/unasync.py           # rewrite clients/sync.py
    python scripts/unasync.py --check   # exit 1 (and print the diff) if clients/sync.py is not
                                        # what clients/aio.py generates

The async client is the one source (as httpcore does it): the blocking twin is the same text
with ``async``/``await`` dropped and each asyncio name replaced by its blocking counterpart
(:data:`TOKENS`). The one place where the two differ in shape, not only in names, is a literal
block replacement (:data:`BLOCKS`) that must match exactly once, so editing it in ``aio.py``
without updating this script fails loudly. The result goes through ruff's import sorting and
formatter with the project's settings (a shorter name can reorder imports and shorten lines),
and may hold no ``async``/``await``/``asyncio.`` token. Needs ruff (the ``[test]`` extra).
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "clients" / "aio.py"
TARGET = ROOT / "clients" / "sync.py"

HEADER = (
    "# Generated from clients/aio.py by scripts/unasync.py: do not edit. Edit clients/aio.py,\n"
    "# then run `python scripts/unasync.py` (CI runs it with --check).\n"
)

#: Literal blocks whose blocking form has another shape: the websockets sync client takes the
#: receive timeout itself (0: only a message already received), asyncio needs a timeout scope.
BLOCKS: list[tuple[str, str]] = [
    (
        "    # asyncio.timeout(0), unlike wait_for(..., 0) on Python 3.11, lets recv() return a"
        " message\n"
        "    # that is already there before the deadline fires.\n"
        "    async with asyncio.timeout(timeout):\n"
        "        return await ws.recv()\n",
        "    return ws.recv(timeout)\n",
    ),
]

#: Regular expressions and their blocking replacements, applied in this order.
TOKENS: list[tuple[str, str]] = [
    (r"\bAsyncOPMLClient\b", "OPMLClient"),
    (r"\bAsyncStream\b", "Stream"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncExitStack\b", "ExitStack"),
    (r"\benter_async_context\b", "enter_context"),
    (r"\baclose\b", "close"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bwebsockets\.asyncio\.client\b", "websockets.sync.client"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"^import asyncio$", "import time"),
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
    (r"\b([Tt]he) asyncio client\b", r"\1 blocking client"),
    (r"\basyncio client\b", "blocking client"),
]

#: What may not survive in the blocking client.
LEFTOVER = re.compile(r"\b(async|await)\b|\basyncio\.|^import asyncio", re.MULTILINE)


def unasync(source: str) -> str:
    """The blocking client's text for the asyncio client's ``source`` (before ruff)."""
    text = source
    for old, new in BLOCKS:
        count = text.count(old)
        if count != 1:
            raise SystemExit(
                f"unasync: a block of scripts/unasync.py BLOCKS matches {count} times in "
                f"clients/aio.py (expected once); update BLOCKS:\n{old}"
            )
        text = text.replace(old, new)
    for pattern, replacement in TOKENS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    leftover = LEFTOVER.search(text)
    if leftover is not None:
        line = text.count("\n", 0, leftover.start()) + 1
        raise SystemExit(
            f"unasync: {leftover.group(0)!r} left at line {line} of the generated client; "
            "add a replacement to scripts/unasync.py"
        )
    return HEADER + text


def ruff(text: str) -> str:
    """``text`` with its imports sorted and formatted as ruff does for ``clients/sync.py``."""
    relative = str(TARGET.relative_to(ROOT))
    for command in (
        ["check", "--select", "I", "--fix-only", "--exit-zero"],
        ["format"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--stdin-filename", relative, "-"],
            input=text,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if done.returncode != 0:
            raise SystemExit(f"unasync: ruff {command[0]} failed:\n{done.stderr}{done.stdout}")
        text = done.stdout
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate clients/sync.py from clients/aio.py.")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and print the diff if clients/sync.py is out of date",
    )
    args = parser.parse_args(argv)
    generated = ruff(unasync(SOURCE.read_text()))
    current = TARGET.read_text() if TARGET.exists() else ""
    if generated == current:
        return 0
    if args.check:
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            "clients/sync.py (committed)",
            "clients/sync.py (generated from clients/aio.py)",
        )
        sys.stdout.writelines(diff)
        print("clients/sync.py is out of date: run `python scripts/unasync.py`", file=sys.stderr)
        return 1
    TARGET.write_text(generated)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
