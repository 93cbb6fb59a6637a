"""Retries and run-time limits in the simulator: a failing program is requeued with its progress."""

from __future__ import annotations

import pytest

from scheduler.policies import REGISTRY, get_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import TraceJob


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_failing_program_is_retried_max_restarts_times_then_fails(policy: str) -> None:
    job = TraceJob("f", 0.0, 4, 1000.0, fail_after=100.0, max_restarts=2)
    res = simulate([job], get_policy(policy), SimConfig(total_gpus=4))
    assert res.jobs == ()
    (failed,) = res.failed
    assert failed.end == pytest.approx(300.0)  # three tries of 100 s each
    assert failed.restarts == 2 and failed.failed == "program failed, no restarts left"
    assert res.summary["failed"] == 1 and res.summary["restarts"] == 2
    assert res.summary["unfinished"] == 0


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_a_retry_resumes_from_its_progress(policy: str) -> None:
    # fails at 400 and 800 s of running, then the last 200 s of work complete
    job = TraceJob("f", 0.0, 4, 1000.0, fail_after=400.0, max_restarts=2)
    res = simulate([job], get_policy(policy), SimConfig(total_gpus=4))
    (done,) = res.jobs
    assert done.end == pytest.approx(1000.0) and done.restarts == 2
    assert done.preemptions == 0  # a failure is not a preemption


def test_preemption_does_not_count_as_a_failure() -> None:
    # Each try fails after 150 s; the job needs 200 s but is preempted at 100 s by a
    # high-priority job: the preemption is no failure, the second try finishes it.
    trace = [
        TraceJob("j", 0.0, 4, 200.0, fail_after=150.0, max_restarts=0),
        TraceJob("hi", 100.0, 4, 100.0, priority=90),
    ]
    res = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=4))
    ends = {j.id: j for j in res.jobs}
    assert ends["j"].end == pytest.approx(300.0) and ends["j"].preemptions == 1
    assert ends["j"].restarts == 0 and res.failed == ()


@pytest.mark.parametrize("policy", ["tiresias", "elastic-tiresias", "fifo"])
def test_run_time_limit_ends_a_running_job_failed(policy: str) -> None:
    trace = [TraceJob("long", 10.0, 4, 1000.0, max_runtime=500.0), TraceJob("next", 20.0, 4, 50.0)]
    res = simulate(trace, get_policy(policy), SimConfig(total_gpus=4))
    (failed,) = res.failed
    assert failed.id == "long" and failed.end == pytest.approx(510.0)
    assert failed.failed == "run-time limit reached"
    # its GPUs go to the next job at once (FIFO: it waited; LAS: it may have run already)
    assert {j.id for j in res.jobs} == {"next"} and res.jobs[0].end <= 560.0


def test_run_time_limit_counts_wall_clock_while_queued() -> None:
    # "low" starts at 0, is preempted at 100 by a high job running 500 s, and passes
    # its 300 s limit while it waits: it leaves the queue failed at 300.
    trace = [
        TraceJob("low", 0.0, 4, 1000.0, priority=10, max_runtime=300.0),
        TraceJob("hi", 100.0, 4, 500.0, priority=90),
    ]
    for policy in ("tiresias", "elastic-tiresias", "srtf"):
        res = simulate(trace, get_policy(policy), SimConfig(total_gpus=4))
        (failed,) = res.failed
        assert failed.id == "low" and failed.end == pytest.approx(300.0), policy
        assert [j.id for j in res.jobs] == ["hi"] and res.jobs[0].end == pytest.approx(600.0)


def test_no_limits_leave_the_summary_as_before() -> None:
    res = simulate([TraceJob("a", 0.0, 2, 100.0)], get_policy("tiresias"), SimConfig(total_gpus=4))
    assert "failed" not in res.summary and "restarts" not in res.summary
