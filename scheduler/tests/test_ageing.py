"""Class ageing: a low job that waited a period counts as normal, in every policy, live and simulated."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from scheduler.cli import main
from scheduler.policies import REGISTRY, get_policy
from scheduler.policies.base import Policy
from scheduler.priority import HIGH, LOW, NORMAL, aged_class, assign_priorities, parse_ageing
from scheduler.simulator import JobResult, SimConfig, simulate
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.traces import TraceJob, load_philly, load_tiresias, shared_trace
from scheduler.types import Preempt, Start

POLICIES = sorted(REGISTRY)
DAY = 86_400.0


def _aged(name: str, ageing: float | None) -> Policy:
    policy = get_policy(name)
    policy.class_ageing_s = ageing
    return policy


def test_aged_class_moves_low_up_to_normal_and_never_to_high() -> None:
    assert aged_class(LOW, 3599.0, 3600.0) == LOW
    assert aged_class(LOW, 3600.0, 3600.0) == NORMAL
    assert aged_class(LOW, 100 * 3600.0, 3600.0) == NORMAL  # high stays reserved
    assert aged_class(NORMAL, 100 * 3600.0, 3600.0) == NORMAL
    assert aged_class(HIGH, 100 * 3600.0, 3600.0) == HIGH
    assert aged_class(LOW, 100 * 3600.0, None) == LOW  # off


def test_parse_ageing_forms_and_bad_input() -> None:
    assert parse_ageing("off") is None and parse_ageing("0") is None
    assert parse_ageing("90") == 90.0
    assert parse_ageing("30m") == 1800.0
    assert parse_ageing("12h") == 43_200.0
    assert parse_ageing("1.5d") == 129_600.0
    for bad in ("", "soon", "-5", "1x", "inf", "nan", "h"):
        with pytest.raises(ValueError):
            parse_ageing(bad)


def _low_waited_then_normal(waited: float) -> object:
    """4 free GPUs: a low job queued ``waited`` s ago, a normal one that just arrived.

    The low job is also the shorter one, so that SRTF, which orders by remaining
    time inside a class, starts it once the classes are equal.
    """
    now = 2 * DAY
    return snapshot(
        now,
        cluster(1, 4),
        queued("old_low", 4, submit=now - waited, priority=10, remaining_work=50.0),
        queued("new_norm", 4, submit=now - 1.0, priority=50, remaining_work=100.0),
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_aged_low_job_goes_ahead_of_a_fresh_normal_one(policy: str) -> None:
    snap = _low_waited_then_normal(DAY + 1.0)
    pol = _aged(policy, DAY)
    assert pol.queue_order(snap)[0] == "old_low"  # type: ignore[arg-type]
    assert [d.job for d in pol.schedule(snap) if isinstance(d, Start)] == ["old_low"]  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("waited", "ageing"), [(DAY - 1.0, DAY), (10 * DAY, None)])
def test_low_job_stays_behind_before_its_period_or_with_ageing_off(
    policy: str, waited: float, ageing: float | None
) -> None:
    snap = _low_waited_then_normal(waited)
    pol = _aged(policy, ageing)
    assert pol.queue_order(snap) == ["new_norm", "old_low"]  # type: ignore[arg-type]
    assert [d.job for d in pol.schedule(snap) if isinstance(d, Start)] == ["new_norm"]  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", POLICIES)
def test_an_aged_job_never_passes_a_high_one(policy: str) -> None:
    now = 30 * DAY
    snap = snapshot(
        now,
        cluster(1, 4),
        queued("ancient_low", 4, submit=0.0, priority=10, remaining_work=1.0),
        queued("new_high", 4, submit=now - 1.0, priority=90, remaining_work=100.0),
    )
    starts = [d.job for d in _aged(policy, 3600.0).schedule(snap) if isinstance(d, Start)]
    assert starts == ["new_high"]


def test_queue_since_restarts_the_wait_of_a_preempted_job() -> None:
    # Submitted 3 days ago but back in the queue (preempted) only an hour ago: still low.
    now = 3 * DAY
    snap = snapshot(
        now,
        cluster(1, 4),
        queued("requeued_low", 4, submit=0.0, priority=10, queue_since=now - 3600.0),
        queued("norm", 4, submit=now - 60.0, priority=50),
    )
    assert _aged("tiresias", DAY).queue_order(snap) == ["norm", "requeued_low"]


@pytest.mark.parametrize("policy", ["tiresias", "elastic-tiresias"])
@pytest.mark.parametrize(("started_after", "preempted"), [(DAY + 60.0, False), (60.0, True)])
def test_a_running_job_keeps_the_class_it_started_with(
    policy: str, started_after: float, preempted: bool
) -> None:
    # A low job runs; a fresh normal job waits for its GPUs.  If the low job started
    # aged (it waited a day first) the normal job does not preempt it; if not, it does.
    now = 3 * DAY
    clu = cluster(1, 4, busy=dict.fromkeys(range(4), "low_run"))
    snap = snapshot(
        now,
        clu,
        running("low_run", (0, 1, 2, 3), submit=DAY, queue_since=DAY + started_after, priority=10),
        queued("norm", 4, submit=now - 60.0, priority=50),
    )
    decisions = _aged(policy, DAY).schedule(snap)
    assert (Preempt("low_run") in decisions) is preempted


def _starving_trace() -> list[TraceJob]:
    """8 GPUs kept busy by a normal 8-GPU, one-hour job every hour for 3 days; a low job at 1 s."""
    jobs = [TraceJob(f"n{i}", 3600.0 * i, 8, 3600.0, priority=50) for i in range(72)]
    return [jobs[0], TraceJob("low", 1.0, 8, 1800.0, priority=10), *jobs[1:]]


@pytest.mark.parametrize("policy", POLICIES)
def test_simulated_low_job_starts_about_one_period_after_submit(policy: str) -> None:
    ageing = 6 * 3600.0
    strict = simulate(_starving_trace(), _aged(policy, None), SimConfig(total_gpus=8))
    aged = simulate(_starving_trace(), _aged(policy, ageing), SimConfig(total_gpus=8))
    low_strict = next(j for j in strict.jobs if j.id == "low")
    low_aged = next(j for j in aged.jobs if j.id == "low")
    assert low_strict.start > 70 * 3600.0  # strict classes: after every normal job
    # aged: it joins the normal queue after 6 h and starts within two jobs' time
    assert ageing <= low_aged.start <= ageing + 2 * 3600.0 + 20.0
    assert low_aged.end < low_strict.end
    # the job is still reported in its own class
    assert set(aged.summary["by_class"]) == {"normal", "low"}


def test_simulated_preempted_aged_job_is_low_again() -> None:
    # The aged low job runs (as normal); a high job preempts it; afterwards fresh
    # normal jobs go first again until it has waited another period.
    ageing = 3600.0
    trace = [
        TraceJob("n0", 0.0, 8, 3700.0, priority=50),  # LAS demotes it below level 0
        TraceJob("low", 1.0, 8, 7200.0, priority=10),  # ages at 3601, preempts n0
        TraceJob("high", 4000.0, 8, 100.0, priority=90),  # preempts low at 4000
        TraceJob("n1", 4050.0, 8, 1000.0, priority=50),  # fresh normal: ahead of low again
    ]
    res = simulate(trace, _aged("tiresias", ageing), SimConfig(total_gpus=8))
    jobs = {j.id: j for j in res.jobs}
    assert jobs["low"].start == pytest.approx(3601.0)
    assert jobs["low"].preemptions == 1
    # Still aged, low would wait at the head of normal level 0 and restart at 4100;
    # back in its own class it waits for n1 and for the rest of n0, then runs its
    # remaining 7200 - 399 s.
    assert jobs["n1"].start == pytest.approx(4100.0)
    normal_done = max(jobs["n0"].end, jobs["n1"].end)
    assert jobs["low"].end == pytest.approx(normal_done + 7200.0 - 399.0)


def _digest(jobs: tuple[JobResult, ...]) -> str:
    rows = ";".join(
        f"{j.id},{j.start:.3f},{j.end:.3f},{j.preemptions},{j.scale_events}" for j in jobs
    )
    return hashlib.sha256(rows.encode()).hexdigest()[:16]


#: Per-job results with classes drawn (seed 1: 10% high, 30% low) before ageing existed.
GOLDEN_CLASSES = {
    ("60_job", "fifo"): "ad912953f2755446",
    ("60_job", "srtf"): "8003379d081b4e04",
    ("60_job", "tiresias"): "8003379d081b4e04",
    ("60_job", "elastic-tiresias"): "f220469e2bb4194b",
    ("philly-day", "fifo"): "4123c2fda2d6e1db",
    ("philly-day", "srtf"): "5ef581884865a089",
    ("philly-day", "tiresias"): "0f2fb3b52125f09b",
    ("philly-day", "elastic-tiresias"): "9ae9e7c81d50cad5",
}


def _class_trace(name: str) -> tuple[list[TraceJob], int]:
    if name == "60_job":
        trace, gpus = list(load_tiresias(shared_trace("60_job.csv")).jobs), 16
    else:
        philly = load_philly(
            shared_trace("philly.csv"), start="2017-10-09", end="2017-10-10", max_gpus=32
        )
        trace, gpus = list(philly.jobs), 32
    prios = assign_priorities(len(trace), {"high": 0.1, "low": 0.3}, seed=1)
    return [replace(j, priority=p) for j, p in zip(trace, prios, strict=True)], gpus


@pytest.mark.parametrize(("trace_name", "policy"), sorted(GOLDEN_CLASSES))
def test_ageing_off_decides_exactly_as_before(trace_name: str, policy: str) -> None:
    trace, gpus = _class_trace(trace_name)
    res = simulate(trace, _aged(policy, None), SimConfig(total_gpus=gpus))
    assert _digest(res.jobs) == GOLDEN_CLASSES[(trace_name, policy)]


@pytest.mark.parametrize("policy", POLICIES)
def test_ageing_without_low_jobs_changes_nothing(policy: str) -> None:
    trace, gpus = _class_trace("60_job")
    no_low = [replace(j, priority=50 if (j.priority or 50) < 30 else j.priority) for j in trace]
    off = simulate(no_low, _aged(policy, None), SimConfig(total_gpus=gpus))
    on = simulate(no_low, _aged(policy, 60.0), SimConfig(total_gpus=gpus))
    assert _digest(on.jobs) == _digest(off.jobs)


def test_cli_class_ageing_flag(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--trace", str(shared_trace("60_job.csv")), "--servers", "1",
            "--gpus-per-server", "8", "--policy", "tiresias", "--priority-share", "low=0.5",
            "--json"]  # fmt: skip
    by_class = {}
    for value in ("off", "2m"):
        assert main([*base, "--class-ageing", value]) == 0
        by_class[value] = json.loads(capsys.readouterr().out)["by_class"]
    assert by_class["2m"]["low"]["avg_jct"] < by_class["off"]["low"]["avg_jct"]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--class-ageing", "soon"])
    assert exc.value.code == 2
    assert "bad class ageing 'soon'" in capsys.readouterr().err
