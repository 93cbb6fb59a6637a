"""One scheduling pass (issue 37): the tick, the forecast and the simulator share it.

(a) No module of the control plane (``jobs/``), nor the forecast or the simulator,
    writes a step of the pass again: the quota hold-back (in-use plus a job's GPUs
    compared with a quota), the in-use count, the quota check, the within-quota
    preemptions, the policy's decide step.  They compose ``scheduler.pipeline``'s steps.
    Planted violations prove the checker fires.
(b) One scenario through the pass as the tick runs it (its snapshot assembly and
    binding on the fabric), as the forecast's first pass runs it, and as the
    simulator's first pass runs it: the same decisions; with quotas that bind, the same
    decisions and the same reasons from the three.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from control.policy import live_policy
from control.state import (
    AssembledHoldBack,
    ClusterState,
    JobRow,
    PolicyInput,
    TenantRow,
    assemble_snapshot,
    gpu_view,
    held_allocation,
)
from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from jobs.agent_commands import GpuHome, runtime_job_name
from scheduler.forecast import forecast, forecast_pass
from scheduler.pipeline import AllocatorBind, PolicyDecide, snapshot_pass
from scheduler.placement import CountPlacement
from scheduler.policies.base import Policy
from scheduler.simulation import Simulation
from scheduler.simulator import SimConfig, simulate
from scheduler.traces import TraceJob
from scheduler.types import Decision, Preempt, Start

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("jobs", "control", "scheduler/forecast.py", "scheduler/simulation.py")
"""Where no step of the pass may be written again (the callers of the pipeline)."""

CALLERS = ("control/tick.py", "scheduler/forecast.py", "scheduler/simulation.py")
"""The three passes: each composes ``scheduler.pipeline``."""

STEP_FUNCTIONS = {
    "enforce_quotas": "calls the quota check itself (scheduler.pipeline.EnforceQuotas)",
    "within_quota_preemptions": "calls the within-quota step itself "
    "(scheduler.pipeline.PreemptWithinQuota)",
    "schedule": "calls a policy's schedule itself (scheduler.pipeline.PolicyDecide)",
}
VERIFIERS = {("control/incremental.py", "compare_policies")}
"""Functions that call a step only to check kept state against a fresh pass's answer."""

STEP_METHODS = frozenset({"hold_back", "decide", "check", "make_room", "bind", "again"})
"""A class defining one of these implements a step: it may call a policy core's decide."""


def _names(node: ast.AST) -> Iterator[str]:
    """Every identifier in ``node``: names and attribute names."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            yield child.id
        elif isinstance(child, ast.Attribute):
            yield child.attr


def _mentions(node: ast.AST, word: str) -> bool:
    return any(word in name.lower() for name in _names(node))


class _StepFinder(ast.NodeVisitor):
    """Collects the places where a module writes a step of the pass again."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.found: list[str] = []
        self.in_step_class = [False]
        self.function = ""

    def _say(self, node: ast.expr | ast.stmt, what: str) -> None:
        self.found.append(f"{self.filename}:{node.lineno} {what}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        self.in_step_class.append(bool(methods & STEP_METHODS))
        self.generic_visit(node)
        self.in_step_class.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if (self.filename, self.function) in VERIFIERS:
            pass
        elif name in STEP_FUNCTIONS:
            self._say(node, STEP_FUNCTIONS[name])
        elif name == "decide" and isinstance(func, ast.Attribute) and not self.in_step_class[-1]:
            self._say(node, "calls a policy core's decide outside a Decide step")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        adds = any(isinstance(s, ast.BinOp) and isinstance(s.op, ast.Add) for s in sides)
        if adds and _mentions(node, "quota"):
            self._say(
                node,
                "compares in-use plus a job's GPUs with a quota "
                "(the hold-back rule: scheduler.quota.QuotaBook.hold_reason)",
            )
        self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt) and not isinstance(node, ast.ClassDef | ast.FunctionDef):
            self._count_rule(node)
        super().generic_visit(node)

    def _count_rule(self, node: ast.stmt) -> None:
        if isinstance(node, ast.For | ast.If | ast.While | ast.With | ast.Try):
            return  # their body's statements are checked one by one
        if not _mentions(node, "in_use"):
            return
        for child in ast.walk(node):
            if isinstance(child, ast.Call) and getattr(child.func, "id", "") == "min":
                self._say(
                    node,
                    "counts a job's share of its tenant's quota "
                    "(the rule: scheduler.quota.quota_share)",
                )
                return


