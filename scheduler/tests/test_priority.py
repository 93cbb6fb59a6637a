"""Priority classes: a higher class is served first and preempts a lower one, in every policy."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from scheduler.policies import REGISTRY, get_policy
from scheduler.priority import HIGH, LOW, NORMAL, assign_priorities, parse_shares, priority_class
from scheduler.simulator import JobResult, SimConfig, simulate
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.traces import TraceError, TraceJob, load_philly, load_tiresias, shared_trace
from scheduler.types import Preempt, Scale, Start, TenantShare

LAS = ("tiresias", "elastic-tiresias")


@pytest.mark.parametrize(
    ("priority", "klass"),
    [(0, LOW), (29, LOW), (30, NORMAL), (50, NORMAL), (69, NORMAL), (70, HIGH), (100, HIGH)],
)
def test_priority_class_boundaries(priority: int, klass: int) -> None:
    assert priority_class(priority) == klass


def _full_cluster_with_arrivals(high_priority: int) -> object:
    """8 GPUs: a normal and a low job run (both fresh); a normal job waits; a new job arrives."""
    clu = cluster(
        1, 8, busy={**dict.fromkeys(range(4), "norm_run"), **dict.fromkeys(range(4, 8), "low_run")}
    )
    return snapshot(
        100.0,
        clu,
        running("norm_run", (0, 1, 2, 3), submit=0.0, queue_since=10.0, priority=50),
        running("low_run", (4, 5, 6, 7), submit=1.0, queue_since=11.0, priority=10),
        queued("norm_wait", 4, submit=50.0, priority=50),
        queued("new", 4, submit=99.0, priority=high_priority),
    )


@pytest.mark.parametrize("policy", LAS)
def test_high_job_starts_before_queued_normal_and_preempts_low(policy: str) -> None:
    decisions = get_policy(policy).schedule(_full_cluster_with_arrivals(90))  # type: ignore[arg-type]
    assert Preempt("low_run") in decisions
    starts = [d.job for d in decisions if isinstance(d, Start)]
    assert starts == ["new"]  # the normal job that waited longer still waits
    assert not any(d.job == "norm_run" for d in decisions)


@pytest.mark.parametrize("policy", LAS)
def test_same_job_at_normal_priority_waits_its_turn(policy: str) -> None:
    # Control: with priority 50 the newcomer is one more normal job; the low job
    # still yields to the waiting normal one (classes), and the newcomer waits.
    decisions = get_policy(policy).schedule(_full_cluster_with_arrivals(50))  # type: ignore[arg-type]
    assert [d.job for d in decisions if isinstance(d, Start)] == ["norm_wait"]
    assert Preempt("low_run") in decisions


def test_fifo_and_srtf_order_by_class_first() -> None:
    snap = snapshot(
        10.0,
        cluster(1, 4),
        queued("normal_first", 4, submit=0.0, priority=50, remaining_work=10.0),
        queued("high_later", 4, submit=5.0, priority=80, remaining_work=1000.0),
    )
    for policy in ("fifo", "srtf"):
        starts = [d.job for d in get_policy(policy).schedule(snap) if isinstance(d, Start)]
        assert starts == ["high_later"], policy


def test_elastic_reclaims_low_class_extras_first() -> None:
    # Both run 4-GPU requests on 6 GPUs.  The high job's 6th GPU gains least, so
    # by speedup alone its extras would go first; the class rule takes the low job's.
    flat = {n: float(min(n, 5)) + (0.01 * (n - 5) if n > 5 else 0.0) for n in range(1, 9)}
    linear = {n: float(n) for n in range(1, 9)}
    clu = cluster(
        1, 12, busy={**dict.fromkeys(range(6), "hi"), **dict.fromkeys(range(6, 12), "lo")}
    )
    snap = snapshot(
        100.0,
        clu,
        running(
            "lo",
            tuple(range(6, 12)),
            submit=0.0,
            requested_gpus=4,
            max_gpus=8,
            priority=10,
            throughput=linear,
            queue_since=1.0,
        ),
        running(
            "hi",
            tuple(range(6)),
            submit=1.0,
            requested_gpus=4,
            max_gpus=8,
            priority=90,
            throughput=flat,
            queue_since=2.0,
        ),
        queued("new", 2, submit=99.0, priority=50),
    )
    decisions = get_policy("elastic-tiresias").schedule(snap)
    assert Scale("lo", tuple(range(6, 10))) in decisions
    assert not any(d.job == "hi" for d in decisions)
    assert any(isinstance(d, Start) and d.job == "new" for d in decisions)


def test_elastic_scale_out_serves_high_class_first() -> None:
    linear = {n: float(n) for n in range(1, 9)}
    clu = cluster(1, 10, busy={**dict.fromkeys(range(4), "lo"), **dict.fromkeys(range(4, 8), "hi")})
    snap = snapshot(
        100.0,
        clu,
        running("lo", (0, 1, 2, 3), submit=0.0, max_gpus=8, priority=10, throughput=linear),
        running("hi", (4, 5, 6, 7), submit=1.0, max_gpus=8, priority=90, throughput=linear),
    )
    decisions = get_policy("elastic-tiresias").schedule(snap)
    assert decisions == [Scale("hi", (4, 5, 6, 7, 8, 9))]


def _class_trace() -> list[TraceJob]:
    return [
        TraceJob("low", 0.0, 8, 1000.0, priority=10),
        TraceJob("norm", 10.0, 8, 100.0, priority=50),
        TraceJob("norm2", 15.0, 8, 100.0, priority=50),
        TraceJob("high", 20.0, 8, 100.0, priority=90),
    ]


@pytest.mark.parametrize("policy", LAS)
def test_simulator_high_job_preempts_and_jumps_the_queue(policy: str) -> None:
    res = simulate(_class_trace(), get_policy(policy), SimConfig(total_gpus=8))
    jobs = {j.id: j for j in res.jobs}
    assert jobs["high"].start == 20.0  # at once, on a full cluster
    assert jobs["high"].start < jobs["norm2"].start
    assert jobs["norm"].preemptions >= 1  # normal yields to high (and, elastic, to LAS)
    assert jobs["low"].preemptions >= 1 and jobs["low"].end == max(j.end for j in res.jobs)
    assert set(res.summary["by_class"]) == {"high", "normal", "low"}
    assert res.summary["by_class"]["high"]["avg_jct"] == pytest.approx(
        jobs["high"].end - 20.0, abs=1.0
    )


def test_queue_order_for_a_snapshot_follows_class_then_las_then_arrival() -> None:
    clu = cluster(1, 4, busy=dict.fromkeys(range(4), "r"))
    snap = snapshot(
        100.0,
        clu,
        running("r", (0, 1, 2, 3), submit=0.0, priority=50),
        queued("low_early", 4, submit=1.0, priority=10),
        queued("norm_served", 4, submit=2.0, priority=50, attained_service=5000.0),
        queued("norm_fresh", 4, submit=3.0, priority=50),
        queued("high_late", 4, submit=4.0, priority=90),
    )
    order = get_policy("tiresias").queue_order(snap)
    assert order == ["high_late", "norm_fresh", "norm_served", "low_early"]
    assert get_policy("fifo").queue_order(snap) == [
        "high_late", "norm_served", "norm_fresh", "low_early",
    ]  # fmt: skip


@pytest.mark.parametrize("policy", sorted(REGISTRY))
@pytest.mark.parametrize("with_tenants", [False, True])
def test_queue_order_head_is_who_starts(policy: str, with_tenants: bool) -> None:
    jobs = [
        queued("a_low", 4, submit=0.0, priority=10, tenant="a", remaining_work=50.0),
        queued("a_norm", 4, submit=1.0, priority=50, tenant="a", remaining_work=60.0),
        queued("b_norm", 4, submit=2.0, priority=50, tenant="b", remaining_work=70.0),
        queued("b_low", 4, submit=3.0, priority=10, tenant="b", remaining_work=5.0),
    ]
    tenants = {"a": TenantShare(1.0, 900.0), "b": TenantShare(1.0, 100.0)} if with_tenants else {}
    order: list[str] = []
    started: list[str] = []
    pol = get_policy(policy)
    for _ in range(len(jobs)):  # start one job at a time on 4 free GPUs; the head must start
        snap = snapshot(10.0, cluster(1, 4), *[j for j in jobs if j.id not in started])
        snap = type(snap)(now=snap.now, cluster=snap.cluster, jobs=snap.jobs, tenants=tenants)
        order = pol.queue_order(snap)
        starts = [d.job for d in pol.schedule(snap) if isinstance(d, Start)]
        assert starts == [order[0]]
        started.append(order[0])
    expected_first = "b_norm" if with_tenants else "a_norm"  # b is below its share
    assert started[0] == expected_first
    assert set(started[-2:]) == {"a_low", "b_low"}  # low class last


def test_parse_shares_and_assignment_are_checked_and_seeded() -> None:
    assert parse_shares("high=0.1, low=0.3") == {"high": 0.1, "low": 0.3}
    for bad in ("urgent=0.1", "high", "high=x", "high=-0.1", "high=0.8,low=0.5"):
        with pytest.raises(ValueError):
            parse_shares(bad)
    a = assign_priorities(2000, {"high": 0.1, "low": 0.3}, seed=3)
    assert a == assign_priorities(2000, {"high": 0.1, "low": 0.3}, seed=3)
    share_high = sum(priority_class(p) == HIGH for p in a) / len(a)
    share_low = sum(priority_class(p) == LOW for p in a) / len(a)
    assert share_high == pytest.approx(0.1, abs=0.02) and share_low == pytest.approx(0.3, abs=0.03)


def _digest(jobs: tuple[JobResult, ...]) -> str:
    rows = ";".join(
        f"{j.id},{j.start:.3f},{j.end:.3f},{j.preemptions},{j.scale_events}" for j in jobs
    )
    return hashlib.sha256(rows.encode()).hexdigest()[:16]


#: Per-job results of the policies before priority classes and fair share existed.
GOLDEN = {
    ("60_job", "fifo"): "3536cc1d0ad74a13",
    ("60_job", "srtf"): "6c2c160f3ad1f53b",
    ("60_job", "tiresias"): "0c141ab33ed6c596",
    ("60_job", "elastic-tiresias"): "52e84579a024096e",
    ("philly-day", "fifo"): "244b56f8383efae8",
    ("philly-day", "srtf"): "e8bff00898770d67",
    ("philly-day", "tiresias"): "49f55a03b0297cb1",
    ("philly-day", "elastic-tiresias"): "61c139c661ba4d71",
}


@pytest.mark.parametrize(("trace_name", "policy"), sorted(GOLDEN))
def test_one_class_and_fair_share_off_decide_exactly_as_before(
    trace_name: str, policy: str
) -> None:
    if trace_name == "60_job":
        trace, gpus = list(load_tiresias(shared_trace("60_job.csv")).jobs), 16
    else:
        philly = load_philly(
            shared_trace("philly.csv"), start="2017-10-09", end="2017-10-10", max_gpus=32
        )
        trace, gpus = list(philly.jobs), 32
    res = simulate(trace, get_policy(policy), SimConfig(total_gpus=gpus))
    assert _digest(res.jobs) == GOLDEN[(trace_name, policy)]
    assert "by_class" not in res.summary
    if trace_name == "60_job":  # every job at priority 50 and one tenant with weights on: the same
        same = [TraceJob(j.id, j.submit, j.gpus, j.duration, j.model, "t", 50) for j in trace]
        res2 = simulate(
            same, get_policy(policy), SimConfig(total_gpus=gpus, tenant_weights={"t": 1, "u": 2})
        )
        assert _digest(res2.jobs) == GOLDEN[(trace_name, policy)]


def test_tiresias_trace_priority_and_tenant_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,num_gpu,submit_time,duration,priority,tenant\n"
        "1,2,0,100,90,a\n2,2,1,100,,b\n3,2,2,100,abc,a\n4,2,3,100,101,a\n"
    )
    loaded = load_tiresias(path)
    assert [(j.id, j.priority, j.tenant) for j in loaded.jobs] == [("1", 90, "a"), ("2", None, "b")]
    assert loaded.skipped == {"priority not an integer in 0-100": 2}
    with pytest.raises(TraceError, match="priority"):
        load_tiresias(path, on_error="fail")
