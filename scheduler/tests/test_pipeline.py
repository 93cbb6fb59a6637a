"""The scheduling pass (``scheduler.pipeline``): each step alone, then their composition."""

from __future__ import annotations

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.pipeline import (
    NO_WAITS,
    AllocatorBind,
    Candidates,
    CountBind,
    EnforceQuotas,
    NoQuotaCheck,
    NoRetry,
    NoWithinQuota,
    PolicyDecide,
    PreemptWithinQuota,
    QuotaHoldBack,
    SchedulingPass,
    Waits,
    snapshot_pass,
)
from scheduler.placement import CountPlacement
from scheduler.policies import get_policy
from scheduler.quota import Blocked, QuotaBook
from scheduler.sim_config import BindingRounds, Fidelity
from scheduler.simulation import AroundRefusals, PinsRestored, ShownAsOwned
from scheduler.simulator import LIVE_TICK, SimConfig, Simulation
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.traces import TraceJob
from scheduler.types import Decision, Migrate, Preempt, Scale, Snapshot, Start

QUOTAS = {"a": 4, "b": 8}


def tenants_scenario() -> Snapshot:
    """8 GPUs.  Tenant ``a`` (quota 4) runs a low-class job on 4 of them and queues a
    high-class one of 2; tenant ``b`` (quota 8) queues a normal one of 4."""
    busy = dict.fromkeys(range(4), "a-low")
    return snapshot(
        10.0,
        cluster(busy=busy),
        running("a-low", (0, 1, 2, 3), tenant="a", priority=10, queue_since=0.0),
        queued("a-high", 2, submit=5.0, tenant="a", priority=90),
        queued("b-job", 4, submit=6.0, tenant="b", priority=50),
    )


# -- 1. hold-back ------------------------------------------------------------------------


def test_the_hold_back_leaves_out_queued_jobs_over_their_tenants_quota() -> None:
    candidates, waits = QuotaHoldBack(QUOTAS).hold_back(tenants_scenario())
    assert [v.id for v in candidates.snapshot.jobs] == ["a-low", "b-job"]
    assert waits == {"a-high": "tenant a holds 4 of its 4-GPU quota"}
    assert candidates.blocked == (Blocked("a-high", "a", 90, 2),)
    assert candidates.book == QuotaBook(quota=QUOTAS, in_use={"a": 4})


def test_a_running_job_counts_what_it_holds_up_to_its_request() -> None:
    # a-big holds 6 GPUs but asked for 2: its tenant uses 2 of 4, so a 2-GPU job fits.
    state = snapshot(
        0.0,
        cluster(busy=dict.fromkeys(range(6), "a-big")),
        running("a-big", tuple(range(6)), tenant="a", requested_gpus=2),
        queued("a-next", 2, tenant="a", min_gpus=2),
        queued("a-more", 4, tenant="a", min_gpus=3),
    )
    candidates, waits = QuotaHoldBack({"a": 4}).hold_back(state)
    assert [v.id for v in candidates.snapshot.jobs] == ["a-big", "a-next"]
    assert waits == {"a-more": "tenant a holds 2 of its 4-GPU quota"}  # 2 + its minimum 3 > 4


def test_without_quotas_every_job_is_a_candidate() -> None:
    state = tenants_scenario()
    candidates, waits = QuotaHoldBack(None).hold_back(state)
    assert candidates == Candidates(state) and waits == {}


# -- 2. decide -----------------------------------------------------------------------------


def test_decide_is_the_policys_own_schedule_on_the_candidates() -> None:
    policy = get_policy("tiresias")
    candidates, _ = QuotaHoldBack(QUOTAS).hold_back(tenants_scenario())
    decided = PolicyDecide(policy).decide(candidates)
    assert decided == policy.schedule(candidates.snapshot, placement=CountPlacement())
    assert decided == [Start("b-job", (4, 5, 6, 7))]


# -- 3. quota check --------------------------------------------------------------------------


def test_the_quota_check_cuts_or_drops_starts_over_quota_and_says_why() -> None:
    # b's job may start on 2 (its minimum fits b's quota of 3: a candidate), but the
    # policy starts it on 4, over the quota: it starts on the 3 that fit (or on 2, its
    # minimum, where no shape has 3).
    state = snapshot(0.0, cluster(), queued("b-job", 4, tenant="b", min_gpus=2))
    candidates, _ = QuotaHoldBack({"b": 3}).hold_back(state)
    start: list[Decision] = [Start("b-job", (4, 5, 6, 7))]
    assert EnforceQuotas().check(candidates, start) == ([Start("b-job", (4, 5, 6), 2)], {})
    # A job with no minimum starts whole or not at all.
    rigid = snapshot(0.0, cluster(), queued("b-job", 2, tenant="b"), queued("b-2", 2, tenant="b"))
    candidates, _ = QuotaHoldBack({"b": 3}).hold_back(rigid)
    both: list[Decision] = [Start("b-job", (4, 5)), Start("b-2", (6, 7))]
    kept, waits = EnforceQuotas().check(candidates, both)
    assert kept == both[:1] and waits == {"b-2": "tenant b holds 2 of its 3-GPU quota"}


