"""The benchmarks cannot rot: each one is listed, parses its options, and the cheap ones run.

Benchmarks are not run by the suite at full length (they measure, on purpose, for minutes), so
a refactor that renames what one of them imports would otherwise go unnoticed until somebody
runs it. Here: every script under ``benchmarks/perf`` and ``benchmarks/quality`` is in the
runner's list and its command line takes ``--quick``; the results folder holds one current
result per benchmark; the floor app and the load generator (the harness every service
benchmark stands on) ingest and answer for real; the cheap quick modes run end to end into a
temporary results folder; the docs page is generated from results files.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from benchmarks.__main__ import BENCHMARKS, BY_NAME, listing
from benchmarks.harness.targets import Target, start_floor
from tests.service.support import RedisServer

ROOT = Path(__file__).resolve().parents[1]
HELPERS = {"__init__", "common", "datasets"}  # imported by the scripts, no command of their own


def scripts(group: str) -> set[str]:
    return {p.stem for p in (ROOT / "benchmarks" / group).glob("*.py") if p.stem not in HELPERS}


def test_every_script_is_in_the_runners_list() -> None:
    for group in ("perf", "quality"):
        assert scripts(group) == {b.name for b in BENCHMARKS if b.group == group}
    assert all(f"  {b.name} " in listing() for b in BENCHMARKS)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_a_benchmark_parses_its_options_and_takes_quick(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(BY_NAME[name].module)
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_the_results_folder_holds_one_current_result_per_benchmark() -> None:
    for path in (ROOT / "benchmarks" / "results").iterdir():
        if path.is_dir():
            assert path.name in {"quick", "profiles"}, path  # untracked by .gitignore
            continue
        assert path.stem in BY_NAME and path.suffix in {".json", ".md", ".png"}, path.name


@pytest.fixture(scope="module")
def quick_table2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m benchmarks table2 --quick`` into a temporary results folder: that folder."""
    results = tmp_path_factory.mktemp("results")
    env = {**os.environ, "OPML_BENCH_RESULTS": str(results)}
    subprocess.run([sys.executable, "-m", "benchmarks", "table2", "--quick"],
                   cwd=ROOT, env=env, check=True, timeout=300, capture_output=True)  # fmt: skip
    return results


def test_the_quick_paper_table_runs_and_records_its_run(quick_table2: Path) -> None:
    stem = quick_table2 / "quick" / "table2"
    data = json.loads(stem.with_suffix(".json").read_text())
    assert set(data["run"]) == {"command", "commit", "machine", "load_average", "date"}
    assert data["run"]["command"] == "python -m benchmarks.quality.table2 --quick"
    assert set(data["summary"]) == {"iris", "wine"}
    assert not (quick_table2 / "table2.json").exists()  # a quick run never replaces a result
    assert stem.with_suffix(".md").read_text().startswith("#")


def test_the_docs_page_is_generated_from_the_results(quick_table2: Path) -> None:
    from benchmarks.docs import render

    page = render(quick_table2 / "quick")
    table2 = page[page.index("### table2") : page.index("### table4")]
    assert "    python3 dev.py bench table2 --quick\n" in table2
    assert "| iris |" in table2
    assert "Not run yet: `python3 dev.py bench ingest`." in page


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[Target]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        with start_floor(server.url, tmp_path, dim=64, gallery=50, gallery_dim=8) as target:
            target.redis_pid, target.redis_port = server.proc.pid, server.port
            yield target
    finally:
        server.stop()


def test_the_floor_app_ingests_durably_and_answers_queries(floor: Target) -> None:
    from benchmarks.perf.ingest import NAME, sequential

    json_one = floor.loadgen("ws", "--model", NAME, "--dim", 64, "--frame", 1, "--seconds", 0.5,
                             "--deflate")  # fmt: skip
    binary = floor.loadgen("ws", "--model", NAME, "--dim", 64, "--frame", 16,
                           "--encoding", "binary", "--seconds", 0.5, "--first-id", 7)  # fmt: skip
    for run in (json_one, binary):
        assert run["samples_acked"] > 0 and run["frame_errors"] == 0
        assert run["service_cpu_s"] > 0
    assert json_one["redis_cpu_s"] + binary["redis_cpu_s"] > 0  # the appends' Redis work
    floor.settle(NAME)  # nothing to learn; returns once Redis persists nothing in the background
    assert json_one["deflate_offered"] and not json_one["deflate"]  # uvicorn's default: off
    rest = asyncio.run(sequential(floor, 20))
    assert rest["errors"] == 0 and rest["samples_per_s"] > 0
    query = floor.loadgen("query", "--model", "q", "--dim", 8, "--target", "verify",
                          "--rate", 50, "--seconds", 0.3, "--pool", 2)  # fmt: skip
    assert query["ok"] == query["requests"] > 0


def test_the_floor_keeps_only_its_last_samples_in_the_log(floor: Target) -> None:
    """As the service's checkpoints trim its log, the floor keeps the entries that hold its
    last KEPT_SAMPLES samples (an unbounded log would grow by gigabytes in a benchmark)."""
    from benchmarks.harness.floor import KEPT_SAMPLES
    from service.config import Settings

    assert Settings.model_fields["checkpoint_every"].default == KEPT_SAMPLES
    batch = {"samples": [{"x": [0.5] * 64, "y": k % 3} for k in range(1000)]}
    with httpx.Client(base_url=floor.url, timeout=60) as client:
        for _ in range(KEPT_SAMPLES // 1000 + 2):
            assert client.post("/v1/models/m/samples", json=batch).status_code == 202
    with redis.Redis(port=floor.redis_port) as r:
        ids = [entry_id for entry_id, _ in r.xrange("floor:log")]
        assert r.hget("floor:meta", "seq") == str(KEPT_SAMPLES + 2000).encode()
    assert ids == [f"{s}-1".encode() for s in range(3000, KEPT_SAMPLES + 3000, 1000)]


def test_the_committed_docs_page_matches_the_committed_results() -> None:
    from benchmarks.docs import PAGE, render

    assert PAGE.read_text() == render(ROOT / "benchmarks" / "results"), (
        "docs/benchmarks.md is stale: python -m benchmarks.docs"
    )


def test_the_floor_outrunning_the_core_is_said_only_when_every_round_shows_it() -> None:
    from benchmarks.perf.ingest import _floor_over_core

    above = {"floor_binary_over_core": {"median": 1.3, "min": 1.1, "max": 1.4}}
    mixed = {"floor_binary_over_core": {"median": 1.3, "min": 0.9, "max": 1.4}}
    assert "no service that learns every sample" in "".join(_floor_over_core(above))
    assert "**1.30** (0.90-1.40)" in "".join(_floor_over_core(mixed))
    assert "no service" not in "".join(_floor_over_core(mixed))
    assert _floor_over_core({}) == []  # results written before the ratio was recorded
