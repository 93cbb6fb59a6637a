"""Measured throughput into the simulator (pure): rates, fixed costs, CPU sharing, the policy."""

from __future__ import annotations

import pytest

from devtools.measured import (
    BusySlots,
    MeasuredJob,
    MeasuredPolicy,
    Progress,
    SharedCpu,
    finish_delay,
    first_step_at,
    fit_shared_cpu,
    fit_start_law,
    law_by_busy,
    pooled_rates,
    startup_delay,
    step_rates,
    step_totals,
)
from scheduler.policies import get_policy
from scheduler.simulator import ScalingCost, SimConfig, simulate
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
    assert step_totals(samples)[2] == pytest.approx((40.0, 10.0))
    assert step_rates([Progress(1.0, 5, 1)]) == {}
    assert step_rates([Progress(1.0, 5, 0), Progress(2.0, 9, 0)]) == {}  # no GPUs: no rate


def test_busy_slots_are_a_step_function_of_the_changes() -> None:
    busy = BusySlots([(10.0, 4), (0.0, 2), (10.0, -1), (20.0, -5)])  # any order; ties merge
    assert [busy.at(t) for t in (-1.0, 0.0, 5.0, 10.0, 15.0, 20.0)] == [0, 2, 2, 5, 5, 0]
    assert busy.pieces(5.0, 15.0) == [(5.0, 2), (5.0, 5)]
    assert busy.mean(5.0, 15.0) == pytest.approx(3.5)
    assert busy.mean(12.0, 12.0) == 5.0  # an empty span: the value there
    cpu = SharedCpu(cores=2.0, external=1.0)
    assert cpu.factor(0) == 1.0 and cpu.factor(1) == 1.0  # they fit on the cores
    assert cpu.factor(5) == pytest.approx(3.0)
    assert cpu.table(3) == (1.0, 1.0, 1.5, 2.0)
    # 5 s at factor 1.5 (2 busy and 1 other), 5 s at factor 3: 10/3 + 5/3 s of a free core
    assert busy.free_seconds(5.0, 15.0, cpu) == pytest.approx(5.0)


def test_rates_on_a_free_core_undo_the_crowd() -> None:
    busy = BusySlots([(0.0, 6)])
    samples = [Progress(0.0, 0, 2), Progress(10.0, 50, 2)]  # 5 steps/s with 6 slots busy
    cpu = SharedCpu(cores=2.0)
    assert step_rates(samples, busy, cpu) == {2: pytest.approx(15.0)}  # factor 3
    assert step_rates(samples) == {2: pytest.approx(5.0)}  # wall clock


def law_samples(cpu: SharedCpu, free_rate: float, busy_at: list[int]) -> list[Progress]:
    """Reports every 10 s of a job on 2 GPUs whose rate follows ``cpu``, busy as given."""
    out, step = [Progress(0.0, 0, 2)], 0.0
    for i, busy in enumerate(busy_at):
        step += 10.0 * free_rate / cpu.factor(busy)
        out.append(Progress(10.0 * (i + 1), round(step), 2))
    return out


def test_the_sharing_law_is_fitted_from_rates_that_fall_as_slots_fill() -> None:
    truth = SharedCpu(cores=2.0, external=3.0)
    pattern = [2, 2, 4, 4, 8, 8, 6, 6]
    busy = BusySlots([(10.0 * i, b - (pattern[i - 1] if i else 0)) for i, b in enumerate(pattern)])
    jobs = {
        "a": law_samples(truth, 100.0, pattern),
        "b": law_samples(truth, 40.0, pattern),
    }
    fit = fit_shared_cpu(jobs, busy, cores=2.0)
    assert fit.cpu.external == pytest.approx(3.0, abs=0.25)
    assert fit.residual < fit.residual_without / 10  # the law explains the spread
    flat = {"a": law_samples(SharedCpu(2.0, 100.0), 100.0, [4] * 8)}  # one busy count: no trend
    assert fit_shared_cpu(flat, BusySlots([(0.0, 4)]), cores=2.0).cpu.external == 0.0


def test_the_law_is_checked_per_group_and_busy_count_where_it_was_fitted() -> None:
    law = SharedCpu(cores=2.0, external=1.0)
    pattern = [2, 2, 6, 6]
    busy = BusySlots([(10.0 * i, b - (pattern[i - 1] if i else 0)) for i, b in enumerate(pattern)])
    # "a" follows the law; "b" runs 10% faster than it whenever 6 slots are busy.
    a = law_samples(law, 100.0, pattern)
    b = [Progress(0.0, 0, 2), Progress(10.0, 667, 2), Progress(20.0, 1333, 2)]
    b += [Progress(30.0, 1333 + 314, 2), Progress(40.0, 1333 + 628, 2)]  # 31.4/s, law 28.57
    check = law_by_busy(
        {"a": a, "b": b}, {"a": {2: 100.0}, "b": {2: 100.0}}, {"a": "x", "b": "y"}, busy, law
    )
    assert set(check) == {("x", 2), ("x", 6), ("y", 2), ("y", 6)}
    assert check[("x", 2)][0] == pytest.approx(1.0, abs=1e-3)
    assert check[("x", 6)][0] == pytest.approx(1.0, abs=1e-3)
    assert check[("x", 6)][1] == pytest.approx(20.0)  # the seconds behind it: two reports
    assert check[("y", 2)][0] == pytest.approx(1.0, abs=1e-3)
    assert check[("y", 6)][0] == pytest.approx(1.1, abs=2e-3)