def reimplemented_steps(source: str, filename: str = "<planted>") -> list[str]:
    """``file:line what`` for each place ``source`` writes a step of the pass again."""
    finder = _StepFinder(filename)
    finder.visit(ast.parse(source, filename=filename))
    return finder.found


def checked_files() -> list[Path]:
    """The modules of :data:`CHECKED` (migrations left out)."""
    files: list[Path] = []
    for name in CHECKED:
        path = ROOT / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return [f for f in files if "migrations" not in f.parts]


# -- (a) the rule of one pass ------------------------------------------------------------------


def test_no_caller_of_the_pass_writes_one_of_its_steps_again() -> None:
    found = [
        where
        for path in checked_files()
        for where in reimplemented_steps(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []
    assert len(checked_files()) > 50  # jobs/ and control/ were walked, not an empty folder


@pytest.mark.parametrize("caller", CALLERS)
def test_the_tick_the_forecast_and_the_simulator_compose_the_same_pipeline(caller: str) -> None:
    tree = ast.parse((ROOT / caller).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "scheduler.pipeline" in imported


PLANTED = {
    "the tick's old hold-back": (
        "def held(used, lo, tenant):\n    return used + lo > tenant.gpu_quota\n"
    ),
    "the forecast's old hold-back": (
        "held = {j for j, p in jobs.items()\n"
        "        if in_use.get(p.tenant, 0) + p.need > quota[p.tenant]}\n"
    ),
    "its own in-use count": (
        "for row in rows:\n"
        "    in_use[row.t] = in_use.get(row.t, 0) + min(row.parallelism, row.gpus)\n"
    ),
    "the quota check": "kept, dropped = enforce_quotas(decisions, views, book)\n",
    "the within-quota step": "room = within_quota_preemptions(blocked, running, book)\n",
    "the policy called directly": "decisions = policy.schedule(snapshot, placement=placement)\n",
    "a core's pass outside a step": "def pass_(core, now):\n    return core.decide(now)\n",
}


@pytest.mark.parametrize("planted", PLANTED)
def test_the_checker_finds_a_planted_step(planted: str) -> None:
    found = reimplemented_steps(PLANTED[planted])
    assert len(found) == 1, found


def test_a_decide_step_may_call_its_core_and_quotas_may_be_compared_alone() -> None:
    allowed = (
        "class CoreDecide:\n"
        "    def decide(self, turn):\n"
        "        return self.core.decide(turn.now)\n"
        "if gpus > tenant.gpu_quota:\n"  # a request above the quota: not the hold-back
        "    raise ValueError\n"
        "in_use += int(row['gpus'] or 0)\n"
    )
    assert reimplemented_steps(allowed) == []


# -- (b) one scenario, three passes --------------------------------------------------------------

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
SPEC = FabricSpec(leaves=1, spines=8, servers_per_leaf=1, gpus_per_server=8)
TENANTS = {1: TenantRow("acme", 8, False, 1.0), 2: TenantRow("beta", 4, False, 1.0)}
QUOTA = {row.slug: row.gpu_quota for row in TENANTS.values()}
LOW, HIGH, NORMAL = 10, 90, 50


def _row(job: int, tenant: int, gpus: int, priority: int, holds: int = 0) -> JobRow:
    return JobRow(
        id=job,
        state="running" if holds else "queued",
        parallelism=holds,
        tenant_id=tenant,
        submitted_at=NOW - timedelta(minutes=10),
        gpus=gpus,
        min_gpus=gpus,
        max_gpus=gpus,
        attained_gpu_seconds=0.0,
        priority=priority,
        profiled={},
        measured={},
        profile_state="",
    )


def _cluster(holdings: dict[int, list[int]]) -> ClusterState:
    return ClusterState(
        spec=SPEC,
        homes={g: GpuHome(node="node-0", local=g) for g in range(8)},
        schedulable=frozenset(range(8)),
        holders={g: job for job, gpus in holdings.items() for g in gpus},
        holdings=holdings,
        draining=frozenset(),
    )


def _tick_input(
    rows: list[JobRow], cluster: ClusterState, tenants: dict[int, TenantRow] = TENANTS
) -> PolicyInput:
    """The policy's input as the tick assembles it (``control.state``)."""
    gpus = tuple(gpu_view(cluster, g) for g in range(8))
    return assemble_snapshot(cluster, gpus, rows, tenants, set(), {}, NOW)


def _tick_pass(policy: Policy, view: PolicyInput, cluster: ClusterState) -> list[Decision]:
    """The pass as ``control.tick`` runs it: its hold-back, decide and fabric binding."""
    return _tick_result(policy, view, cluster).decisions


def _tick_result(policy: Policy, view: PolicyInput, cluster: ClusterState) -> Any:
    """:func:`_tick_pass`'s whole result (its waits too)."""
    allocator = VClosAllocator(SPEC)
    held = (held_allocation(job, None, cluster) for job in cluster.holdings)
    allocator.restore([a for a in held if a is not None])
    result = snapshot_pass(
        AssembledHoldBack(),
        PolicyDecide(policy, CountPlacement(), None),
        AllocatorBind(SPEC, allocator),
    ).run(view)
    assert result.bound[0].refused == []
    return result


@pytest.fixture
def policy() -> Iterator[Policy]:
    with override_settings(FAIR_SHARE=False, CLASS_AGEING_SECONDS=86400):
        yield live_policy("tiresias")


SCENARIO = [
    _row(1, tenant=1, gpus=4, priority=LOW),
    _row(2, tenant=1, gpus=2, priority=HIGH),
    _row(3, tenant=2, gpus=4, priority=NORMAL),
]
"""Two tenants (acme: quota 8, beta: quota 4) on 8 GPUs: a low-class job of acme's,
a high-class one of acme's, a normal one of beta's, all queued."""


def _counts(decisions: list[Decision]) -> dict[str, int]:
    return {d.job: len(d.gpus) if isinstance(d, Start) else 0 for d in decisions}


def test_one_scenario_decides_the_same_in_the_tick_the_forecast_and_the_simulator(
    policy: Policy,
) -> None:
    cluster = _cluster({})
    view = _tick_input(SCENARIO, cluster)
    tick = _tick_pass(policy, view, cluster)
    # The forecast's first pass: the same pass on the snapshot of every job at its now.
    first = forecast_pass(policy, QUOTA).run(view.snapshot)
    estimates = forecast(view.snapshot, policy, quota=QUOTA).estimates
    # The simulator's first pass: the jobs it started at once (the trace's time 0).
    trace = [
        TraceJob(runtime_job_name(row.id), 0.0, row.gpus, 3600.0,
                 tenant=TENANTS[row.tenant_id].slug, priority=row.priority)
        for row in SCENARIO
    ]  # fmt: skip
    simulated = simulate(trace, policy, SimConfig(total_gpus=8))
    started_at_once = {r.id: r.gpus for r in simulated.jobs if r.start == 0.0}

    assert tick == first.decisions
    assert _counts(tick) == {"job-2": 2, "job-3": 4} == started_at_once  # high, then normal
    assert {job for job, e in estimates.items() if e.start == 0.0} == {"job-2", "job-3"}


def _simulated_pass(
    policy: Policy, rows: list[JobRow], tenants: dict[int, TenantRow], **config: Any
) -> Any:
    """The simulator's pass when the queued rows arrive (time 1) after the running ones
    started (time 0), with the tenants' quotas (``config``: more of the SimConfig): what it
    decided, why each job waits, why each job was stopped."""
    trace = [
        TraceJob(runtime_job_name(row.id), 0.0 if row.parallelism else 1.0, row.gpus, 3600.0,
                 tenant=tenants[row.tenant_id].slug, priority=row.priority)
        for row in rows
    ]  # fmt: skip
    quota = {t.slug: t.gpu_quota for t in tenants.values()}
    sim = Simulation(trace, policy, SimConfig(total_gpus=8, quota=quota, **config))
    passes: dict[float, Any] = {}
    scheduling = sim.scheduling

    class Recorded:
        def run_parts(self, now: float) -> Any:
            passes.setdefault(now, scheduling.run_parts(now))
            return passes[now]

    sim.scheduling = Recorded()  # type: ignore[assignment]
    sim.run()
    assert [(job.id, n) for job, n in passes[0.0][1]] == [
        (runtime_job_name(r.id), r.parallelism) for r in rows if r.parallelism
    ]
    return passes[1.0]


def test_with_a_quota_that_binds_the_tick_the_forecast_and_the_simulator_stop_the_same_job(
    policy: Policy,
) -> None:
    """acme (quota 6) runs its low job on 4; its high job of 4 is over the quota: the three
    passes stop the low job for it and start beta's, and say why alike."""
    tenants = {1: TenantRow("acme", 6, False, 1.0), 2: TenantRow("beta", 4, False, 1.0)}
    rows = [_row(1, 1, 4, LOW, holds=4), _row(2, 1, 4, HIGH), _row(3, 2, 4, NORMAL)]
    cluster = _cluster({1: [0, 1, 2, 3]})
    view = _tick_input(rows, cluster, tenants)
    assert view.held_back == {2: "tenant acme holds 4 of its 6-GPU quota"}
    tick = _tick_pass(policy, view, cluster)
    # The forecast starts from every job (control.forecast adds those the tick held back)
    # and holds back with the same rule.
    unlimited = {key: dataclasses.replace(t, gpu_quota=100) for key, t in tenants.items()}
    everything = _tick_input(rows, cluster, unlimited).snapshot
    first = forecast_pass(policy, {"acme": 6, "beta": 4}).run(everything)

    simulated = _simulated_pass(policy, rows, tenants)

    assert tick == first.decisions == [Start("job-3", (4, 5, 6, 7)), Preempt("job-1")]
    assert first.waits["job-2"].startswith("stopping job-1")
    # The simulator's plan is by count (its placement picks the GPUs at binding).
    assert [(job.id, n) for job, n in simulated[1]] == [("job-3", 4), ("job-1", 0)]
    assert _counts(tick) == {job.id: n for job, n in simulated[1]}
    assert simulated[3] == {"job-2": first.waits["job-2"]}
    assert simulated[4] == first.stopped


def test_a_job_over_its_quota_waits_with_the_same_words_in_the_three_passes(
    policy: Policy,
) -> None:
    """acme (quota 4) runs a job on 4; its next normal job waits (nobody of a lower class
    to stop), with the tick's words, while beta's starts."""
    tenants = {1: TenantRow("acme", 4, False, 1.0), 2: TenantRow("beta", 4, False, 1.0)}
    rows = [_row(1, 1, 4, NORMAL, holds=4), _row(2, 1, 2, NORMAL), _row(3, 2, 4, NORMAL)]
    cluster = _cluster({1: [0, 1, 2, 3]})
    view = _tick_input(rows, cluster, tenants)
    tick = _tick_pass(policy, view, cluster)
    unlimited = {key: dataclasses.replace(t, gpu_quota=100) for key, t in tenants.items()}
    first = forecast_pass(policy, {"acme": 4, "beta": 4}).run(
        _tick_input(rows, cluster, unlimited).snapshot
    )
    simulated = _simulated_pass(policy, rows, tenants)

    reason = "tenant acme holds 4 of its 4-GPU quota"
    assert view.held_back == {2: reason}
    assert tick == first.decisions == [Start("job-3", (4, 5, 6, 7))]
    assert {job.id: n for job, n in simulated[1]} == _counts(tick)
    assert simulated[3] == first.waits == {"job-2": reason}


# -- elastic jobs under a quota: growth is checked, a start is cut to what fits -------------

ELASTIC_SIM = {"max_scale": 1.0, "min_fraction": 0.5}
"""The simulator's elastic jobs as the rows below: no extras, a minimum of half the request."""


def _elastic(row: JobRow) -> JobRow:
    """``row`` as an elastic job: its minimum half its request (as :data:`ELASTIC_SIM`)."""
    return dataclasses.replace(row, min_gpus=(row.gpus + 1) // 2)


@pytest.fixture
def elastic() -> Iterator[Policy]:
    with override_settings(FAIR_SHARE=False, CLASS_AGEING_SECONDS=86400):
        yield live_policy("elastic-tiresias")


def test_an_elastic_start_over_the_quota_starts_on_what_fits_in_the_three_passes(
    elastic: Policy,
) -> None:
    """acme (quota 6) runs a job on 2; its elastic job asks for 6 (at least 3): its minimum
    fits, its request does not; the three passes start it on the 4 that fit."""
    tenants = {1: TenantRow("acme", 6, False, 1.0), 2: TenantRow("beta", 4, False, 1.0)}
    rows = [_row(1, 1, 2, NORMAL, holds=2), _elastic(_row(2, 1, 6, NORMAL))]
    cluster = _cluster({1: [0, 1]})
    view = _tick_input(rows, cluster, tenants)
    tick = _tick_result(elastic, view, cluster)
    first = forecast_pass(elastic, {"acme": 6, "beta": 4}).run(view.snapshot)
    simulated = _simulated_pass(elastic, rows, tenants, **ELASTIC_SIM)

    assert view.held_back == {}
    assert tick.decisions == first.decisions == [Start("job-2", (2, 3, 4, 5), base=3)]
    assert [(job.id, n) for job, n in simulated[1]] == [("job-2", 4)]
    assert tick.waits == first.waits == simulated[3] == {}


def test_an_elastic_job_growing_back_over_the_quota_is_held_in_the_three_passes(
    elastic: Policy,
) -> None:
    """acme (quota 4) runs a job on 2 and an elastic one on 2 of the 4 it asked for; with
    4 GPUs free the policy grows it back, which would take acme to 6: the three passes
    keep it at 2 and say why, and start beta's job."""
    tenants = {1: TenantRow("acme", 4, False, 1.0), 2: TenantRow("beta", 4, False, 1.0)}
    rows = [
        _row(4, 1, 2, NORMAL, holds=2),
        _elastic(_row(1, 1, 4, NORMAL, holds=2)),
        _row(3, 2, 2, NORMAL),
    ]
    cluster = _cluster({4: [0, 1], 1: [2, 3]})
    view = _tick_input(rows, cluster, tenants)
    tick = _tick_result(elastic, view, cluster)
    first = forecast_pass(elastic, {"acme": 4, "beta": 4}).run(view.snapshot)
    # In the simulator job-1 is on 2 of its 4 because the quota cut its start at time 0.
    simulated = _simulated_pass(elastic, rows, tenants, **ELASTIC_SIM)

    reason = "tenant acme holds 4 of its 4-GPU quota"
    assert tick.decisions == first.decisions == [Start("job-3", (4, 5))]
    assert [(job.id, n) for job, n in simulated[1]] == [("job-3", 2)]
    assert tick.waits == first.waits == simulated[3] == {"job-1": reason}
