"""The runtime's timing logic and message checks, driven by a manual clock (no sleeping).

The leader runs here in the test's thread (``tick()`` called by hand) against
the real Redis, reading a stand-in for its worker (``JobView``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

from workers.clock import ManualClock
from workers.elastic.cli import WorkerOptions, parse_options
from workers.elastic.constants import BEAT_S
from workers.elastic.control import JobControl
from workers.elastic.keys import JobKeys
from workers.elastic.leader import Leader
from workers.elastic.lease import Lease
from workers.elastic.messages import (
    PreparePlan,
    StopPlan,
    SwitchPlan,
    plan_from_json,
    reply_from_json,
    request_from_entry,
)
from workers.elastic.reporting import PROGRESS_EVERY_S
from workers.elastic.timing import StepTimes
from workers.schema import ProtocolError


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture
def job(redis_url: str) -> Iterator[str]:
    name = f"clk{uuid.uuid4().hex[:8]}"
    yield name
    JobControl(redis_url, name).cleanup()


@dataclass
class View:
    """A worker as the leader sees it, set by the test."""

    me: str
    opts: WorkerOptions
    keys: JobKeys
    state: str = "running"
    generation: int = 0
    members: list[str] = field(default_factory=list)
    step: int = 0
    epoch: int = 0
    last_loss: float = 0.5
    t_b: float = 0.1
    times: StepTimes = field(default_factory=StepTimes)

    @property
    def world(self) -> int:
        return len(self.members)

    def batch_time(self) -> float:
        return self.t_b

    def throughput_since(self, step: int) -> tuple[int, float]:
        return self.times.throughput_since(step)

    def commit(self, clock: ManualClock, seconds: float) -> None:
        """One mini-batch of ``seconds`` on the clock, committed as the worker does."""
        clock.advance(seconds)
        self.step += 1
        self.times.mark(self.step, clock.monotonic())


def make_leader(redis_url: str, job: str, clock: ManualClock) -> tuple[Leader, View]:
    opts = parse_options(
        ["--job", job, "--worker", "w0", "--workload", "mlp-digits", "--batch-size", "32",
         "--checkpoint-dir", "/tmp/unused", "--redis-url", redis_url, "--sync-timeout", "10"]
    )  # fmt: skip
    view = View(me="w0", opts=opts, keys=JobKeys(job), members=["w0", "w1"])
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(view.keys.leader, "w0")
    return Leader(view, client, clock), view


def events(redis_url: str, job: str, kind: str) -> list[dict[str, object]]:
    return [e for _id, e in JobControl(redis_url, job).read_events() if e["kind"] == kind]


def test_step_times_give_the_median_batch_and_the_throughput() -> None:
    clock, times = ManualClock(), StepTimes()
    for step, gap in enumerate([0.1, 0.3, 0.2, 0.2], start=1):
        clock.advance(gap)
        times.mark(step, clock.monotonic())
    assert times.batch_time() == pytest.approx(0.2)
    batches, seconds = times.throughput_since(2)
    assert batches == 2 and seconds == pytest.approx(0.4)
    assert times.throughput_since(99) == (0, 0.0)


def test_a_replay_after_a_recovery_starts_the_step_timeline_again() -> None:
    """Steps replayed from a checkpoint replace the ones that ended before the failure."""
    clock, times = ManualClock(), StepTimes()
    for step in range(1, 11):
        clock.advance(0.1)
        times.mark(step, clock.monotonic())
    clock.advance(4.0)  # the failure and the recovery, back to the checkpoint of step 5
    for step in range(6, 10):
        clock.advance(0.2)
        times.mark(step, clock.monotonic())
    assert times.throughput_since(6) == pytest.approx((3, 0.6))
    assert times.throughput_since(8) == pytest.approx((1, 0.2))
    assert times.throughput_since(4) == pytest.approx((5, 5.4))  # across it: 0.6 + 4.0 + 0.8


def test_a_profile_right_after_a_consistent_recovery_measures_the_replayed_steps(
    redis_url: str, job: str
) -> None:
    """profile(2, 3) after a recovery: each level's rate is its own mini-batches' rate.

    The benchmark's run once gave 3 workers 11 samples/s and 2 workers 64: the
    level of 3 was measured from the end of the same step number before the
    failure, across the recovery's seconds.
    """
    clock = ManualClock()
    leader, view = make_leader(redis_url, job, clock)
    view.members = ["w0", "w1", "w2"]
    for _ in range(57):
        view.commit(clock, 0.25)
    clock.advance(3.5)  # a worker killed, the survivors back to the checkpoint of step 50
    view.step = 50
    JobControl(redis_url, job).request_profile(2, 3, batches_per_level=4)
    leader.tick()
    assert leader.profiler.active
    for _ in range(6):  # 2 warm-up mini-batches, then the 4 measured ones
        view.commit(clock, 0.25)
    leader.tick()
    assert leader.meta.curve == {"3": pytest.approx(32 / 0.25)}  # batch 32 every 0.25 s
    assert leader.op is not None and leader.op.plan is not None
    assert leader.op.plan.leavers == ("w2",)  # the next level, 2 workers


def test_the_next_generation_follows_the_latest_rank_order_survivors_included(
    redis_url: str, job: str
) -> None:
    """A re-plan's order (``set_rank_order``) outranks what each worker was told at its start."""
    clock = ManualClock()
    leader, _view = make_leader(redis_url, job, clock)
    control = JobControl(redis_url, job)
    leader.redis.hset(leader.keys.ranks(), mapping={"w0": 0, "w1": 1})  # the first plan
    leader.redis.rpush(leader.keys.rpc, '{"op": "register", "worker": "w2"}')
    control.set_rank_order(["w2", "w1", "w0"])  # the new plan: the newcomer first
    leader.tick()
    plan = plan_from_json(str(leader.redis.get(leader.keys.plan(leader.published_seq))))
    assert isinstance(plan, PreparePlan)
    assert plan.members == ("w2", "w1", "w0") and plan.joiners == ("w2",)
    assert plan.source == 1  # the first member that holds the state
    assert leader.redis.hgetall(leader.keys.ranks()) == {"w2": "0", "w1": "1", "w0": "2"}


