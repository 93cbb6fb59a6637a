"""Priority classes and tenant fair share in the live control plane (the real tick, database, Redis).

The rules live in the policy cores (``scheduler/policies``); these tests check
that the tick feeds them what they need: each job's priority, each tenant's
weight and its decayed GPU-seconds held (``control.fair_share``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from control import fair_share
from control.tick import run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_usage(settings: Any) -> Iterator[None]:
    """Every tick reads the usage history again (the kept reading would outlive the test)."""
    settings.FAIR_SHARE_REFRESH_SECONDS = 0.0
    fair_share.forget()
    yield
    fair_share.forget()


def submit(user: Any, tenant: Tenant, name: str, gpus: int, priority: int = 50) -> Job:
    data = {"name": name, "workload": "mlp-digits", "gpus": gpus, "priority": priority}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def state(job: Job) -> str:
    job.refresh_from_db()
    return job.state


@pytest.mark.parametrize("policy", ["tiresias", "elastic-tiresias"])
def test_a_high_priority_job_starts_before_queued_normal_ones_and_preempts_a_low_one(
    policy: str, make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]
) -> None:
    tenant = make_tenant("big", quota=16)
    user = make_user("carol", tenant)
    demo_cluster()  # 8 GPUs
    low = submit(user, tenant, "low", 4, priority=10)
    running = submit(user, tenant, "normal-1", 4)
    run_tick(policy=policy)
    assert (state(low), state(running)) == ("running", "running")

    waiting = submit(user, tenant, "normal-2", 4)  # submitted first ...
    high = submit(user, tenant, "high", 4, priority=90)  # ... but of a higher class
    run_tick(policy=policy)
    run_tick(policy=policy)

    assert state(high) == "running"
    assert state(running) == "running"  # same class as the queued one: never displaced by it
    assert state(waiting) == "queued"
    assert state(low) == "queued"
    assert low.events.filter(kind="preempted").exists()


@pytest.mark.parametrize(("enabled", "first"), [(True, "initech"), (False, "acme")])
def test_the_tenant_below_its_share_gets_the_free_gpus_first(
    enabled: bool,
    first: str,
    settings: Any,
    make_tenant: Callable[..., Tenant],
    make_user: Callable[..., Any],
) -> None:
    """acme held the whole cluster a moment ago; initech held nothing (equal weights)."""
    settings.FAIR_SHARE = enabled
    acme, initech = make_tenant("acme", quota=8), make_tenant("initech", quota=8)
    alice, ivan = make_user("alice", acme), make_user("ivan", initech)
    demo_cluster()
    used = submit(alice, acme, "used", 8)
    run_tick(policy="tiresias")
    assert state(used) == "running"
    mine = submit(alice, acme, "acme-next", 8)  # submitted first
    theirs = submit(ivan, initech, "initech-next", 8)
    do_cancel_job(user=alice, job_id=used.pk)
    run_tick(policy="tiresias")
    run_tick(policy="tiresias")

    started = {job.tenant.slug for job in (mine, theirs) if state(job) == "running"}
    assert started == {first}


def test_weights_scale_the_share(
    settings: Any, make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]
) -> None:
    """The same history as above, but acme weighs a million times initech: acme goes first."""
    acme, initech = make_tenant("acme", quota=8), make_tenant("initech", quota=8)
    Tenant.objects.filter(pk=acme.pk).update(priority_weight=1e6)
    alice, ivan = make_user("alice", acme), make_user("ivan", initech)
    demo_cluster()
    used = submit(alice, acme, "used", 8)
    run_tick(policy="tiresias")
    other = submit(ivan, initech, "initech-before", 8)  # initech gets a little usage too
    do_cancel_job(user=alice, job_id=used.pk)
    run_tick(policy="tiresias")
    run_tick(policy="tiresias")
    assert state(other) == "running"
    mine = submit(alice, acme, "acme-next", 8)
    theirs = submit(ivan, initech, "initech-next", 8)
    do_cancel_job(user=ivan, job_id=other.pk)
    run_tick(policy="tiresias")
    run_tick(policy="tiresias")
    assert (state(mine), state(theirs)) == ("running", "queued")


@pytest.mark.parametrize(("ageing", "first"), [(60.0, "low"), (0.0, "normal")])
def test_a_low_job_that_waited_a_period_counts_as_normal(
    ageing: float,
    first: str,
    settings: Any,
    make_tenant: Callable[..., Tenant],
    make_user: Callable[..., Any],
) -> None:
    """Class ageing in the live tick: the wait comes from the job's latest state event."""
    settings.CLASS_AGEING_SECONDS = ageing
    tenant = make_tenant("big", quota=16)
    user = make_user("carol", tenant)
    demo_cluster()
    blocker = submit(user, tenant, "blocker", 8)
    run_tick(policy="tiresias")
    low = submit(user, tenant, "low", 8, priority=10)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=low.pk).update(submitted_at=an_hour_ago)
    low.events.update(at=an_hour_ago)
    normal = submit(user, tenant, "normal", 8)
    run_tick(policy="tiresias")
    assert (state(low), state(normal)) == ("queued", "queued")
    do_cancel_job(user=user, job_id=blocker.pk)
    run_tick(policy="tiresias")
    run_tick(policy="tiresias")
    started = {name for name, job in (("low", low), ("normal", normal)) if state(job) == "running"}
    assert started == {first}


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "elastic-tiresias"])
def test_a_higher_class_preempts_its_own_tenants_lower_class_job_to_fit_its_quota(
    policy: str, make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]
) -> None:
    """Issue 37, tried as a new user would: a tenant with an 8-GPU quota runs an 8-GPU
    low-priority job, then submits a 4-GPU high-priority one.  Before, it waited ("holds 8
    of its 8-GPU quota") for as long as the low job ran; now the low job is stopped (it
    resumes from its checkpoint later) and the high one starts within two ticks."""
    tenant = make_tenant("solo", quota=8)
    user = make_user("dora", tenant)
    demo_cluster()  # 8 GPUs
    low = submit(user, tenant, "low", 8, priority=10)
    run_tick(policy=policy)
    assert state(low) == "running"

    high = submit(user, tenant, "high", 4, priority=90)
    run_tick(policy=policy)
    run_tick(policy=policy)
    assert state(high) == "running"
    assert state(low) == "queued"
    stopped = low.events.filter(kind="preempted").latest("at")
    assert "quota" in stopped.reason and "checkpoint" in stopped.reason
    for _ in range(3):  # it waits while the high job runs, within the quota: no flapping
        run_tick(policy=policy)
    assert (state(high), state(low)) == ("running", "queued")
    assert "quota" in (Job.objects.get(pk=low.pk).wait_reason or "")


def test_a_job_of_the_same_class_or_another_tenant_is_never_stopped_for_the_quota(
    make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]
) -> None:
    acme, other = make_tenant("acme2", quota=4), make_tenant("other2", quota=8)
    ann, bob = make_user("ann", acme), make_user("bob", other)
    demo_cluster()  # 8 GPUs
    mine = submit(ann, acme, "mine", 4, priority=50)
    theirs = submit(bob, other, "theirs", 4, priority=10)
    run_tick(policy="tiresias")
    again = submit(ann, acme, "again", 4, priority=60)  # the same (normal) class
    run_tick(policy="tiresias")
    run_tick(policy="tiresias")
    assert (state(mine), state(theirs), state(again)) == ("running", "running", "queued")
    assert "holds 4 of its 4-GPU quota" in (Job.objects.get(pk=again.pk).wait_reason or "")
