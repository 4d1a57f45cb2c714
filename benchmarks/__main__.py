"""The benchmarks' one runner: ``python3 dev.py bench NAME [--quick] [options]``.

    python3 dev.py bench --list          # every benchmark, what it measures, how long it takes
    python3 dev.py bench ingest --quick  # a smoke run (under a minute), results/quick/
    python3 dev.py bench ingest          # the real run: benchmarks/results/ingest.{md,json}
    python3 dev.py bench ingest --help   # a benchmark's own options

``benchmarks/perf/`` measures speed and cost, each beside a floor or baseline measured in the
same run; ``benchmarks/quality/`` reproduces the paper's tables and measures the learners. The
shared harness is ``benchmarks/harness/`` (service launch, load generation, the floor app, the
machine, results files). ``python -m benchmarks.docs`` regenerates ``docs/benchmarks.md`` from
the results files.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its module, what it measures, how long a full run takes."""

    name: str
    group: str
    description: str
    duration: str

    @property
    def module(self) -> str:
        return f"benchmarks.{self.group}.{self.name}"


BENCHMARKS = [
    Benchmark("ingest", "perf", "service ingestion (REST, WS JSON 1/4 connections, binary) "
              "/ a floor app of the same stack; permessage-deflate on and off", "8 min"),
    Benchmark("queries", "perf", "distance, verify, identify, one-to-many / the floor app",
              "5 min"),
    Benchmark("core_timing", "perf", "core step per sample beside the naive O(d^3) update and "
              "the memory-bandwidth floor", "2 min"),
    Benchmark("service_load", "perf", "ingestion by frame size and encoding, query latency, "
              "CPU by thread, a py-spy profile", "5 min"),
    Benchmark("identify", "perf", "identification latency idle and during ingestion, gallery "
              "refresh cost, numpy/faiss baselines", "10 min"),
    Benchmark("certificate_service", "perf", "certificates' cost through the service beside the "
              "core's own computation", "1 min"),
    Benchmark("scale_out", "perf", "CPU per sample of N service processes over one; "
              "availability on join, leave and death", "15 min"),
    Benchmark("replicas", "perf", "what Redis Cluster and WAIT for replicas cost ingestion",
              "2 min"),
    Benchmark("first_start", "perf", "a newcomer's first `dev.py serve` on a fresh copy, beside "
              "--baseline REV (needs network for pip)", "10 min"),
    Benchmark("soak", "perf", "memory, log and lag over minutes at a fixed rate", "10 min"),
    Benchmark("chaos", "perf", "seeded faults on a Redis Cluster under load: the checker's "
              "verdict, unavailability and ack latency per fault kind", "10 min"),
    Benchmark("console_load", "perf", "service CPU with the web console open / closed, under "
              "paced ingestion (headless Chromium)", "3 min"),
    Benchmark("table2", "quality", "paper Table II: k-NN error, Euclidean vs OPML vs COPML",
              "3 min"),
    Benchmark("table4", "quality", "paper Table IV: the cold-start protocol on segment",
              "7 min"),
    Benchmark("learners", "quality", "every learner side by side (OPML, COPML, SGD, BRM)",
              "60 min"),
    Benchmark("scales", "quality", "the metric across input scales and dimensions, ITML as "
              "the bar", "15 min"),
    Benchmark("gamma_grid", "quality", "step-size grid (gamma, gamma_pair) on the paper's "
              "protocols", "8 min"),
    Benchmark("step_ceiling", "quality", "a hindsight ceiling for gamma=auto (best step per "
              "split)", "5 min"),
    Benchmark("operating_points", "quality", "TAR at a certified FAR (1e-2, 1e-3) on real "
              "data beside Euclidean and the EER threshold; verify p99 by target", "5 min"),
    Benchmark("batch_compare", "quality", "the service's learners beside Euclidean, LDA, ITML, "
              "LMNN and NCA on five real data sets (AUC, EER, 5-NN, CPU)", "30 min"),
    Benchmark("certificates_eval", "quality", "certificate coverage: certified bound vs error "
              "on unseen data", "4 min"),
]  # fmt: skip
BY_NAME = {b.name: b for b in BENCHMARKS}


def listing() -> str:
    """``--list``: one line per benchmark.

    >>> "ingest" in listing() and "table2" in listing()
    True
    """
    width = max(len(b.name) for b in BENCHMARKS)
    lines = []
    for group in ("perf", "quality"):
        lines.append(f"{group}:")
        lines += [
            f"  {b.name:<{width}}  ~{b.duration:>6}  {b.description}"
            for b in BENCHMARKS
            if b.group == group
        ]
    lines.append("Every one takes --quick (a smoke run in under a minute, to results/quick/).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        print(listing())
        return 0 if args else 2
    if args[0] == "--list":
        print(listing())
        return 0
    bench = BY_NAME.get(args[0])
    if bench is None:
        print(f"unknown benchmark {args[0]!r}; one of: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    module = importlib.import_module(bench.module)
    # the benchmark's own command line, as `python -m <module>` would see it
    sys.argv = [bench.module, *args[1:]]
    code = module.main(args[1:])
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