def test_the_start_up_law_is_fitted_per_workload() -> None:
    # 2 slots busy until 50, 4 until 100, 8 after: start-ups of 6 and 4 free-core seconds
    # stretch by (busy + 2) / 2 (the law to find) inside each stretch.
    law = SharedCpu(cores=2.0, external=2.0)
    busy = BusySlots([(0.0, 2), (50.0, 2), (100.0, 4)])
    starts = [
        (w, t0, t0 + base * law.factor(busy.at(t0)))
        for w, base in (("m", 6.0), ("r", 4.0))
        for t0 in (0.0, 50.0, 100.0)
    ]
    fit = fit_start_law(starts, busy, cores=2.0)
    assert fit.cpu.external == pytest.approx(2.0)
    assert fit.residual == pytest.approx(0.0, abs=1e-12)
    assert fit.residual_without > 0


def test_startup_and_finish_are_the_edges_that_training_does_not_explain() -> None:
    samples = [Progress(108.0, 30, 2), Progress(110.0, 50, 2)]
    rates = step_rates(samples)  # 10 steps/s
    assert first_step_at(samples, rates) == pytest.approx(105.0)
    assert startup_delay(100.0, samples, rates) == pytest.approx(5.0)  # 8 s, 3 of them training
    assert startup_delay(100.0, [], rates) == 0.0
    assert startup_delay(107.0, samples, {2: 1.0}) == 0.0  # never negative
    # 10 steps after the last report (1 s), then 4 s until the end was recorded
    assert finish_delay(115.0, 60, samples, rates) == pytest.approx(4.0)
    assert finish_delay(115.0, 60, [], rates) is None
    assert finish_delay(110.5, 60, samples, rates) == 0.0


def test_a_measured_job_fills_unmeasured_sizes_from_its_workload_then_the_prior() -> None:
    job = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=600, rates={2: 10.0, 3: 12.0})
    assert job.duration() == pytest.approx(60.0)
    speed = job.speed_table()
    assert speed[0] == 0.0 and speed[2] == 1.0
    assert speed[1] == pytest.approx(0.5)  # below the smallest measured: linear from it
    assert speed[3] == pytest.approx(1.2)
    assert speed[4] == pytest.approx(1.6)  # above: the per-GPU rate at 3, times 4
    assert job.gain_ref() == pytest.approx(2.0)
    # Its workload ran at 1 and 4 elsewhere; this job runs at 0.5x its peers where both ran.
    peers = pooled_rates([(1, 100.0, 10.0), (2, 200.0, 10.0), (2, 200.0, 30.0), (4, 300.0, 10.0)])
    assert peers == {1: 10.0, 2: 10.0, 4: 30.0}
    flat = MeasuredJob("a", 2, 1, 4, 600, {2: 5.0}, peers=peers)
    assert flat.curve() == {1: 5.0, 2: 5.0, 3: pytest.approx(10.0), 4: 15.0}
    with pytest.raises(ValueError, match="no positive rate measured"):
        MeasuredJob("b", 2, 2, 2, 10, {2: 0.0}).duration()


def test_the_simulator_runs_the_measured_table_range_and_startup() -> None:
    # Alone on 4 GPUs, an elastic 1-2-4 job starts on 4, where it measured 3x its rate at 2.
    job = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=300, rates={2: 10.0, 4: 30.0})
    trace = [TraceJob("a", 0.0, 2, job.duration(), model="resnet50")]
    inner = get_policy("elastic-tiresias")
    cfg = SimConfig(4, cost=ScalingCost(first_start_s=5.0))
    result = simulate(trace, MeasuredPolicy(inner, {"a": job}), cfg)
    # 5 s start-up, then 300 steps at 30 steps/s: the analytic model would say otherwise
    assert result.jobs[0].jct == pytest.approx(15.0)
    # A rigid copy of the same job stays at 2 GPUs: its own range, not max_scale x request.
    rigid = MeasuredJob("a", 2, 2, 2, 300, {2: 10.0, 4: 30.0})
    result = simulate(trace, MeasuredPolicy(inner, {"a": rigid}), SimConfig(4))
    assert result.jobs[0].jct == pytest.approx(30.0)
    assert MeasuredPolicy(inner, {}).name == "elastic-tiresias"


def test_the_policy_sees_only_what_the_job_has_measured_so_far() -> None:
    # Its throughput is flat: 4 GPUs train no faster than 2.  The live policy does not know
    # that before it tries: on the linear prior it starts the job on all 4 GPUs.
    flat = MeasuredJob(
        "a", requested=2, min_gpus=1, max_gpus=4, steps=600, rates={2: 10.0, 4: 10.0}
    )
    trace = [TraceJob("a", 0.0, 2, flat.duration())]
    inner = get_policy("elastic-tiresias")
    cfg = SimConfig(4, tick=1.0)
    learning = simulate(trace, MeasuredPolicy(inner, {"a": flat}), cfg)
    knowing = simulate(trace, MeasuredPolicy(inner, {"a": flat}, learn=False), cfg)
    assert learning.jobs[0].jct == pytest.approx(60.0) == knowing.jobs[0].jct  # progress: truth
    assert knowing.summary["gpu_utilization"] == pytest.approx(0.5)  # 2 of 4 GPUs
    assert learning.summary["gpu_utilization"] == pytest.approx(1.0)  # tried 4, kept them
