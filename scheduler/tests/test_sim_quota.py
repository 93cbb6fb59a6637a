"""Tenant quotas in the simulator (``SimConfig.quota``), through the pipeline's quota steps."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.pipeline import PassParts
from scheduler.policies import get_policy
from scheduler.policies.base import Plan
from scheduler.simulation import QuotaDropped, QuotaHeld, QuotaRoomMade, Refusals, Simulation
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import TraceJob, shared_trace

LOW, HIGH = 10, 90


class Recorded:
    """The simulator's pass with each pass's parts kept, by the time it ran at."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.passes: dict[float, PassParts[float, Plan, Refusals]] = {}

    def run_parts(self, now: float) -> PassParts[float, Plan, Refusals]:
        parts: PassParts[float, Plan, Refusals] = self.inner.run_parts(now)
        self.passes.setdefault(now, parts)  # the first pass at a time
        return parts


def _run(trace: list[TraceJob], quota: dict[str, int] | None, **kw: Any) -> tuple[Any, Recorded]:
    sim = Simulation(trace, get_policy("tiresias"), SimConfig(total_gpus=8, quota=quota, **kw))
    recorded = Recorded(sim.scheduling)
    sim.scheduling = recorded  # type: ignore[assignment]
    return sim.run(), recorded


def _job(name: str, tenant: str, submit: float = 0.0, gpus: int = 4, **kw: Any) -> TraceJob:
    return TraceJob(name, submit, gpus, kw.pop("duration", 100.0), tenant=tenant, **kw)


def _plan(parts: PassParts[float, Plan, Refusals]) -> list[tuple[str, int]]:
    return [(job.id, n) for job, n in parts[1]]


def test_a_tenant_at_its_quota_waits_with_the_reason_while_another_runs() -> None:
    trace = [_job("a1", "a"), _job("a2", "a", 1.0), _job("b1", "b", 1.0)]
    # Without quotas a1 and a2 fill the cluster and b1 waits for a1.
    free = {r.id: r.start for r in simulate(trace, get_policy("tiresias"), SimConfig(8)).jobs}
    assert free == {"a1": 0.0, "a2": 1.0, "b1": 100.0}

    result, recorded = _run(trace, {"a": 4})
    starts = {r.id: r.start for r in result.jobs}
    assert starts == {"a1": 0.0, "b1": 1.0, "a2": 100.0}
    at_1 = recorded.passes[1.0]
    assert _plan(at_1) == [("b1", 4)]
    assert at_1[3] == {"a2": "tenant a holds 4 of its 4-GPU quota"}  # the tick's words


def test_starts_over_the_quota_in_one_pass_are_dropped_and_the_next_pass_fills_in() -> None:
    # Both of a's jobs arrive with b's: the policy starts a1 and a2, the check drops a2 (in
    # the policy's order), and the follow-up pass holds it back and starts b1.
    trace = [_job("a1", "a"), _job("a2", "a"), _job("b1", "b")]
    result, recorded = _run(trace, {"a": 4})
    first = recorded.passes[0.0]
    assert _plan(first) == [("a1", 4)]
    assert first[3] == {"a2": "tenant a holds 4 of its 4-GPU quota"}
    starts = {r.id: r.start for r in result.jobs}
    assert starts["a1"] == 0.0 and starts["b1"] == pytest.approx(0.0, abs=1e-9)
    assert starts["a2"] == 100.0


def test_a_higher_class_stops_its_own_tenants_lower_class_to_fit() -> None:
    trace = [
        _job("a-low", "a", priority=LOW, duration=1000.0),
        _job("b1", "b", duration=1000.0),
        _job("a-high", "a", 10.0, priority=HIGH),
    ]
    result, recorded = _run(trace, {"a": 4, "b": 4})
    at_10 = recorded.passes[10.0]
    assert _plan(at_10) == [("a-low", 0)]
    assert at_10[3] == {"a-high": "stopping a-low (a lower class of tenant a) to fit under its "
                        "4-GPU quota"}  # fmt: skip
    assert at_10[4]["a-low"].startswith(
        "preempted to make room under its tenant's quota for a-high"
    )
    jobs = {r.id: r for r in result.jobs}
    assert jobs["a-high"].start == pytest.approx(10.0, abs=1e-9)  # on the follow-up pass
    assert jobs["a-low"].preemptions == 1 and jobs["a-low"].end == pytest.approx(1100.0)
    assert jobs["b1"].preemptions == 0 and jobs["b1"].end == 1000.0


