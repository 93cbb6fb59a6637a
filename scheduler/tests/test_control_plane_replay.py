"""What the simulator adds to replay a live run job by job: the control plane's delays, each
job's own fixed costs, and the rates the live policy is shown (``devtools.measured``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devtools.measured import (
    MeasuredJob,
    MeasuredPolicy,
    arrival_delays,
    handover_delays,
    live_curve,
)
from fabric.topology import FabricSpec
from scheduler.curves import record_measurement
from scheduler.policies import get_policy
from scheduler.sim_config import BASE_THEN_EXTRAS, WHOLE_START, BindingRounds, Fidelity
from scheduler.simulator import JobResult, Outage, ScalingCost, SimConfig, simulate
from scheduler.traces import TraceJob


def results(trace: list[TraceJob], cfg: SimConfig, policy: str = "fifo") -> dict[str, JobResult]:
    return {r.id: r for r in simulate(trace, get_policy(policy), cfg).jobs}


def test_an_ended_jobs_gpus_are_handed_over_release_s_after_its_end() -> None:
    trace = [TraceJob("a", 0.0, 4, 100.0), TraceJob("b", 0.0, 4, 50.0)]
    at_once = results(trace, SimConfig(4))
    assert at_once["b"].start == pytest.approx(100.0)
    late = results(trace, SimConfig(4, release_s=2.0))
    assert late["a"].jct == pytest.approx(100.0)  # its JCT ends at its recorded end
    assert late["b"].start == pytest.approx(102.0)  # the next job waits for the handover
    assert late["b"].jct == pytest.approx(152.0)


def test_the_handover_holds_only_the_ended_jobs_gpus() -> None:
    # "b" fits beside "a" on the free half: the handover of "a" does not delay it.
    trace = [TraceJob("a", 0.0, 2, 10.0), TraceJob("b", 5.0, 2, 10.0), TraceJob("c", 6.0, 2, 10.0)]
    got = results(trace, SimConfig(4, release_s=3.0))
    assert got["b"].start == pytest.approx(5.0)
    assert got["c"].start == pytest.approx(13.0)  # a ended at 10, its GPUs free at 13


def test_an_ended_job_is_not_resized_while_its_gpus_are_handed_over() -> None:
    # "a" (1-2-4) holds 4 GPUs alone; when it ends "c" arrives needing 2. Were "a" still
    # the policy's to shrink, "c" would start at once on its extras.
    a = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=400, rates={2: 10.0, 4: 20.0})
    c = MeasuredJob("c", requested=2, min_gpus=2, max_gpus=2, steps=100, rates={2: 10.0})
    trace = [TraceJob("a", 0.0, 2, a.duration()), TraceJob("c", 20.0, 2, c.duration())]
    policy = MeasuredPolicy(get_policy("elastic-tiresias"), {"a": a, "c": c}, learn=False)
    ends = {r.id: r for r in simulate(trace, policy, SimConfig(4, tick=1.0, release_s=4.0)).jobs}
    assert ends["a"].end == pytest.approx(20.0)  # 400 steps at 20 steps/s on 4
    assert ends["c"].start == pytest.approx(24.0)


def test_the_policy_sees_an_arrival_arrival_s_late() -> None:
    trace = [TraceJob("a", 10.0, 2, 100.0)]
    got = results(trace, SimConfig(4, arrival_s=0.5))
    assert got["a"].start == pytest.approx(10.5)
    assert got["a"].jct == pytest.approx(100.5)  # counted from its submission
    assert results(trace, SimConfig(4))["a"].jct == pytest.approx(100.0)


def test_each_job_may_have_its_own_start_up_and_end() -> None:
    trace = [
        TraceJob("a", 0.0, 2, 100.0, model="resnet50"),
        TraceJob("b", 0.0, 2, 100.0, model="resnet50"),
    ]
    cost = ScalingCost(
        first_start_by_model={"resnet50": 10.0},
        first_start_by_job={"a": 3.0},
        finish_s=1.0,
        finish_by_job={"b": 2.5},
    )
    got = results(trace, SimConfig(4, cost=cost))
    assert got["a"].jct == pytest.approx(104.0)  # its own 3 s start-up, the default 1 s end
    assert got["b"].jct == pytest.approx(112.5)  # its workload's 10 s, its own 2.5 s end
    assert cost.first_start("resnet50", "a") == 3.0
    assert cost.first_start("resnet50") == 10.0


def test_a_handover_is_an_end_to_the_next_placement_of_a_job_that_waited() -> None:
    ends = [10.0, 20.0, 40.0]
    placements = [
        (11.5, 5.0),  # after the end at 10, a job submitted before it: 1.5 s
        (21.0, 20.5),  # after 20, but a job that arrived after that end: not a handover
        (23.0, 15.0),  # the first placement after 20 of a job that waited: 3 s
        (50.0, 1.0),  # after 40, before no next end: 10 s
    ]
    assert handover_delays(ends, placements) == pytest.approx([1.5, 3.0, 10.0])
    # An end followed by no placement before the next end made room for nobody.
    assert handover_delays([10.0, 12.0], [(13.0, 0.0)]) == pytest.approx([1.0])


def test_an_arrival_delay_counts_only_jobs_that_found_room_at_once() -> None:
    starts = [(0.0, 0.4), (5.0, 30.0), (31.0, 31.7)]
    # The second was placed after an end (at 20) that came after its submission: it waited
    # for GPUs, not for the control plane.
    assert arrival_delays(starts, ends=[20.0]) == pytest.approx([0.4, 0.7])


def test_the_live_curve_is_the_control_planes_running_average_per_size() -> None:
    reports = [(2, 10.0), (2, 20.0), (4, 30.0), (2, 40.0)]
    expected: dict[str, float] = {}
    for size, rate in reports:
        expected = record_measurement(expected, size, rate)
    curve = live_curve(reports)
    assert curve == {2: pytest.approx(expected["2"]), 4: 30.0}
    assert curve[2] == pytest.approx(0.7 * (0.7 * 10.0 + 0.3 * 20.0) + 0.3 * 40.0)


def test_the_view_of_a_size_is_what_was_reported_there_else_the_rates_in_its_units() -> None:
    job = MeasuredJob("a", 2, 1, 4, 100, rates={2: 10.0, 4: 20.0}, seen={2: 40.0})
    assert job.view_at(2) == 40.0
    assert job.view_at(4) == pytest.approx(80.0)  # 20 steps/s x 4 reported per step/s at 2
    assert MeasuredJob("a", 2, 1, 4, 100, rates={2: 10.0, 4: 20.0}).view_at(4) == 20.0


def test_the_policy_ranks_sizes_by_the_reported_rates_not_the_free_core_ones() -> None:
    # On a free core 4 GPUs train faster than 2; as reported (crowded CPUs) they are slower.
    # "a" starts on 4 (the prior), gives 2 back to "b" at 20, and once "b" ends grows back
    # only when the policy believes 4 beats 2.
    rates = {2: 10.0, 4: 12.0}
    b = MeasuredJob("b", requested=2, min_gpus=2, max_gpus=2, steps=100, rates={2: 10.0})
    trace = [TraceJob("a", 0.0, 2, 200.0), TraceJob("b", 20.0, 2, b.duration())]

    def scale_events(seen: dict[int, float]) -> int:
        a = MeasuredJob("a", 2, 1, 4, steps=2000, rates=rates, seen=seen)
        policy = MeasuredPolicy(get_policy("elastic-tiresias"), {"a": a, "b": b}, per_tick=True)
        out = simulate(trace, policy, SimConfig(4, tick=1.0))
        return {r.id: r for r in out.jobs}["a"].scale_events

    assert scale_events({}) == 2  # 4 -> 2 for "b", 2 -> 4 after it
    assert scale_events({2: 40.0, 4: 36.0}) == 1  # 4 -> 2, and no way back


def test_a_fresh_core_per_pass_forgets_the_gain_a_past_pass_computed() -> None:
    # The same run as above with the policy shown the reported rates: a core kept for the
    # whole run still holds the scale-out candidate it pushed at 20, when "a" was known
    # only at 4 GPUs (the gain of the prior), and grows "a" back; the live tick's fresh
    # core computes the gain from the curve "a" has now.
    b = MeasuredJob("b", requested=2, min_gpus=2, max_gpus=2, steps=100, rates={2: 10.0})
    a = MeasuredJob("a", 2, 1, 4, steps=2000, rates={2: 10.0, 4: 12.0}, seen={2: 40.0, 4: 36.0})
    trace = [TraceJob("a", 0.0, 2, 200.0), TraceJob("b", 20.0, 2, b.duration())]

    def scale_events(per_tick: bool) -> int:
        policy = MeasuredPolicy(get_policy("elastic-tiresias"), {"a": a, "b": b}, per_tick=per_tick)
        out = simulate(trace, policy, SimConfig(4, tick=1.0))
        return {r.id: r for r in out.jobs}["a"].scale_events

    assert scale_events(per_tick=False) == 2
    assert scale_events(per_tick=True) == 1


def test_a_fresh_core_per_pass_decides_as_the_kept_one_when_nothing_is_learned() -> None:
    jobs = {
        "a": MeasuredJob("a", 2, 1, 4, 600, rates={1: 6.0, 2: 10.0, 3: 13.0, 4: 15.0}),
        "b": MeasuredJob("b", 2, 2, 2, 200, rates={2: 10.0}),
        "c": MeasuredJob("c", 1, 1, 2, 300, rates={1: 5.0, 2: 9.0}),
        "d": MeasuredJob("d", 3, 3, 3, 300, rates={3: 10.0}),
    }
    arrivals = {"a": 0.0, "b": 5.0, "c": 12.0, "d": 20.0}
    trace = [TraceJob(k, at, jobs[k].requested, jobs[k].duration()) for k, at in arrivals.items()]

    def ends(per_tick: bool) -> dict[str, tuple[float, float]]:
        policy = MeasuredPolicy(
            get_policy("elastic-tiresias"), jobs, learn=False, per_tick=per_tick
        )
        out = simulate(trace, policy, SimConfig(4, tick=1.0))
        return {r.id: (r.start, r.end) for r in out.jobs}

    kept, fresh = ends(per_tick=False), ends(per_tick=True)
    assert fresh.keys() == kept.keys() == jobs.keys()
    for name in jobs:
        assert fresh[name] == pytest.approx(kept[name])


def test_a_gpu_out_of_service_is_neither_counted_nor_placed() -> None:
    # 4 GPUs, one out from 5 to 50: "b" (4 GPUs, arrives at 10) waits for it to come back
    # although "a" (2 GPUs) ended at 10; "c" (2 GPUs) fits beside the outage at once.
    trace = [TraceJob("a", 0.0, 2, 10.0), TraceJob("b", 10.0, 4, 10.0), TraceJob("c", 12.0, 2, 5.0)]
    cfg = SimConfig(4, outages=(Outage(5.0, 50.0),))
    got = results(trace, cfg, policy="tiresias")
    assert got["b"].start == pytest.approx(50.0)
    assert got["c"].start == pytest.approx(12.0)
    assert results(trace, SimConfig(4), policy="tiresias")["b"].start == pytest.approx(10.0)


def test_an_outage_on_the_vclos_fabric_takes_its_own_gpu_and_waits_for_its_holder() -> None:
    spec = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)
    trace = [
        TraceJob("a", 0.0, 4, 20.0),  # leaf 0, keeps GPU 1 (the straggler's) until it ends
        TraceJob("b", 0.0, 4, 40.0),  # leaf 1
        TraceJob("c", 25.0, 4, 10.0),
    ]
    cfg = SimConfig(8, gpus_per_server=2, placement="vclos", fabric=spec)
    kept = Outage(5.0, 100.0, gpu=1, holder="a")
    got = results(trace, replace(cfg, outages=(kept,)), policy="tiresias")
    # Leaf 0 has 3 GPUs once "a" ends; "c" needs a 4-GPU shape: leaf 1, free at 40.
    assert got["c"].start == pytest.approx(40.0)
    assert results(trace, cfg, policy="tiresias")["c"].start == pytest.approx(25.0)


def test_outages_need_a_placement_that_can_take_a_gpu_out() -> None:
    cfg = SimConfig(4, placement="consolidated", outages=(Outage(0.0, 1.0),))
    with pytest.raises(ValueError, match="outages"):
        simulate([TraceJob("a", 0.0, 1, 1.0)], get_policy("fifo"), cfg)


def test_without_a_second_pass_a_refused_start_keeps_its_gpus_idle_until_the_next_tick() -> None:
    # vClos, 2 leaves of 4 GPUs: "a" (2) on leaf 0, "b" (3) on leaf 1; 3 GPUs are free but
    # a 3-GPU shape needs one leaf, so placement refuses "c" (3).  "d" (1) behind it fits:
    # a second pass starts it around "c" at once; without one (the live tick binds once)
    # "d" waits for the next pass, where the policy plans "c" again and again, until
    # "a" ends and "c" fits leaf 0.
    spec = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)
    trace = [
        TraceJob("a", 0.0, 2, 20.0),
        TraceJob("b", 0.0, 3, 100.0),
        TraceJob("c", 5.0, 3, 10.0),
        TraceJob("d", 5.0, 1, 10.0),
    ]
    cfg = SimConfig(8, gpus_per_server=2, placement="vclos", fabric=spec, tick=1.0)
    two = results(trace, cfg, policy="tiresias")
    once = Fidelity(rounds=BindingRounds.ONCE_PER_TICK)
    one = results(trace, replace(cfg, fidelity=once), policy="tiresias")
    assert two["d"].start == pytest.approx(5.0)
    assert one["d"].start == pytest.approx(20.0)
    assert one["c"].start == two["c"].start == pytest.approx(20.0)


def elastic_start_beside_a_split_gap(whole: bool) -> dict[str, JobResult]:
    """Results of "e" (2 GPUs, elastic 1-4) arriving at 5 beside "a" (2, ends at 20) on
    leaf 0 and "b" (3) on leaf 1: 2 + 1 GPUs are free, and its start with one extra (3)
    fits no shape."""
    spec = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)
    a = MeasuredJob("a", requested=2, min_gpus=2, max_gpus=2, steps=200, rates={2: 10.0})
    b = MeasuredJob("b", requested=3, min_gpus=3, max_gpus=3, steps=1000, rates={3: 10.0})
    e = MeasuredJob("e", requested=2, min_gpus=1, max_gpus=4, steps=200, rates={2: 10.0})
    jobs = {j.id: j for j in (a, b, e)}
    trace = [TraceJob("a", 0.0, 2, 20.0), TraceJob("b", 0.0, 3, 100.0), TraceJob("e", 5.0, 2, 20.0)]
    policy = MeasuredPolicy(get_policy("elastic-tiresias"), jobs, learn=False, per_tick=True)
    cfg = SimConfig(
        8,
        gpus_per_server=2,
        placement="vclos",
        fabric=spec,
        tick=1.0,
        fidelity=Fidelity(
            rounds=BindingRounds.ONCE_PER_TICK, binder=WHOLE_START if whole else BASE_THEN_EXTRAS
        ),
    )
    return {r.id: r for r in simulate(trace, policy, cfg).jobs}


def test_an_elastic_start_whose_extras_fit_no_shape_waits_whole_as_the_old_live_binder_did() -> (
    None
):
    # The policy plans "e" on 3 (its 2 and the idle GPU as an extra); no 3-GPU shape is free.
    # The simulator's default starts it on its 2 at once, as bind() now does with the
    # Start's base; the live binder the saved runs were made with refused the Start (it
    # placed the size planned or nothing), so "e" waits, planned on 3 each tick, until
    # "a" ends at 20 and leaf 0 holds 4.
    on_base = elastic_start_beside_a_split_gap(whole=False)
    whole = elastic_start_beside_a_split_gap(whole=True)
    assert on_base["e"].start == pytest.approx(5.0)
    assert whole["e"].start == pytest.approx(20.0)
    assert whole["a"].end == on_base["a"].end == pytest.approx(20.0)
