"""The short chaos run (:mod:`tests.chaos.engine`): two service processes on a 3-master,
3-replica Redis Cluster, a writer per model retrying through the SDK, one fault of each kind in
a seeded order, then the checker: nothing acknowledged lost, duplicated or moved, every served
L the replay of its log, no 500, no process left. The checker itself is tested on outcomes made
by hand, so a checker that accepts everything cannot pass here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.chaos.engine import KINDS, Ack, Config, Harness, Outcome, OwnerWatch, alive, check, run

SHORT = Config(seed=7, faults=len(KINDS), services=2, masters=3, models=4)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """The run's processes, each stopped when the test ends, passed or failed."""
    made = Harness(tmp_path, SHORT)
    yield made
    made.close()
    assert not [pid for pid in made.pids if alive(pid)]


def test_a_short_chaos_run_keeps_every_acknowledged_sample(harness: Harness) -> None:
    outcome = run(SHORT, harness=harness)
    assert [f.kind for f in outcome.faults] == [kind for kind, _, _ in SHORT.schedule()]
    assert sorted(f.kind for f in outcome.faults) == sorted(KINDS)
    for name in outcome.names:  # the writers went on to the end
        assert max(a.acked for a in outcome.acks if a.model == name) > outcome.faults[-1].end
    problems = check(outcome)
    assert not problems, "\n".join(problems)


def test_the_schedule_depends_on_the_seed_alone() -> None:
    assert SHORT.schedule() == Config(seed=7, faults=5, services=2, models=4).schedule()
    assert SHORT.schedule() != Config(seed=8, faults=5, services=2, models=4).schedule()
    longer = Config(seed=3, faults=12).schedule()
    assert sorted(k for k, _, _ in longer[:5]) == sorted(KINDS)  # each kind before any twice
    assert all(lo <= q <= hi for _, _, q in longer for lo, hi in [Config().quiet_s])


# -- the checker on outcomes made by hand ---------------------------------------------------


def outcome_of(acked: list[tuple[int, int]], logged: list[int], served_version: int | None = None,
               ) -> Outcome:  # fmt: skip
    """One model, batches of 2: ``acked`` as (sample index lo, first seq), the log holding
    samples ``logged`` in seq order (entries of 2), served L the replay of ``logged``."""
    from service.core import Learner, LearnerConfig
    from tests.chaos.engine import make_stream

    config = Config(models=1, batch=2)
    X, y = make_stream(1, 0, 20, config.dim)
    log = {
        seq + 2: (X[logged[seq : seq + 2]], [y[i] for i in logged[seq : seq + 2]])
        for seq in range(0, len(logged), 2)
    }
    learner = Learner(LearnerConfig(dim=config.dim, gamma=0.05, seed=0))
    if logged:
        learner.learn_many(X[logged], [y[i] for i in logged])
    version = len(logged) if served_version is None else served_version
    return Outcome(
        config, ["m"], {"m": (X, y)},
        [Ack("m", lo, lo + 2, first, first + 1, 0.0, 0.0) for lo, first in acked],
        [], [], {}, {"m": []}, OwnerWatch(None, ["m"]), {"m": log}, 0,  # type: ignore[arg-type]
        {"m": [("p", version, learner.L)]}, [], [], {}, 0.0, 1.0,
    )  # fmt: skip


def test_the_checker_passes_a_faithful_log() -> None:
    # batch 4 was logged but its answer lost (never acknowledged): allowed, once
    assert check(outcome_of([(0, 1), (2, 3), (6, 7)], [0, 1, 2, 3, 4, 5, 6, 7])) == []


def test_the_checker_finds_a_lost_sample() -> None:
    problems = check(outcome_of([(0, 1), (2, 3), (4, 5)], [0, 1, 4, 5]))
    assert any("batch 2 acknowledged at seqs 3..4" in p for p in problems), problems


def test_the_checker_finds_a_sample_logged_twice() -> None:
    problems = check(outcome_of([(0, 1), (2, 3)], [0, 1, 2, 3, 2, 3]))
    assert any("sample 2 logged twice, seqs 3 and 5" in p for p in problems), problems


def test_the_checker_finds_a_gap_and_a_stale_metric() -> None:
    gap = outcome_of([(0, 1)], [0, 1, 2, 3, 4, 5])
    del gap.log["m"][4]  # seqs 3..4: in no entry, no acknowledgement covers them
    assert any("seqs [3, 4] (2) are in no entry" in p for p in check(gap)), check(gap)
    stale = check(outcome_of([(0, 1)], [0, 1, 2, 3], served_version=2))
    assert any("serves version 2, the log has 4" in p for p in stale), stale
    wrong = outcome_of([(0, 1)], [0, 1])
    wrong.served["m"] = [("p", 2, np.eye(wrong.config.dim))]
    assert any("not the log's replay" in p for p in check(wrong))


def test_an_entry_the_recorder_missed_is_vouched_for_by_the_served_metric() -> None:
    missed = outcome_of([(0, 1), (2, 3), (4, 5)], [0, 1, 2, 3, 4, 5])
    del missed.log["m"][4]  # trimmed before the recorder read it; L was learned with it
    assert check(missed) == [] and missed.unrecorded == {"m": 1}
    lost = outcome_of([(0, 1), (2, 3), (4, 5)], [0, 1, 4, 5], served_version=6)  # learned without
    lost.log["m"] = {2: lost.log["m"][2], 6: lost.log["m"][4]}
    problems = check(lost)
    assert any("1 acknowledged entries never seen in the log: lost" in p for p in problems)


def test_the_checker_counts_500s_and_live_processes() -> None:
    bad = outcome_of([(0, 1)], [0, 1])
    bad.server_errors.append((0.5, "POST /v1/models/m/samples (via p): boom"))
    bad.pids.append(1)  # init: always running
    problems = check(bad)
    assert any("1 answers were 500" in p for p in problems)
    assert any("still running after the run: [1]" in p for p in problems)
