"""The live forecast follows dependencies and an array's cap: a waiting job's estimated start
is its dependency's estimated finish, even with GPUs free; a job that only runs if another
fails gets no estimate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from control.forecast import DUE_KEY, LOCK_KEY, forget_asked, refresh_forecast
from control.tick import run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster, drain_all

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_redis() -> Iterator[None]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(DUE_KEY, LOCK_KEY)
    forget_asked()
    yield


def submit(user: Any, tenant: Tenant, gpus: int, name: str, **fields: Any) -> Job:
    data = {"name": name, "workload": "resnet18-synthetic", "args": {"steps": 1000},
            "gpus": gpus, "min_gpus": gpus, "max_gpus": gpus, "batch_size": 32, **fields}  # fmt: skip
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


@override_settings(SCHEDULER_POLICY="fifo")
def test_a_waiting_job_is_estimated_to_start_when_its_dependency_finishes(
    alice: Any, acme: Tenant
) -> None:
    nodes = demo_cluster()
    acme.profile_jobs = False
    acme.save()
    first = submit(alice, acme, 4, "first")
    run_tick(policy="fifo")
    drain_all(nodes)
    # 600 of 1000 steps done at 320 samples/s: 400 x 32 / 320 = 40 s left.
    Job.objects.filter(pk=first.pk).update(step=600, samples_per_s=320.0)
    then = submit(alice, acme, 2, "then", after=[{"kind": "after_ok", "job": first.pk}])
    on_failure = submit(alice, acme, 2, "oops", after=[{"kind": "after_failed", "job": first.pk}])
    now = timezone.now()
    assert refresh_forecast(now) is not None
    first.refresh_from_db()
    then.refresh_from_db()
    on_failure.refresh_from_db()
    assert then.state == "pending" and first.estimated_finish is not None
    assert then.estimated_start == first.estimated_finish  # 4 GPUs are free: it still waits
    assert on_failure.estimated_start is None  # the forecast assumes success
    assert on_failure.estimate_reason == "starts only if what it waits for fails"
