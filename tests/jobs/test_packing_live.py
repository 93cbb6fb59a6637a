"""Issue 38 on the real tick and forecast: CPU and memory packed into servers, and the
forecast holding the per-type quota the tick holds (the two-type demo cluster,
``portal.demo.two_type_fabric``: A100 servers of 32 cores and 2 GPUs on leaf 0, H100
servers of 64 cores on leaf 1)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from control import incremental
from control.forecast import compute_forecast
from control.packing import drain_packing
from control.tick import run_tick
from inventory.models import Fabric, Server
from inventory.services import do_set_server_state
from jobs.agent_commands import runtime_job_name
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.demo import two_type_fabric
from scheduler.packing import PerGpu
from scheduler.types import ServerCapacity
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)

A100, H100 = "a100-40g", "h100-80g"


def _submit(user: Any, tenant: Any, **fields: Any) -> Job:
    data = {"name": "t", "workload": "mlp-digits", "gpus": 2, **fields}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def _servers_of(job: Job) -> set[str]:
    return set(Server.objects.filter(gpu_set__assignment__job=job).values_list("node", flat=True))


def _start(alice: Any, acme: Any, per_type: dict[str, int]) -> tuple[Job, Job]:
    """A running A100 job of acme, and a queued one its per-type quota may hold back."""
    demo_cluster(two_type_fabric())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs, acme.gpu_type_quota = 16, False, per_type
    acme.save()
    holder = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[A100])
    run_tick(policy="fifo")
    holder.refresh_from_db()
    assert holder.state == "running"
    capped = _submit(alice, acme, gpus=2, min_gpus=2, max_gpus=2, gpu_types=[A100])
    return holder, capped


@pytest.mark.parametrize(("per_type", "now"), [({A100: 2}, False), ({}, True)])
def test_the_forecast_holds_the_type_quota_the_tick_holds(
    alice: Any, acme: Any, per_type: dict[str, int], now: bool
) -> None:
    """acme may hold 2 A100s and holds them: its second A100 job is not forecast to start
    now on the two idle A100s (it starts after the holder ends, whose end is unknown here);
    without the per-type quota it starts now."""
    _, capped = _start(alice, acme, per_type)
    run_tick(policy="fifo")
    capped.refresh_from_db()
    assert (capped.state == "running") is now  # the tick's own rule, for comparison
    Job.objects.filter(pk=capped.pk).update(state="queued")
    live = compute_forecast(timezone.now())
    assert live is not None
    estimate = live.result.estimates[next(n for n, pk in live.ids.items() if pk == capped.pk)]
    if now:
        assert estimate.start == 0
    else:
        assert estimate.start is None or estimate.start > 0


def test_two_jobs_whose_cpu_needs_cannot_share_a_server_land_on_different_servers(
    alice: Any, acme: Any, settings: Any
) -> None:
    """An A100 server has 32 cores for its 2 GPUs: two 1-GPU jobs asking 24 cores a GPU
    (an H100 server offers 32 a GPU, so submit takes them) cannot share one.  The tick,
    which routes both to the idle A100s, puts them on the two A100 servers (by GPUs alone
    both would go to the first), and a third, with no A100 server's cores left, waits
    with CPU cores named.  The kept state is checked against a rebuild every tick."""
    settings.TICK_VERIFY_EVERY = 1
    incremental.forget()
    demo_cluster(two_type_fabric())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    ask = {"gpus": 1, "min_gpus": 1, "max_gpus": 1, "gpu_types": [A100, H100], "cpus_per_gpu": 24}
    jobs = [_submit(alice, acme, **ask), _submit(alice, acme, **ask)]
    run_tick(policy="fifo")
    for job in jobs:
        job.refresh_from_db()
        assert job.state == "running", job.wait_reason
    first, second = (_servers_of(job) for job in jobs)
    assert len(first) == len(second) == 1 and first != second
    assert set(
        Server.objects.filter(node__in=first | second).values_list("gpu_type", flat=True)
    ) == {A100}
    third = _submit(alice, acme, **ask)
    run_tick(policy="fifo")
    third.refresh_from_db()
    assert third.state == "queued"
    assert "CPU cores" in third.wait_reason and "24 CPU cores" in third.wait_reason
    if connection.vendor == "postgresql":  # the kept state: the same as a rebuild
        state = incremental.kept_state()
        assert state.verifications >= 1 and state.mismatches == 0
    incremental.forget()


def test_a_drain_moves_a_job_only_where_its_cores_fit(alice: Any, acme: Any) -> None:
    """Two 1-GPU jobs of 24 cores a GPU run on the two A100 servers; a100-0's drains.  Its
    job's only place of its type is the free GPU beside the other job, whose server has 8
    of its 32 cores left: the move is refused and the job stays where it is (by GPUs alone
    it would move there)."""
    demo_cluster(two_type_fabric())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    ask = {"gpus": 1, "min_gpus": 1, "max_gpus": 1, "gpu_types": [A100, H100], "cpus_per_gpu": 24}
    jobs = [_submit(alice, acme, **ask), _submit(alice, acme, **ask)]
    run_tick(policy="fifo")
    places = [_servers_of(job) for job in jobs]
    assert places[0] != places[1]
    (drained,) = places[0]
    do_set_server_state(node=drained, state="draining")
    result = run_tick(policy="fifo")
    assert _servers_of(jobs[0]) == {drained}
    assert _servers_of(jobs[1]) == places[1]
    assert any("CPU cores" in refusal.reason for refusal in result.refused)


def test_drain_packing_reads_the_requests_of_the_jobs_holding_gpus(alice: Any, acme: Any) -> None:
    demo_cluster(two_type_fabric())  # type: ignore[arg-type]
    acme.gpu_quota, acme.profile_jobs = 16, False
    acme.save()
    ask = {"gpus": 1, "min_gpus": 1, "max_gpus": 1, "gpu_types": [H100]}
    running = _submit(alice, acme, cpus_per_gpu=8, mem_per_gpu_mib=1024, **ask)
    plain = _submit(alice, acme, **ask)
    run_tick(policy="fifo")
    queued = _submit(alice, acme, cpus_per_gpu=4, **ask)  # holds nothing: not counted
    spec = Fabric.objects.get().spec()
    capacity = {2: ServerCapacity(cpus=64, mem_mib=512 * 1024), 3: ServerCapacity()}
    packing = drain_packing(spec, capacity)
    assert packing is not None
    assert packing.requests == {runtime_job_name(running.pk): PerGpu(8, 1024)}
    assert set(packing.capacity) == {2}  # a server of unknown capacity bounds nothing
    assert runtime_job_name(plain.pk) not in packing.requests
    assert runtime_job_name(queued.pk) not in packing.requests
    assert drain_packing(spec, {3: ServerCapacity()}) is None