def test_without_a_rank_order_the_workers_own_ranks_still_order_the_job(
    redis_url: str, job: str
) -> None:
    """An older control plane sends no order: the ranks the workers wrote at start apply."""
    leader, _view = make_leader(redis_url, job, ManualClock())
    leader.redis.hset(leader.keys.ranks(), mapping={"w0": 1, "w1": 2, "w2": 0})
    leader.redis.rpush(leader.keys.rpc, '{"op": "register", "worker": "w2"}')
    leader.tick()
    plan = plan_from_json(str(leader.redis.get(leader.keys.plan(leader.published_seq))))
    assert isinstance(plan, PreparePlan) and plan.members == ("w2", "w0", "w1")


def test_lease_is_refreshed_at_most_every_beat_and_lost_to_another_holder(
    redis_url: str, job: str
) -> None:
    clock = ManualClock()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = JobKeys(job)
    lease = Lease(client, keys, "w0", clock)
    assert lease.take() and lease.is_mine()
    client.set(keys.leader, "w1")  # someone else holds it now
    assert lease.refresh()  # within the beat: no round trip, nothing noticed yet
    clock.advance(BEAT_S + 0.01)
    assert not lease.refresh()
    client.set(keys.leader, "w0", px=1000)
    assert lease.refresh()
    clock.advance(BEAT_S + 0.01)
    assert lease.refresh() and int(client.pttl(keys.leader)) > 1000  # extended


