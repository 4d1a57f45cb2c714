"""Every benchmark still loads against the code it measures.

Benchmarks are not run by the suite (they measure, on purpose, for minutes), so a refactor that
renames what one of them imports would otherwise go unnoticed until somebody runs it: two of
them had imported helpers that had moved (``benchmarks.identify``: ``service_load.Service``;
``benchmarks.replicas``: ``common.start_service``). Each script must import and expose its
``main``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

HELPERS = {"__init__", "common", "datasets"}  # imported by the scripts, no command of their own
SCRIPTS = sorted(
    p.stem for p in (Path(__file__).parents[1] / "benchmarks").glob("*.py") if p.stem not in HELPERS
)


def test_the_benchmarks_are_found() -> None:
    assert {"scale_out", "naive_client", "identify", "replicas", "table2"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_imports_and_has_a_main(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(module.main)