def test_no_victim_of_another_tenant_or_of_its_own_class() -> None:
    trace = [
        _job("a-normal", "a", duration=1000.0),
        _job("b-low", "b", priority=LOW, duration=1000.0),
        _job("a-normal-2", "a", 10.0),
    ]
    result, _ = _run(trace, {"a": 4})
    jobs = {r.id: r for r in result.jobs}
    assert all(r.preemptions == 0 for r in result.jobs)
    assert jobs["a-normal-2"].start == 1000.0


def test_quota_none_composes_no_quota_step_and_unbinding_quotas_change_nothing() -> None:
    trace = [
        _job(f"j{i}", "ab"[i % 2], i * 7.0, gpus=1 + i % 4, priority=(LOW, 50, HIGH)[i % 3],
             duration=50.0 + 13 * i)
        for i in range(30)
    ]  # fmt: skip
    policy = get_policy("tiresias")
    plain = Simulation(trace, policy, SimConfig(total_gpus=8))
    steps = plain.scheduling
    assert steps.quota_check is None and steps.within_quota is None
    assert not isinstance(steps.hold_back, QuotaHeld)
    quotas = Simulation(trace, policy, SimConfig(total_gpus=8, quota={"a": 8}))
    assert isinstance(quotas.scheduling.hold_back, QuotaHeld)
    assert isinstance(quotas.scheduling.quota_check, QuotaDropped)
    assert isinstance(quotas.scheduling.within_quota, QuotaRoomMade)

    baseline = simulate(trace, policy, SimConfig(total_gpus=8))
    # Quotas no pass can reach (8 GPUs held plus a need of 4), or of no tenant in the trace.
    # (A quota of the cluster's size does bind: a tenant holding the cluster is over it
    # for its next job, which then waits or stops its own lower class, not another's.)
    for quota in ({}, {"a": 12, "b": 12}, {"c": 0}):
        same = simulate(trace, policy, SimConfig(total_gpus=8, quota=quota))
        assert same.jobs == baseline.jobs, quota
    tight = simulate(trace, policy, SimConfig(total_gpus=8, quota={"a": 4}))
    assert tight.jobs != baseline.jobs
    assert len(tight.jobs) == len(baseline.jobs) == 30  # every job still ends


def watch_quota_use(sim: Simulation, tenant: str) -> list[int]:
    """The quota share ``tenant``'s running jobs hold after each pass of ``sim`` (filled
    as it runs)."""
    held: list[int] = []

    class Watch:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def run_parts(self, now: float) -> Any:
            parts = self.inner.run_parts(now)
            mine = [j for j in sim.records if j.running and j.tenant == tenant]
            held.append(sum(min(j.alloc, j.requested) for j in mine))
            return parts

    sim.scheduling = Watch(sim.scheduling)  # type: ignore[assignment]
    return held


@pytest.mark.parametrize("name", ["tiresias", "dlas", "srtf", "fifo", "elastic-tiresias"])
def test_quotas_hold_in_every_pass_of_a_run(name: str) -> None:
    trace = [
        _job(f"j{i}", "ab"[i % 2], i * 5.0, gpus=1 + i % 3, priority=(LOW, 50, HIGH)[i % 3],
             duration=40.0 + 11 * i)
        for i in range(40)
    ]  # fmt: skip
    sim = Simulation(trace, get_policy(name), SimConfig(total_gpus=8, quota={"a": 3}))
    held = watch_quota_use(sim, "a")
    result = sim.run()
    assert len(result.jobs) == 40 and max(held) <= 3


def test_a_job_asking_for_more_than_its_tenants_quota_is_refused_as_the_api_does() -> None:
    trace = [_job("a1", "a", gpus=2), _job("a-big", "a", 1.0, gpus=4), _job("b1", "b", 2.0)]
    result = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=8, quota={"a": 3}))
    assert [r.id for r in result.jobs] == ["a1", "b1"]
    assert result.summary["unfinished"] == 0 and result.summary["skipped"] == 1


@pytest.mark.parametrize("bad", ["a=1.5", "a=-1", "a", "a=x", ","])
def test_a_bad_quota_exits_2_with_an_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--trace", "x.csv", "--servers", "1", f"--quota={bad}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --quota:" in err


def test_the_cli_runs_with_quotas(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(shared_trace("60_job.csv"))
    argv = ["simulate", "--trace", trace, "--servers", "2", "--gpus-per-server", "8", "--json"]
    assert main([*argv, "--quota", "a=8,b=16"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 60


def test_sim_config_quota_defaults_to_none() -> None:
    assert SimConfig(total_gpus=8).quota is None
    assert dataclasses.replace(SimConfig(total_gpus=8), quota={"a": 1}).quota == {"a": 1}