def test_a_generation_that_never_gets_ready_is_given_up_on_the_clock(
    redis_url: str, job: str
) -> None:
    clock = ManualClock()
    leader, view = make_leader(redis_url, job, clock)
    leader.prepare([], ["w2"], "scale_out")
    assert leader.op is not None and leader.op.phase == "prepare"
    patience = 2 * view.opts.sync_timeout_s + 30
    clock.advance(patience - 1)
    leader.tick()
    assert leader.op is not None and leader.op.phase == "prepare"
    clock.advance(2)
    leader.tick()
    assert leader.op is None
    assert leader.redis.hget(leader.keys.meta, "state") == "running"


def test_ready_members_get_a_switch_step_from_the_batch_time(redis_url: str, job: str) -> None:
    clock = ManualClock()
    leader, _view = make_leader(redis_url, job, clock)
    leader.prepare([], ["w2"], "scale_out")
    reply = reply_from_json(str(leader.redis.lpop(leader.keys.reply("w2"))))
    assert isinstance(reply, PreparePlan) and reply.members == ("w0", "w1", "w2")
    leader.redis.sadd(leader.keys.ready(reply.generation), "w0", "w1", "w2")
    leader.tick()
    switch = plan_from_json(str(leader.redis.get(leader.keys.plan(leader.published_seq))))
    assert isinstance(switch, SwitchPlan) and switch.k == 5  # ceil(500 ms / 100 ms)


def test_progress_is_reported_at_most_every_half_second(redis_url: str, job: str) -> None:
    clock = ManualClock()
    leader, view = make_leader(redis_url, job, clock)
    for _ in range(3):
        view.step += 1
        leader.on_step()
    assert len(events(redis_url, job, "progress")) == 1
    clock.advance(PROGRESS_EVERY_S)
    view.step += 1
    leader.on_step()
    progress = events(redis_url, job, "progress")
    assert [e["step"] for e in progress] == [1, 4]


def test_a_malformed_control_request_is_dropped_and_the_next_one_served(
    redis_url: str, job: str
) -> None:
    clock = ManualClock()
    leader, _view = make_leader(redis_url, job, clock)
    control = JobControl(redis_url, job)
    control.redis.xadd(control.keys.control, {"kind": "scale_in", "payload": '{"reason": 3}'})
    control.redis.xadd(control.keys.control, {"kind": "reboot", "payload": "{}"})
    control.request_stop("enough")
    leader.tick()
    plan = plan_from_json(str(leader.redis.get(leader.keys.plan(leader.published_seq))))
    assert isinstance(plan, StopPlan) and plan.reason == "enough" and plan.k == 5
    assert leader.meta.queue == []


