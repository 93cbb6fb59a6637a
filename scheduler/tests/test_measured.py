"""Measured throughput into the simulator (pure): rates, start-up delay, the policy wrapper."""

from __future__ import annotations

import pytest

from scheduler.measured import MeasuredJob, MeasuredPolicy, Progress, startup_delay, step_rates
from scheduler.policies import get_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import TraceJob


def test_rates_come_from_pairs_at_one_size_weighted_by_time() -> None:
    samples = [
        Progress(10.0, 20, 2),
        Progress(12.0, 40, 2),  # 10 steps/s for 2 s
        Progress(14.0, 80, 4),  # spans the resize: ignored
        Progress(16.0, 120, 4),  # 20 steps/s
        Progress(22.0, 140, 2),  # spans a resize back: ignored
        Progress(30.0, 160, 2),  # 2.5 steps/s for 8 s
    ]
    rates = step_rates(list(reversed(samples)))  # order of arrival does not matter
    assert rates[4] == pytest.approx(20.0)
    assert rates[2] == pytest.approx((20 + 20) / (2 + 8))  # not the mean of 10 and 2.5
    assert step_rates([Progress(1.0, 5, 1)]) == {}
    assert step_rates([Progress(1.0, 5, 0), Progress(2.0, 9, 0)]) == {}  # no GPUs: no rate


def test_startup_is_the_time_to_the_first_report_less_the_steps_it_took() -> None:
    samples = [Progress(108.0, 30, 2), Progress(110.0, 50, 2)]
    rates = step_rates(samples)  # 10 steps/s
    assert startup_delay(100.0, samples, rates) == pytest.approx(5.0)  # 8 s, 3 of them training
    assert startup_delay(100.0, [], rates) == 0.0
    assert startup_delay(107.0, samples, {2: 1.0}) == 0.0  # never negative


def test_a_measured_job_fills_unmeasured_sizes_as_the_live_policy_does() -> None:
    job = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=600, rates={2: 10.0, 3: 12.0})
    assert job.duration() == pytest.approx(60.0)
    speed = job.speed_table()
    assert speed[0] == 0.0 and speed[2] == 1.0
    assert speed[1] == pytest.approx(0.5)  # below the smallest measured: linear from it
    assert speed[3] == pytest.approx(1.2)
    assert speed[4] == pytest.approx(1.6)  # above: the per-GPU rate at 3, times 4
    assert job.gain_ref() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no positive rate measured"):
        MeasuredJob("b", 2, 2, 2, 10, {2: 0.0}).duration()


def test_the_simulator_runs_the_measured_table_range_and_startup() -> None:
    # Alone on 4 GPUs, an elastic 1-2-4 job starts on 4, where it measured 3x its rate at 2.
    job = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=300, rates={2: 10.0, 4: 30.0})
    trace = [TraceJob("a", 0.0, 2, job.duration(), model="resnet50")]
    inner = get_policy("elastic-tiresias")
    result = simulate(trace, MeasuredPolicy(inner, {"a": job}, startup_s=5.0), SimConfig(4))
    # 5 s start-up, then 300 steps at 30 steps/s: the analytic model would say otherwise
    assert result.jobs[0].jct == pytest.approx(15.0)
    # A rigid copy of the same job stays at 2 GPUs: its own range, not max_scale x request.
    rigid = MeasuredJob("a", 2, 2, 2, 300, {2: 10.0, 4: 30.0})
    result = simulate(trace, MeasuredPolicy(inner, {"a": rigid}, startup_s=0.0), SimConfig(4))
    assert result.jobs[0].jct == pytest.approx(30.0)
    assert MeasuredPolicy(inner, {}, 1.0).name == "elastic-tiresias"