def test_without_a_book_the_quota_check_keeps_every_decision() -> None:
    decisions: list[Decision] = [Start("b-job", (4, 5, 6, 7))]
    assert EnforceQuotas().check(Candidates(tenants_scenario()), decisions) == (decisions, {})
    assert NoQuotaCheck[list[Decision]]().check(None, decisions) == (decisions, NO_WAITS)


# -- 4. within a tenant's quota ----------------------------------------------------------------


def test_a_held_back_higher_class_stops_its_own_tenants_lower_class_job() -> None:
    candidates, _ = QuotaHoldBack(QUOTAS).hold_back(tenants_scenario())
    policy_said: list[Decision] = [Scale("a-low", (0, 1, 2, 3, 4)), Start("b-job", (5, 6, 7, 8))]
    decisions, waits, stopped = PreemptWithinQuota().make_room(candidates, policy_said)
    assert decisions == [Start("b-job", (5, 6, 7, 8)), Preempt("a-low")]  # its Scale replaced
    assert waits == {
        "a-high": "stopping a-low (a lower class of tenant a) to fit under its 4-GPU quota"
    }
    assert "quota for a-high" in stopped["a-low"] and "checkpoint" in stopped["a-low"]


def test_nothing_is_stopped_when_nobody_is_held_back() -> None:
    candidates, _ = QuotaHoldBack(None).hold_back(tenants_scenario())
    decisions: list[Decision] = [Start("b-job", (4, 5, 6, 7))]
    assert PreemptWithinQuota().make_room(candidates, decisions) == (decisions, {}, {})
    assert NoWithinQuota[list[Decision]]().make_room(None, decisions) == (decisions, {}, {})


# -- 5. bind ---------------------------------------------------------------------------------


def test_binding_on_the_allocator_places_and_says_why_it_refused() -> None:
    spec = FabricSpec(leaves=1, spines=8, servers_per_leaf=1, gpus_per_server=8)
    allocator = VClosAllocator(spec)
    decisions: list[Decision] = [Start("j", (0, 1, 2, 3)), Start("k", tuple(range(8)))]
    binding, waits = AllocatorBind(spec, allocator).bind(None, decisions)
    assert [b.job for b in binding.bound] == ["j"]
    assert [r.job for r in binding.refused] == ["k"]
    assert waits == {"k": binding.refused[0].reason} and waits["k"]
    assert set(allocator.allocations()) == {"j"}  # the allocator ends in the bound state


def test_binding_by_count_leaves_out_migrations() -> None:
    decisions: list[Decision] = [Migrate("m", (0, 1)), Start("s", (2,))]
    assert CountBind().bind(None, decisions) == ([Start("s", (2,))], {})


# -- 6. retry --------------------------------------------------------------------------------


def test_the_tick_and_the_forecast_never_retry() -> None:
    assert NoRetry().again(None, None, 0) is False


def test_the_simulators_steps_follow_its_fidelity() -> None:
    trace = [TraceJob("j", 0.0, 2, 10.0)]
    ideal = Simulation(trace, get_policy("tiresias"), SimConfig(total_gpus=8))
    live = SimConfig(total_gpus=8, grow_min_left_s=30.0, fidelity=LIVE_TICK)
    tick = Simulation(trace, get_policy("tiresias"), live)
    # The simulator's own rules: nothing shown otherwise, the core decides, a second round.
    assert ideal.scheduling.hold_back is None
    assert ideal.scheduling.decide is ideal.core
    assert isinstance(ideal.scheduling.retry, AroundRefusals)
    assert ideal.scheduling.quota_check is None  # no quotas in the simulator: no step to call
    assert ideal.scheduling.within_quota is None
    # The live tick's: what the runtime owns shown, the pins given back, one round.
    assert isinstance(tick.scheduling.hold_back, ShownAsOwned)
    assert isinstance(tick.scheduling.decide, PinsRestored)
    assert tick.scheduling.retry is None
    once = Fidelity(rounds=BindingRounds.ONCE_PER_TICK)
    one = Simulation(trace, get_policy("tiresias"), SimConfig(total_gpus=8, fidelity=once))
    assert one.scheduling.retry is None and one.scheduling.decide is one.core