def test_a_scale_in_of_workers_that_are_not_members_is_dropped_and_said(
    redis_url: str, job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A control plane waiting for such a switch would wait for ever: the worker log says why."""
    clock = ManualClock()
    leader, _view = make_leader(redis_url, job, clock)
    control = JobControl(redis_url, job)
    control.request_scale_in(["w7", "w9"], "shrink by 2")
    leader.tick()
    assert leader.meta.queue == [] and leader.op is None
    assert "shrink by 2: none of ['w7', 'w9'] is a member" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"kind": "switch", "generation": 1}', "switch: missing field"),
        ('{"kind": "explode"}', "unknown plan kind 'explode'"),
        ('{"kind": "prepare", "generation": 1, "base_generation": 0, "members": []}', "members"),
        (
            '{"kind": "stop", "base_generation": 0, "k": "soon"}',
            "stop.k must be an integer",
        ),
        ("not json", "not JSON"),
    ],
)
def test_malformed_plans_are_refused_with_a_clear_error(raw: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        plan_from_json(raw)


def test_control_entries_round_trip_the_control_api_payloads() -> None:
    request = request_from_entry(
        {"kind": "migrate", "payload": json.dumps({"workers": ["w1"], "joiners": 2, "reason": "x"})}
    )
    assert request.to_dict() == {"kind": "migrate", "workers": ["w1"], "joiners": 2, "reason": "x"}
    with pytest.raises(ProtocolError, match=r"profile\.max"):
        request_from_entry({"kind": "profile", "payload": '{"min": 3, "max": 2, "batches": 5}'})


def test_a_straggler_is_reported_once_per_generation_by_the_jobs_rule(
    redis_url: str, job: str
) -> None:
    """Reported once; after a switch (the control plane may have kept it) once more."""
    leader, _view = make_leader(redis_url, job, ManualClock())
    slow = {"w0": 0.1, "w1": 0.1, "w2": 0.2}
    for _ in range(12):
        leader.observe_times(slow)
    assert [e["worker"] for e in events(redis_url, job, "straggler")] == ["w2"]
    plan = PreparePlan(generation=1, base_generation=0, members=("w0", "w1", "w2"), reason="t")
    leader.on_switched(SwitchPlan.of(plan, 1), 0.0)
    for _ in range(8):
        leader.observe_times(slow)
    assert len(events(redis_url, job, "straggler")) == 1  # a fresh window: 9 of 10 needed
    leader.observe_times(slow)
    assert [e["worker"] for e in events(redis_url, job, "straggler")] == ["w2", "w2"]


def test_the_leader_applies_the_rule_of_the_command_line(redis_url: str, job: str) -> None:
    leader, view = make_leader(redis_url, job, ManualClock())
    view.opts = dataclasses.replace(view.opts, straggler_rule="paper")
    paper = Leader(view, leader.redis, ManualClock())
    assert paper.reports.detector.rule.needed == 10
    assert leader.reports.detector.rule.needed == 9


def _register(leader: Leader, *workers: str) -> None:
    for worker in workers:
        leader.redis.rpush(leader.keys.rpc, json.dumps({"op": "register", "worker": worker}))


def _plans(leader: Leader) -> list[PreparePlan]:
    plans = []
    for seq in range(1, leader.published_seq + 1):
        plan = plan_from_json(str(leader.redis.get(leader.keys.plan(seq))))
        if isinstance(plan, PreparePlan):
            plans.append(plan)
    return plans


@pytest.mark.parametrize("announce", ["joiners", "rank order"])
def test_newcomers_announced_together_join_in_one_switch(
    redis_url: str, job: str, announce: str
) -> None:
    # 2026-12-03 21:57, j17: w7 registered first and switched alone; the control plane,
    # told the switch was done, freed w6's GPU while w6 was still starting.
    clock = ManualClock()
    leader, _view = make_leader(redis_url, job, clock)
    control = JobControl(redis_url, job)
    if announce == "joiners":
        control.announce_joiners(["w2", "w3"])
    else:
        control.set_rank_order(["w0", "w1", "w2", "w3"])
    _register(leader, "w3")
    leader.tick()
    clock.advance(5.0)
    leader.tick()
    assert leader.op is None and _plans(leader) == []  # w3 waits for w2
    _register(leader, "w2")
    leader.tick()
    [plan] = _plans(leader)
    assert set(plan.joiners) == {"w2", "w3"} and len(plan.members) == 4


def test_an_announced_newcomer_that_never_comes_holds_the_others_for_a_while_only(
    redis_url: str, job: str
) -> None:
    from workers.elastic.leader import JOIN_BATCH_WAIT_S

    clock = ManualClock()
    leader, _view = make_leader(redis_url, job, clock)
    JobControl(redis_url, job).announce_joiners(["w2", "w3"])
    _register(leader, "w3")
    leader.tick()
    clock.advance(JOIN_BATCH_WAIT_S - 1)
    leader.tick()
    assert _plans(leader) == []
    clock.advance(2)
    leader.tick()
    [plan] = _plans(leader)
    assert plan.joiners == ("w3",)


def test_a_newcomer_nobody_announced_joins_at_once(redis_url: str, job: str) -> None:
    leader, _view = make_leader(redis_url, job, ManualClock())
    JobControl(redis_url, job).announce_joiners(["w4", "w5"])  # another batch, still starting
    _register(leader, "w2")
    leader.tick()
    [plan] = _plans(leader)
    assert plan.joiners == ("w2",)
