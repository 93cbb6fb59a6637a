"""The live tick on a typed cluster keeps its policy core per GPU-type pool, and the kept
state, its pools' decisions and their typed binding equal a full rebuild's every tick.

Three GPU types on four leaves; jobs arrive asking for one type, a list or any type
(one with a node selector), run, scale in and out (their runtime's ``scale_done``),
finish, are cancelled, and queued ones change the types they accept (an admin's
direct update: only the row's version says so) and so move from pool to pool.
Before and after every tick the kept state (``control.incremental``) is compared with
a full rebuild from the database, the whole scheduling pass is run on both as the
tick runs it (the kept side with the kept per-pool cores and the binding's narrowed
type map, the rebuilt side with a fresh policy and every GPU's type), and the results
must be the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from control import incremental
from control.incremental import Prepared, compare, rebuild
from control.policy import live_policy
from control.reports import handle_report
from control.state import AssembledHoldBack
from control.tick import run_tick
from inventory.services import do_set_server_state
from jobs.models import Job, JobGpu
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from scheduler.binding import bind_typed
from scheduler.gpu_types import is_typed, split_by_type
from scheduler.pipeline import AllocatorBind, Binding, Candidates, PolicyDecide, snapshot_pass
from scheduler.placement import CountPlacement
from scheduler.types import Decision
from tests.jobs.control_helpers import demo_cluster, drain_all

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the kept state reads PostgreSQL's row versions"
    ),
]

POLICY = "elastic-tiresias"
A100, H100, L40S = "a100-40g", "h100-80g", "l40s-48g"
LEAF_TYPES = (A100, H100, L40S, L40S)


def three_types() -> dict[str, object]:
    """Four leaves of two 4-GPU servers: A100s, H100s, then two leaves of L40S; a pool label
    per server (``train`` on slot 0, ``serve`` on slot 1)."""
    servers = [
        {
            "leaf": leaf,
            "slot": slot,
            "node": f"{gpu_type.split('-')[0]}-{leaf}-{slot}",
            "gpu_type": gpu_type,
            "cpu_cores": 64,
            "memory_mib": 512 * 1024,
            "labels": {"pool": "train" if slot == 0 else "serve"},
        }
        for leaf, gpu_type in enumerate(LEAF_TYPES)
        for slot in range(2)
    ]
    return {
        "leaves": 4,
        "spines": 4,
        "servers_per_leaf": 2,
        "gpus_per_server": 4,
        "servers": servers,
    }


@pytest.fixture(autouse=True)
def fresh_process(settings: Any) -> Iterator[None]:
    """Each test starts as a new scheduler process would, ticking incrementally."""
    settings.TICK_INCREMENTAL = True
    settings.TICK_VERIFY_EVERY = 10_000  # the test's own comparisons, until it says
    incremental.forget()
    yield
    incremental.forget()


def submit(user: Any, tenant: Any, gpus: int, lo: int, hi: int, **fields: Any) -> Job:
    data = {"name": "t", "workload": "mlp-digits", "gpus": gpus, "min_gpus": lo, "max_gpus": hi}
    spec = check_job_spec(tenant=tenant, data={**data, **fields})
    return do_submit_job(user=user, tenant=tenant, spec=spec)


def kept_pass_equals_rebuilt_pass() -> list[Decision]:
    """The kept state equals a full rebuild, and the tick's whole pass on each decides and
    binds the same: the kept per-pool cores against a fresh policy, the binding's narrowed
    type map against every GPU's type.  The bound jobs are marked touched, as the tick does
    (binding left the kept allocator in the bound state)."""
    now = timezone.now()
    kept = incremental.kept_state()
    cluster = kept.cluster()
    assert cluster is not None
    mine = Prepared(cluster, kept.allocator(cluster), kept.policy_input(cluster, now))
    reference = rebuild(now, epoch=kept.epoch)  # the kept views' time base
    assert reference is not None
    assert compare(mine, reference) == []
    snapshot = mine.view.snapshot
    assert is_typed(snapshot)
    kept_pass = snapshot_pass(
        AssembledHoldBack(),
        PolicyDecide(kept.policy(POLICY), CountPlacement(), kept.speed_tables()),
        AllocatorBind(cluster.spec, mine.allocator, cluster.gpu_types),
    ).run(mine.view)
    # The reference: a fresh core per pool, and bind_typed told every GPU's type.
    fresh = snapshot_pass(
        AssembledHoldBack(),
        PolicyDecide(live_policy(POLICY), CountPlacement()),
        _FullTypeBind(cluster.gpu_types, reference),
    ).run(reference.view)
    assert kept_pass.decisions == fresh.decisions
    assert kept_pass.waits == fresh.waits and kept_pass.stopped == fresh.stopped
    assert kept_pass.bound[0] == fresh.bound[0]
    allocations = {job: a.gpus for job, a in mine.allocator.allocations().items()}
    assert allocations == {j: a.gpus for j, a in reference.allocator.allocations().items()}
    kept.touched(mine.view.ids[b.job] for b in kept_pass.bound[0].bound)
    return kept_pass.decisions


class _FullTypeBind:
    """The tick's typed binding as it was before the narrowed type map: every GPU's type."""

    def __init__(self, gpu_types: Any, reference: Prepared) -> None:
        self.gpu_types, self.reference = gpu_types, reference

    def bind(
        self, candidates: Candidates, decisions: list[Decision]
    ) -> tuple[Binding, dict[str, str]]:
        split = split_by_type(candidates.snapshot)
        assert split is not None
        allowed = {j: ids for pool in split.pools for j, ids in pool.allowed.items()}
        spec, allocator = self.reference.cluster.spec, self.reference.allocator
        bound, refused = bind_typed(spec, allocator, decisions, self.gpu_types, allowed)
        return Binding(bound, refused), {r.job: r.reason for r in refused}


def report(job: Job, kind: str, serial: int, **fields: Any) -> str:
    node = JobGpu.objects.filter(job=job).values_list("gpu__server__node", flat=True).first()
    payload = {"type": kind, "node": node, "job": f"job-{job.pk}", "event_id": f"{serial}-0"}
    return handle_report({**payload, **fields})


def tick_and_compare() -> None:
    kept_pass_equals_rebuilt_pass()
    assert run_tick(policy=POLICY).ran
    kept_pass_equals_rebuilt_pass()


def test_the_typed_tick_keeps_a_core_per_pool_equal_to_a_rebuild_every_tick(
    alice: Any, acme: Any, settings: Any
) -> None:
    nodes = demo_cluster(three_types())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs = 32, False
    acme.save()
    jobs = [
        submit(alice, acme, 2, 1, 4, gpu_types=[A100]),
        submit(alice, acme, 4, 2, 8, gpu_types=[H100]),
        submit(alice, acme, 2, 2, 8, gpu_types=[L40S, H100]),
        submit(alice, acme, 1, 1, 2),  # any type
        submit(alice, acme, 2, 1, 2, gpu_types=[L40S], node_selector={"pool": "serve"}),
    ]
    tick_and_compare()
    kept = incremental.kept_state().policy(POLICY)
    assert set(kept.pools) == {A100, H100, L40S} and kept.kept is None
    serial = 1_700_000_000_000
    for job in Job.objects.filter(state="running"):  # progress: only the rows change
        serial += 1
        report(job, "progress", serial, step=5, samples_per_s=100.0, world=job.parallelism)
    tick_and_compare()
    # Arrivals on every type: the elastic jobs give GPUs back (scale-ins, then reports).
    jobs += [submit(alice, acme, 4, 4, 4, gpu_types=[t]) for t in (A100, H100, L40S)]
    jobs.append(submit(alice, acme, 8, 8, 8, gpu_types=[H100]))  # waits for the H100s
    tick_and_compare()
    for job in Job.objects.filter(state="scaling"):
        serial += 1
        report(job, "scale_done", serial, world=JobGpu.objects.filter(job=job).count(), step=9)
    tick_and_compare()
    # Queued jobs change the types they accept behind the tick's back: they change pools.
    queued = list(Job.objects.filter(state="queued").order_by("pk"))
    assert queued, "the H100 job waits"
    for job, types in zip(queued, ([L40S, A100], [A100], [H100]), strict=False):
        Job.objects.filter(pk=job.pk).update(gpu_types=types)
    tick_and_compare()
    # An ending, a cancellation, a server of one type going down: jobs leave their pools.
    running = list(Job.objects.filter(state="running").order_by("pk"))
    serial += 1
    assert report(running[0], "finished", serial, step=50) == "completed"
    do_cancel_job(user=alice, job_id=running[1].pk)
    tick_and_compare()
    held = JobGpu.objects.filter(gpu__server__gpu_type=L40S).select_related("gpu__server").first()
    if held is not None:
        do_set_server_state(node=held.gpu.server.node, state="draining")
    tick_and_compare()
    for job in Job.objects.filter(state="scaling"):
        serial += 1
        report(job, "scale_done", serial, world=JobGpu.objects.filter(job=job).count(), step=19)
    jobs.append(submit(alice, acme, 2, 1, 4, gpu_types=[A100, L40S]))
    settings.TICK_VERIFY_EVERY = 1  # the tick's own verify too, every tick from here
    for _ in range(3):
        tick_and_compare()
    state = incremental.kept_state()
    assert state.verifications >= 3 and state.mismatches == 0
    # The pools' cores were kept through every tick: made once each, never again.
    assert state.policy(POLICY) is kept and kept.rebuilds == 3
    drain_all(nodes)
