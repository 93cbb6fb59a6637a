"""Tenant quotas through the real tick: an elastic job whose minimum fits its tenant's
quota but whose request does not starts on the GPUs that fit (scheduler.quota)."""

from __future__ import annotations

from typing import Any

import pytest

from control.tick import run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(user: Any, tenant: Any, gpus: int, lo: int) -> Job:
    data = {"name": f"j{gpus}", "workload": "mlp-digits", "gpus": gpus, "min_gpus": lo,
            "max_gpus": gpus}  # fmt: skip
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


@pytest.mark.parametrize("policy", ["fifo", "elastic-tiresias"])
def test_an_elastic_job_over_its_quota_starts_on_what_fits_within_two_ticks(
    alice: Any, acme: Any, policy: str
) -> None:
    """acme (quota 5) runs a job on 2; its elastic job asks for 4, at least 2: it starts
    on 3 (not dropped at every tick), and acme holds its 5."""
    demo_cluster()
    acme.gpu_quota = 5
    acme.profile_jobs = False  # profiling has its own tests
    acme.save()
    first = _submit(alice, acme, gpus=2, lo=2)
    run_tick(policy=policy)
    assert Job.objects.get(pk=first.pk).state == "running"
    elastic = _submit(alice, acme, gpus=4, lo=2)
    for _ in range(2):
        run_tick(policy=policy)
        elastic.refresh_from_db()
        if elastic.state == "running":
            break
    assert (elastic.state, elastic.parallelism) == ("running", 3)
    running = Job.objects.filter(tenant=acme, state="running")
    assert sum(min(j.parallelism, j.gpus) for j in running) == 5
