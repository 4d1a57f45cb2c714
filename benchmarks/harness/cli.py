"""Every benchmark's command line: its own options plus ``--quick``.

``--quick`` is a smoke run of the same code in under a minute: each benchmark names the
option values it sets (:func:`parse`'s ``quick``), explicit options still win, and the results
go to ``benchmarks/results/quick/`` (:func:`benchmarks.harness.results.result_stem`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any


def add_quick(parser: argparse.ArgumentParser) -> None:
    """Add ``--quick`` unless the parser has it."""
    if not any("--quick" in action.option_strings for action in parser._actions):
        parser.add_argument(
            "--quick", action="store_true", help="a smoke run in under a minute (results/quick/)"
        )


def parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    quick: Mapping[str, Any] | None = None,
) -> argparse.Namespace:
    """Parse ``argv``; with ``--quick``, ``quick``'s values replace the defaults first.

    >>> p = argparse.ArgumentParser()
    >>> _ = p.add_argument("--rounds", type=int, default=3)
    >>> parse(p, ["--quick"], {"rounds": 1}).rounds, parse(p, [], {"rounds": 1}).rounds
    (1, 3)
    >>> parse(p, ["--quick", "--rounds", "2"], {"rounds": 1}).rounds
    2
    """
    add_quick(parser)
    first = parser.parse_args(argv)
    if not first.quick or not quick:
        return first
    parser.set_defaults(**quick)
    return parser.parse_args(argv)
