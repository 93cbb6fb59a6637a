"""The simulator's fixed costs and the CPU-sharing model: start-up, end, switches, busy slots."""

from __future__ import annotations

import pytest

from devtools.measured import MeasuredJob, MeasuredPolicy
from scheduler.policies import get_policy
from scheduler.sim_config import (
    BindingRounds,
    EndingJobs,
    Fidelity,
    LeaversSlots,
    StartUpScaleIn,
)
from scheduler.simulator import ScalingCost, SimConfig, simulate
from scheduler.traces import TraceJob


def jcts(trace: list[TraceJob], cfg: SimConfig, policy: str = "fifo") -> dict[str, float]:
    return {r.id: r.jct for r in simulate(trace, get_policy(policy), cfg).jobs}


def test_a_first_start_holds_the_gpus_without_progress_per_workload() -> None:
    trace = [
        TraceJob("r", 0.0, 2, 100.0, model="resnet50"),
        TraceJob("v", 0.0, 2, 100.0, model="vgg16"),
    ]
    cost = ScalingCost(first_start_s=10.0, first_start_by_model={"resnet50": 5.0})
    assert jcts(trace, SimConfig(4, cost=cost)) == {"r": 105.0, "v": 110.0}
    assert jcts(trace, SimConfig(4)) == {"r": 100.0, "v": 100.0}  # default: free


def test_the_end_of_a_job_holds_its_gpus_and_the_next_job_waits() -> None:
    trace = [TraceJob("a", 0.0, 4, 100.0), TraceJob("b", 0.0, 4, 50.0)]
    result = simulate(trace, get_policy("fifo"), SimConfig(4, cost=ScalingCost(finish_s=3.0)))
    by_id = {r.id: r for r in result.jobs}
    assert by_id["a"].jct == pytest.approx(103.0)
    assert by_id["a"].run_time == pytest.approx(103.0)  # the tail is time on the GPUs
    assert by_id["b"].start == pytest.approx(103.0)
    assert by_id["b"].jct == pytest.approx(156.0)


def test_busy_slots_stretch_every_running_job() -> None:
    # Factor 2 with 2 GPUs busy, 4 with 4: "a" alone runs at half speed, then at a quarter.
    cfg = SimConfig(4, slot_slowdown=(1.0, 1.0, 2.0, 3.0, 4.0))
    assert jcts([TraceJob("a", 0.0, 2, 100.0)], cfg) == {"a": pytest.approx(200.0)}
    trace = [TraceJob("a", 0.0, 2, 100.0), TraceJob("b", 50.0, 2, 100.0)]
    # a: 25 done by 50, 75 more at 1/4 (ends 350); b: 75 by 350, 25 more at 1/2 alone.
    assert jcts(trace, cfg) == {"a": pytest.approx(350.0), "b": pytest.approx(350.0)}


def test_a_first_start_stretches_with_the_busy_slots_it_leaves() -> None:
    cost = ScalingCost(first_start_s=10.0)
    cfg = SimConfig(4, cost=cost, start_slowdown=(1.0, 1.0, 1.5, 1.5, 3.0))
    assert jcts([TraceJob("a", 0.0, 2, 100.0)], cfg) == {"a": pytest.approx(115.0)}
    both = [TraceJob("a", 0.0, 2, 100.0), TraceJob("b", 0.0, 2, 100.0)]
    assert jcts(both, cfg) == {"a": pytest.approx(130.0), "b": pytest.approx(130.0)}
    # "b" arrives while "a" starts: 5 s at 1.5 did 10/3 of a's 10 free-core seconds, the
    # rest goes at 3 (20 s more), so "a" trains from 25.
    late = [TraceJob("a", 0.0, 2, 100.0), TraceJob("b", 5.0, 2, 100.0)]
    assert jcts(late, cfg) == {"a": pytest.approx(125.0), "b": pytest.approx(130.0)}


def elastic_pair(
    cost: ScalingCost | None = None, grow_min_left_s: float = 0.0, extra: tuple[TraceJob, ...] = ()
) -> dict[str, float]:
    """End times: "a" (1-2-4, 10 steps/s on 2, 20 on 4, 1,000 steps) beside "b" (2 GPUs, 30 s).

    "a" starts on 2 and, when "b" ends at 30, grows to 4: 300 steps by then,
    700 left at 20 steps/s, so it ends at 65 when growing costs nothing.
    ``extra`` jobs are rigid 2-GPU jobs of 10 steps/s.
    """
    a = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=1000, rates={2: 10.0, 4: 20.0})
    b = MeasuredJob("b", requested=2, min_gpus=2, max_gpus=2, steps=300, rates={2: 10.0})
    trace = [TraceJob("a", 0.0, 2, a.duration()), TraceJob("b", 0.0, 2, b.duration()), *extra]
    jobs = {"a": a, "b": b}
    for job in extra:
        jobs[job.id] = MeasuredJob(job.id, 2, 2, 2, round(job.duration * 10), {2: 10.0})
    policy = MeasuredPolicy(get_policy("elastic-tiresias"), jobs, learn=False)
    cfg = SimConfig(4, tick=1.0, cost=cost or ScalingCost(), grow_min_left_s=grow_min_left_s)
    return {r.id: r.end for r in simulate(trace, policy, cfg).jobs}