def test_a_pass_without_quota_steps_binds_the_policys_decisions_as_they_are() -> None:
    # The hold-back still holds a's high job; with no within-quota step left in the pass,
    # nothing of a's is stopped for it and its hold-back reason stands.
    scheduling: SchedulingPass[Snapshot, Candidates, list[Decision], list[Decision]] = (
        SchedulingPass(
            hold_back=QuotaHoldBack(QUOTAS),
            decide=PolicyDecide(get_policy("tiresias")),
            quota_check=None,
            within_quota=None,
            bind=CountBind(),
        )
    )
    result = scheduling.run(tenants_scenario())
    assert result.decisions == [Start("b-job", (4, 5, 6, 7))]
    assert result.bound == (result.decisions,)
    assert result.waits == {"a-high": "tenant a holds 4 of its 4-GPU quota"}
    assert result.stopped == {}


def test_the_simulators_pass_works_on_the_time_and_leaves_what_moved_to_the_loop() -> None:
    trace = [TraceJob("a", 0.0, 2, 10.0), TraceJob("b", 5.0, 2, 10.0)]
    sim = Simulation(trace, get_policy("tiresias"), SimConfig(total_gpus=8))
    sim._arrivals(0.0)
    first = sim.scheduling.run(0.0)
    assert first.candidates == 0.0 and first.bound == ([],)  # "a" placed, nothing refused
    assert sim.binding.moved and sim.binding.fresh == []  # no start-up cost: none to charge
    sim.binding.moved = False
    empty = sim.scheduling.run(1.0)  # nothing to decide: the shared empty outcome
    assert (empty.decisions, empty.bound, empty.waits) == ([], ((),), {})
    assert not sim.binding.moved


# -- the composition -------------------------------------------------------------------------


def test_the_pass_holds_back_decides_checks_makes_room_and_binds() -> None:
    scheduling = snapshot_pass(
        QuotaHoldBack(QUOTAS), PolicyDecide(get_policy("tiresias")), CountBind()
    )
    result = scheduling.run(tenants_scenario())
    assert result.decisions == [Start("b-job", (4, 5, 6, 7)), Preempt("a-low")]
    assert result.bound == ([Start("b-job", (4, 5, 6, 7)), Preempt("a-low")],)
    # The within-quota step's reason replaces the hold-back's for the job it serves.
    assert result.waits == {
        "a-high": "stopping a-low (a lower class of tenant a) to fit under its 4-GPU quota"
    }
    assert set(result.stopped) == {"a-low"}


def test_the_pass_says_why_every_job_left_out_waits() -> None:
    # a's high job is held back and nothing of a lower class of a runs to stop for it;
    # b's two jobs are candidates (each fits alone) but the second start is over b's quota.
    state = snapshot(
        0.0,
        cluster(busy=dict.fromkeys(range(4), "a-first")),
        running("a-first", (0, 1, 2, 3), tenant="a", priority=90),
        queued("a-high", 2, tenant="a", priority=90),
        queued("b-job", 2, tenant="b"),
        queued("b-2", 2, submit=1.0, tenant="b"),
    )
    scheduling = snapshot_pass(
        QuotaHoldBack({"a": 4, "b": 3}), PolicyDecide(get_policy("fifo")), CountBind()
    )
    result = scheduling.run(state)
    assert result.decisions == [Start("b-job", (4, 5))] and result.stopped == {}
    assert result.waits == {
        "a-high": "tenant a holds 4 of its 4-GPU quota",
        "b-2": "tenant b holds 2 of its 3-GPU quota",
    }


class _Rounds:
    """Decide, bind and retry steps that count their rounds (a caller's own steps)."""

    def __init__(self) -> None:
        self.decided = 0

    def decide(self, candidates: Candidates) -> list[Decision]:
        self.decided += 1
        return [Start(f"round-{self.decided}", (self.decided,))]

    def bind(self, candidates: Candidates, decisions: list[Decision]) -> tuple[str, Waits]:
        return decisions[0].job, {decisions[0].job: "refused"}

    def again(self, candidates: Candidates, outcome: str, rounds: int) -> bool:
        return rounds < 2


def test_the_retry_step_decides_and_binds_again_and_the_last_rounds_waits_stand() -> None:
    steps = _Rounds()
    scheduling: SchedulingPass[Snapshot, Candidates, list[Decision], str] = SchedulingPass(
        hold_back=QuotaHoldBack(None),
        decide=steps,
        quota_check=EnforceQuotas(),
        within_quota=PreemptWithinQuota(),
        bind=steps,
        retry=steps,
    )
    result = scheduling.run(tenants_scenario())
    assert result.bound == ("round-1", "round-2", "round-3")
    assert result.decisions == [Start("round-3", (3,))]
    assert result.waits == {"round-3": "refused"}
