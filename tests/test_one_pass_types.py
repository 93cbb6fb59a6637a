"""Issue 38, done-when "the simulator and the live tick agree on a mixed-type scenario".

One scenario on the two-type demo cluster (a leaf of A100s, a leaf of H100s, each
server labelled with a pool) through the three passes of issue 37:

(a) the live tick on the database (the real ``run_tick``),
(b) the forecast's first pass on the snapshot the tick reads (``control.state``),
(c) the simulator on the typed cluster (``scheduler.sim_types.simulate_mixed``: one
    loop per type, each job typed by its trace's ``gpu_type`` column),

and the same decisions at the first pass (which job starts on which type, on how many
GPUs, and which waits) and at the second, when a high-class job arrives for the full
type (which job is stopped for it, or that it waits).  The jobs ask for one type or a list (the list's preferred type
has room, so the live routing and a trace's column agree), one selects a pool by label
(its pool has room), and their elastic ranges are wider than a start.

Left out, as the three paths do not all support them: a per-type quota (the forecast
takes totals only, ``docs/scheduler.md``) and a list job routed to its second type for
want of room (the simulator types a job once, from its trace, with no routing by room).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from django.utils import timezone

from control.policy import live_policy
from control.state import build_snapshot, read_cluster
from control.tick import run_tick
from inventory.models import Server
from jobs.agent_commands import runtime_job_name
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.demo import two_type_fabric
from scheduler.forecast import forecast_pass
from scheduler.sim_config import SimConfig
from scheduler.sim_types import TypePool, assign_types, simulate_mixed
from scheduler.traces import TraceJob
from scheduler.types import Decision, Preempt, Snapshot, Start
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)

A100, H100 = "a100-40g", "h100-80g"
LOW, HIGH, NORMAL = 10, 90, 50
POLICIES = ("tiresias", "elastic-tiresias", "fifo")
ELASTIC_SIM: dict[str, Any] = {"max_scale": 1.0, "min_fraction": 0.5}
"""The simulator's elastic jobs as the scenario's: no extras beyond the request, a minimum
of half of it (the elastic policy's view; the live rows carry their own ranges)."""

SCENARIO: dict[str, dict[str, Any]] = {
    "h100-low": {"gpus": 2, "min_gpus": 1, "max_gpus": 2, "priority": LOW, "gpu_types": [H100]},
    "h100-picky": {
        "gpus": 2, "min_gpus": 1, "max_gpus": 2, "priority": HIGH,
        "gpu_types": [H100], "node_selector": {"pool": "interactive"},
    },
    "h100-normal": {"gpus": 2, "min_gpus": 2, "max_gpus": 2, "priority": NORMAL,
                    "gpu_types": [H100]},
    "a100-normal": {"gpus": 2, "min_gpus": 2, "max_gpus": 2, "priority": NORMAL,
                    "gpu_types": [A100]},
    "either": {"gpus": 2, "min_gpus": 1, "max_gpus": 2, "priority": NORMAL,
               "gpu_types": [A100, H100]},
}  # fmt: skip
"""Five jobs of acme's on 4 A100s and 4 H100s: three want H100s (a low-class one, a
high-class one on the interactive pool, a normal one), one A100s, one either (A100
preferred).  The H100s hold two of the three: the high and the normal start, the low
waits; the A100s hold the other two."""

EXPECTED = {
    "h100-picky": (H100, 2),
    "h100-normal": (H100, 2),
    "a100-normal": (A100, 2),
    "either": (A100, 2),
}
"""Job -> (type, GPUs) started at the first pass; ``h100-low`` waits."""


@pytest.fixture(params=POLICIES)
def policy(request: Any, settings: Any) -> str:
    """The production policy of the three passes."""
    settings.SCHEDULER_POLICY, settings.FAIR_SHARE = request.param, False
    return str(request.param)


@pytest.fixture
def scenario(alice: Any, acme: Any, settings: Any, policy: str) -> dict[str, str]:
    """The two-type cluster with the scenario's jobs queued: scenario name -> job name."""
    settings.CLASS_AGEING_SECONDS = 86400
    demo_cluster(two_type_fabric())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    names = {}
    for name, fields in SCENARIO.items():
        data = {"name": name, "workload": "mlp-digits", **fields}
        spec = check_job_spec(tenant=acme, data=data)
        names[name] = runtime_job_name(do_submit_job(user=alice, tenant=acme, spec=spec).pk)
    return names


def _by_scenario(names: dict[str, str], started: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """``started`` (job name -> type and GPUs) keyed by the scenario's names."""
    return {key: started[job] for key, job in names.items() if job in started}


STOPPED = ("", 0)
"""A job a pass stops (a preemption)."""


def _forecast_pass() -> tuple[dict[str, tuple[str, int]], dict[str, str]]:
    """The forecast's pass on the snapshot the tick reads now: its decisions as job ->
    (type, GPUs) or :data:`STOPPED`, and its waits."""
    cluster = read_cluster()
    assert cluster is not None
    snapshot = build_snapshot(cluster, timezone.now()).snapshot
    result = forecast_pass(live_policy(), {"acme": 16}).run(snapshot)
    return _typed(result.decisions, snapshot), dict(result.waits)


def _typed(decisions: Iterable[Decision], snapshot: Snapshot) -> dict[str, tuple[str, int]]:
    """Each start of ``decisions`` as (the one type of its GPUs, how many); a preemption
    as :data:`STOPPED`."""
    types = {gpu.id: gpu.gpu_type for gpu in snapshot.cluster.gpus}
    typed = {}
    for decision in decisions:
        assert isinstance(decision, Start | Preempt), decision  # no elastic resize here
        if isinstance(decision, Preempt):
            typed[decision.job] = STOPPED
            continue
        (gpu_type,) = {types[g] for g in decision.gpus}  # never two types
        typed[decision.job] = (gpu_type, len(decision.gpus))
    return typed


def _live_tick() -> dict[str, tuple[str, int]]:
    """The real tick once: each job it changed -> (the type of the servers it holds, its
    GPUs), or :data:`STOPPED`."""
    result = run_tick()
    assert result.ran and result.refused == ()
    changed = {}
    for job in Job.objects.filter(pk__in=result.changed_jobs):
        servers = Server.objects.filter(gpu_set__assignment__job=job)
        held = set(servers.values_list("gpu_type", flat=True))
        if job.state != "running":
            assert held == set()
            changed[runtime_job_name(job.pk)] = STOPPED
            continue
        (gpu_type,) = held
        changed[runtime_job_name(job.pk)] = (gpu_type, job.parallelism)
    return changed


def _trace(names: dict[str, str], jobs: dict[str, dict[str, Any]], at: float) -> list[TraceJob]:
    """``jobs`` (scenario name -> fields) arriving at ``at``, each typed by its list's first
    type (what a trace's ``gpu_type`` column carries), an hour long at its request."""
    return [
        TraceJob(names[key], at, fields["gpus"], 3600.0, tenant="acme",
                 priority=fields["priority"], gpu_type=fields["gpu_types"][0])
        for key, fields in jobs.items()
    ]  # fmt: skip


def _simulated(trace: list[TraceJob], policy: str, at: float) -> dict[str, tuple[str, int]]:
    """The simulator on the same typed cluster: the jobs it started at ``at`` by type and
    GPUs, and (``at`` > 0) the jobs it preempted as :data:`STOPPED`."""
    result = simulate_mixed(
        trace,
        lambda: live_policy(policy),
        SimConfig(total_gpus=8, quota={"acme": 16}, **(ELASTIC_SIM if "elastic" in policy else {})),
        (TypePool(A100, 4), TypePool(H100, 4)),
        assign_types(trace, {}, seed=0),
    )
    jobs = [(gpu_type, job) for gpu_type, pool in result.by_type.items() for job in pool.jobs]
    started = {job.id: (gpu_type, job.gpus) for gpu_type, job in jobs if job.start == at}
    stopped = {job.id: STOPPED for _, job in jobs if at and job.preemptions}
    return {**started, **stopped}


def test_a_mixed_type_scenario_decides_the_same_in_the_tick_the_forecast_and_the_simulator(
    scenario: dict[str, str], policy: str
) -> None:
    forecast_starts, forecast_waits = _forecast_pass()
    simulated = _simulated(_trace(scenario, SCENARIO, 0.0), policy, 0.0)
    tick = _live_tick()

    assert _by_scenario(scenario, tick) == EXPECTED
    assert _by_scenario(scenario, forecast_starts) == EXPECTED
    assert _by_scenario(scenario, simulated) == EXPECTED
    low = Job.objects.get(name="h100-low")
    assert low.state == "queued" and scenario["h100-low"] not in forecast_starts
    assert (forecast_waits, low.wait_reason) == ({}, "")  # waits for room: no hold-back
    picky = Server.objects.filter(gpu_set__assignment__job__name="h100-picky")
    assert set(picky.values_list("labels__pool", flat=True)) == {"interactive"}


URGENT = {"h100-urgent": {"gpus": 2, "min_gpus": 2, "max_gpus": 2, "priority": HIGH,
                          "gpu_types": [H100]}}  # fmt: skip
"""A high-class H100 job arriving once the scenario runs: the H100s are full."""

SECOND_PASS = {
    "tiresias": {"h100-urgent": (H100, 2), "h100-normal": STOPPED},
    "elastic-tiresias": {"h100-urgent": (H100, 2), "h100-normal": STOPPED},
    "fifo": {},
}
"""Per policy, the second pass: the Tiresias pair stop the normal-class H100 job for it
(not the high-class one, not an A100 job); FIFO never preempts, so it waits."""


def test_a_later_arrival_on_a_full_type_decides_the_same_in_the_three_passes(
    scenario: dict[str, str], policy: str, alice: Any, acme: Any
) -> None:
    """The second pass: the first tick ran, then an H100 job of the high class arrives.

    The simulator's side: the jobs started when it arrives (time 1) and the jobs it
    preempted over its run (the scenario's jobs all end at once, an hour later, so a
    preemption is this pass's)."""
    assert _by_scenario(scenario, _live_tick()) == EXPECTED
    data = {"name": "h100-urgent", "workload": "mlp-digits", **URGENT["h100-urgent"]}
    job = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=data))
    scenario = {**scenario, "h100-urgent": runtime_job_name(job.pk)}
    forecast_decisions, forecast_waits = _forecast_pass()
    trace = _trace(scenario, SCENARIO, 0.0) + _trace(scenario, URGENT, 1.0)
    simulated = _simulated(trace, policy, 1.0)
    tick = _live_tick()

    expected = SECOND_PASS[policy]
    assert _by_scenario(scenario, tick) == expected
    assert _by_scenario(scenario, forecast_decisions) == expected
    assert _by_scenario(scenario, simulated) == expected
    assert forecast_waits == {}