def test_a_scale_out_trains_at_the_old_size_until_its_newcomers_join() -> None:
    assert elastic_pair()["a"] == pytest.approx(65.0)
    joining = ScalingCost("stop_free", broadcast_s=0.0, join_s=10.0)
    # 30-40 still at 10 steps/s: 100 steps, then 600 at 20 steps/s.
    assert elastic_pair(cost=joining)["a"] == pytest.approx(70.0)


def test_a_job_in_a_switch_keeps_its_size_until_the_switch_is_done() -> None:
    late = (TraceJob("c", 35.0, 2, 10.0),)  # 100 steps at 10 steps/s
    # Free switches: "a" gives its extras back at once and "c" starts on arrival.
    assert elastic_pair(extra=late)["c"] == pytest.approx(45.0)
    joining = ScalingCost("stop_free", broadcast_s=0.0, join_s=10.0)
    # "a" is switching 2->4 until 40: the scale-in "c" needs waits for it.
    assert elastic_pair(cost=joining, extra=late)["c"] == pytest.approx(50.0)


def test_no_scale_out_for_a_job_about_to_end() -> None:
    # At 30 "a" has 70 s left on 2 GPUs: a 100 s rule keeps it there, a 60 s one does not.
    assert elastic_pair(grow_min_left_s=100.0)["a"] == pytest.approx(100.0)
    assert elastic_pair(grow_min_left_s=60.0)["a"] == pytest.approx(65.0)


def test_switch_times_follow_the_start_up() -> None:
    cost = ScalingCost(join_s=20.0, leave_s=2.0)
    # A scale-out decided during a 30 s start-up is done once both are over.
    assert cost.switch_end(10.0, 30.0, 2, 4) == 30.0
    assert cost.switch_end(10.0, 10.0, 2, 4) == 30.0
    # A scale-in: 2 s after the job trains.
    assert cost.switch_end(10.0, 30.0, 4, 2) == 32.0
    assert cost.switch_end(10.0, 10.0, 4, 2) == 12.0
    assert ScalingCost().switch_end(10.0, 30.0, 2, 4) == 10.0  # no switch times: at once
    assert cost.join_pause(10.0, 20.0, 10.0) == pytest.approx(5.0)
    assert cost.join_pause(20.0, 10.0, 10.0) == 0.0  # no faster: nothing lost
    assert cost.join_pause(10.0, 20.0, 0.0) == 0.0  # joined within the start-up


def test_a_scale_out_during_the_start_up_costs_only_what_outlasts_it() -> None:
    # "a" starts for 20 s; "b" (1 s start-up, 4 s of work) ends at 5 and "a" grows to 4 then.
    a = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=1000, rates={2: 10.0, 4: 20.0})
    b = MeasuredJob("b", requested=2, min_gpus=2, max_gpus=2, steps=40, rates={2: 10.0})
    trace = [
        TraceJob("a", 0.0, 2, a.duration(), model="slow"),
        TraceJob("b", 0.0, 2, b.duration(), model="fast"),
    ]
    policy = MeasuredPolicy(get_policy("elastic-tiresias"), {"a": a, "b": b}, learn=False)

    def end_of_a(join_s: float) -> float:
        cost = ScalingCost(
            "stop_free",
            broadcast_s=0.0,
            join_s=join_s,
            first_start_by_model={"slow": 20.0, "fast": 1.0},
        )
        result = simulate(trace, policy, SimConfig(4, tick=1.0, cost=cost))
        return {r.id: r.end for r in result.jobs}["a"]

    # Joined before "a" trains: 1,000 steps at 20 steps/s from 20.
    assert end_of_a(10.0) == pytest.approx(70.0)
    # Joined at 35: 20-35 at 10 steps/s, the remaining 850 at 20 steps/s.
    assert end_of_a(30.0) == pytest.approx(77.5)


BUSY = LeaversSlots.BUSY_UNTIL_GONE
AFTER_START_UP = StartUpScaleIn.AFTER_START_UP


