"""Issue 38 on the real tick and forecast: CPU and memory packed into servers, and the
forecast holding the per-type quota the tick holds (the two-type demo cluster,
``portal.demo.two_type_fabric``: A100 servers of 32 cores and 2 GPUs on leaf 0, H100
servers of 64 cores on leaf 1)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from control.forecast import compute_forecast
from control.tick import run_tick
from inventory.models import Server
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from portal.demo import two_type_fabric
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
