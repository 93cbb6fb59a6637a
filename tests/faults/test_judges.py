"""The fault tests' judges on hand-made input: step logs after faults, GPU holdings."""

from __future__ import annotations

import pytest

from devtools.elastic import check_samples
from tests.faults.holdings import Allowances, Held, allowance_of, conditions
from tests.faults.processes import TrainingProc
from tests.faults.steplog import StepRecord, as_sample_records, committed_steps
from workers.elastic.sampler import ElasticSampler

SAMPLER = ElasticSampler(40, 8, 1)  # 5 steps an epoch


def records(
    steps: range, *, gen: int, world: int, t0: float, workers: int | None = None
) -> list[StepRecord]:
    """What ``workers`` (default: all ``world``) ranks log for ``steps``, 10 ms a step from ``t0``."""
    return [
        StepRecord(step, gen, rank, world, f"w{rank}", t0 + 0.01 * i,
                   tuple(SAMPLER.local_indices(step, rank, world).tolist()))
        for i, step in enumerate(steps)
        for rank in range(world if workers is None else workers)
    ]  # fmt: skip


def test_a_run_resumed_on_the_same_gpus_counts_its_replayed_steps_once() -> None:
    first = records(range(7), gen=0, world=2, t0=100.0)
    second = records(range(5, 10), gen=0, world=2, t0=110.0)  # from the checkpoint at 5
    committed = committed_steps(first + second)
    assert [r.t for r in committed[6]] == [110.01, 110.01]
    check_samples(as_sample_records(committed), SAMPLER, 10, killed=True)


def test_two_runs_at_once_are_caught() -> None:
    # an orphaned run goes on while the requeued one replays the same steps
    first = records(range(10), gen=0, world=2, t0=100.0)
    second = records(range(5, 10), gen=0, world=2, t0=100.02)
    with pytest.raises(AssertionError, match="a rank ran twice"):
        check_samples(as_sample_records(committed_steps(first + second)), SAMPLER, 10, killed=True)


def test_a_skipped_step_is_caught_and_a_partial_one_only_before_a_recovery() -> None:
    skipped = records(range(4), gen=0, world=2, t0=100.0) + records(
        range(5, 10), gen=1, world=2, t0=105.0
    )
    with pytest.raises(AssertionError, match="steps missing"):
        check_samples(as_sample_records(committed_steps(skipped)), SAMPLER, 10, killed=True)
    killed_after_commit = (
        records(range(4), gen=0, world=2, t0=100.0)
        + records(range(4, 5), gen=0, world=2, t0=100.04, workers=1)
        + records(range(5, 10), gen=1, world=1, t0=103.0)
    )
    check_samples(as_sample_records(committed_steps(killed_after_commit)), SAMPLER, 10, killed=True)
    partial_mid_run = records(range(4), gen=0, world=2, t0=100.0) + records(
        range(4, 10), gen=0, world=2, t0=100.04, workers=1
    )
    with pytest.raises(AssertionError, match="partial"):
        check_samples(as_sample_records(committed_steps(partial_mid_run)), SAMPLER, 10, killed=True)


def proc(job: int, gpu: int, pid: int = 1) -> TrainingProc:
    return TrainingProc(pid=pid, ppid=0, job=f"job-{job}", worker=f"w{gpu}")


def test_holdings_conditions_name_each_kind_of_wrong() -> None:
    assert conditions([Held(1, "running", 0)], [proc(1, 0)]) == {}
    held = [Held(1, "running", 0), Held(2, "completed", 3), Held(4, "running", 5)]
    procs = [proc(1, 0, pid=10), proc(3, 0, pid=11), proc(5, 6, pid=12)]
    assert set(conditions(held, procs)) == {
        "held twice: gpu 0",
        "orphan process: pid 11",
        "ended job holds: gpu 3",
        "not started: gpu 5 job 4",
        "orphan process: pid 12",
    }
    assert "held by the dead: gpu 5 job 4" in conditions(held, procs, started={(4, 5)})
    assert allowance_of("held by the dead: gpu 5 job 4", Allowances(held_by_the_dead=7.0)) == 7.0