def scale_in_during_start_up(
    leavers: LeaversSlots = LeaversSlots.FREE_AT_DECISION,
    scale_in: StartUpScaleIn = StartUpScaleIn.DUE_AS_DECIDED,
) -> dict[str, float]:
    """End times: "a" (1-2-4, 10 steps/s on 2, 20 on 4) starts alone on 4 with a 10 s start-up;
    "c" (2 GPUs, 100 steps, no start-up) arrives at 5 and "a" gives it 2 GPUs.

    The scale-in's leavers run until ``leave_s`` (4 s) after "a" trains; the
    CPUs take 4 busy slots at factor 1, 5 or more at factor 2 (steps and
    start-ups alike).
    """
    a = MeasuredJob("a", requested=2, min_gpus=1, max_gpus=4, steps=1000, rates={2: 10.0, 4: 20.0})
    c = MeasuredJob("c", requested=2, min_gpus=2, max_gpus=2, steps=100, rates={2: 10.0})
    trace = [
        TraceJob("a", 0.0, 2, a.duration(), model="slow"),
        TraceJob("c", 5.0, 2, c.duration(), model="fast"),
    ]
    policy = MeasuredPolicy(get_policy("elastic-tiresias"), {"a": a, "c": c}, learn=False)
    cost = ScalingCost(
        "stop_free", broadcast_s=0.0, leave_s=4.0, first_start_by_model={"slow": 10.0, "fast": 0.0}
    )
    shared = (1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0)
    cfg = SimConfig(
        4,
        tick=1.0,
        cost=cost,
        slot_slowdown=shared,
        start_slowdown=shared,
        fidelity=Fidelity(leavers=leavers, start_up_scale_in=scale_in),
    )
    return {r.id: r.end for r in simulate(trace, policy, cfg).jobs}


def test_the_leavers_of_a_scale_in_share_the_cpus_until_their_switch_is_done() -> None:
    # Off (the default): 4 slots busy throughout, nothing stretches. "c" runs 5-15; "a"
    # trains from 10 on 2 (50 steps), then on 4 from 15: 950 steps at 20 steps/s.
    assert scale_in_during_start_up() == {"a": pytest.approx(62.5), "c": pytest.approx(15.0)}
    # On: "a"'s 2 leavers run until 14 (its start-up's end as due at 5, plus 4 s): 6 busy
    # slots, factor 2. "c" does 45 steps by 14 and ends at 19.5; "a"'s last 5 free-core
    # seconds of start-up take 9 s at 2 and 0.5 s at 1 (it trains from 14.5).
    assert scale_in_during_start_up(BUSY) == {
        "a": pytest.approx(67.0),
        "c": pytest.approx(19.5),
    }


def test_a_scale_in_during_a_start_up_is_done_after_the_start_up_as_stretched() -> None:
    # The leavers stretch "a"'s start-up to 15, so its scale-in is done at 19, not 14: 6
    # slots busy until 19. "c": 70 steps by 19, 30 more by 22; "a": 20 steps 15-19, 30 by
    # 22, then 950 on 4.
    assert scale_in_during_start_up(BUSY, AFTER_START_UP) == {
        "a": pytest.approx(69.5),
        "c": pytest.approx(22.0),
    }
    # Without busy leavers nothing stretches the start-up: the same as off.
    assert scale_in_during_start_up(scale_in=AFTER_START_UP) == {
        "a": pytest.approx(62.5),
        "c": pytest.approx(15.0),
    }


def ending_beside_a_grower(cap: bool, left: float = 20.0) -> dict[str, float]:
    """End times: "e" (400 steps, ends at 40) and "g" (2,000 steps) on 2 GPUs each, beside
    "b" (2 GPUs, ends at 30); "e" gains more from 4 GPUs than "g" does."""
    e = MeasuredJob("e", requested=2, min_gpus=1, max_gpus=4, steps=400, rates={2: 10.0, 4: 25.0})
    g = MeasuredJob("g", requested=2, min_gpus=1, max_gpus=4, steps=2000, rates={2: 10.0, 4: 20.0})
    b = MeasuredJob("b", requested=2, min_gpus=2, max_gpus=2, steps=300, rates={2: 10.0})
    jobs = {"e": e, "g": g, "b": b}
    trace = [TraceJob(j.id, 0.0, 2, j.duration()) for j in (e, g, b)]
    policy = MeasuredPolicy(get_policy("elastic-tiresias"), jobs, learn=False, per_tick=True)
    fidelity = Fidelity(
        rounds=BindingRounds.ONCE_PER_TICK,
        ending=EndingJobs.SHOWN_CAPPED if cap else EndingJobs.GROWTH_REFUSED,
    )
    cfg = SimConfig(6, tick=1.0, grow_min_left_s=left, fidelity=fidelity)
    return {r.id: r.end for r in simulate(trace, policy, cfg).jobs}


def test_a_job_about_to_end_is_capped_for_the_policy_so_the_next_one_grows() -> None:
    # Without the end rule "e" takes b's GPUs at 30 (ends 34) and "g" grows at 34.
    assert ending_beside_a_grower(cap=False, left=0.0) == pytest.approx(
        {"b": 30.0, "e": 34.0, "g": 117.0}
    )
    # At 30 "e" has 10 s left: the rule as a refusal keeps the GPUs idle until "e" ends
    # (the policy keeps choosing "e"); "g" grows at 40: 400 steps by then, 1,600 at 20/s.
    assert ending_beside_a_grower(cap=False)["g"] == pytest.approx(120.0)
    # As the live snapshot shows it (capped at its size), "g" grows at 30: 300 + 1,700 at 20/s.
    assert ending_beside_a_grower(cap=True) == pytest.approx({"b": 30.0, "e": 40.0, "g": 115.0})
