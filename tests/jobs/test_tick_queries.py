"""A steady tick's queries depend on neither the cluster nor the churn: 50 or 500 jobs, same count.

Real PostgreSQL (the incremental tick keeps its state only there) and Redis.
Each measured tick follows the same churn: a few running jobs finish through
the report handler, as many arrive through the submission service.  The tick
must start the arrivals, and make exactly as many queries with ten times the
jobs around them, or with three times the churn: nothing in a steady tick may
read, lock or write per unchanged job, nor per changed job (the writes go in
bulk).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from control import fair_share, incremental
from control.reports import handle_report
from control.tick import TickResult, run_tick
from inventory.models import Server
from jobs.choices import EventKind, JobState
from jobs.models import Job, JobEvent
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)

FABRIC = {"leaves": 16, "spines": 8, "servers_per_leaf": 4, "gpus_per_server": 8}  # 512 GPUs
POLICY = "elastic-tiresias"
CHURN = 4


@pytest.fixture(autouse=True)
def kept_state(settings: Any) -> Iterator[None]:
    """The incremental tick of a fresh scheduler process; no verify pass among the ticks.

    No agent here lists processes in its heartbeats: reconcile must not start
    judging the jobs because a loaded machine made the setup slow (its exact
    check, two more queries, is for jobs silent longer than the limits).
    """
    settings.TICK_INCREMENTAL = True
    settings.TICK_VERIFY_EVERY = 10_000
    settings.RECONCILE_SECONDS = 3600.0
    settings.RECONCILE_START_SECONDS = 3600.0
    incremental.forget()
    fair_share.forget()
    yield
    incremental.forget()


def _bulk_jobs(tenant: Any, owner: Any, count: int) -> None:
    """``count`` queued one-GPU jobs with the rows a submission writes (setup: in bulk)."""
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        Job(
            tenant=tenant,
            submitter=owner,
            name="rigid",
            workload="mlp-digits",
            gpus=1,
            min_gpus=1,
            max_gpus=1,
            batch_size=64,
            state=JobState.QUEUED,
            submitted_at=now,
        )
        for _ in range(count)
    )
    JobEvent.objects.bulk_create(
        JobEvent(job=job, at=now, kind=EventKind.STATE, to_state=JobState.QUEUED) for job in jobs
    )


def _tick() -> TickResult:
    Server.objects.update(last_heartbeat=timezone.now())  # every agent alive
    result = run_tick(policy=POLICY)
    assert result.ran
    return result


def _churned_tick(
    tenant: Any, owner: Any, serial: int, churn: int = CHURN
) -> tuple[int, TickResult]:
    """Finish ``churn`` running jobs, submit as many; the queries of the tick that follows."""
    running = list(Job.objects.filter(state=JobState.RUNNING).order_by("pk")[:churn])
    for offset, job in enumerate(running):
        report = {
            "type": "finished",
            "node": "node-0",
            "job": f"job-{job.pk}",
            "event_id": f"{serial + offset}-0",
            "step": 1,
        }
        handle_report(report)
    assert not Job.objects.filter(pk__in=[j.pk for j in running], state=JobState.RUNNING).exists()
    data = {"name": "new", "workload": "mlp-digits", "gpus": 1, "min_gpus": 1, "max_gpus": 1}
    for _ in range(churn):
        do_submit_job(user=owner, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))
    Server.objects.update(last_heartbeat=timezone.now())
    with CaptureQueriesContext(connection) as captured:
        result = run_tick(policy=POLICY)
    assert result.ran
    return len(captured), result


def test_a_steady_ticks_queries_do_not_grow_with_unchanged_jobs(alice: Any, acme: Any) -> None:
    demo_cluster(FABRIC)
    acme.profile_jobs = False
    acme.gpu_quota = 10_000
    acme.max_queued_jobs = 10_000
    acme.save()
    counts: dict[int, int] = {}
    serial = 1_700_000_000_000
    for total in (50, 500):
        _bulk_jobs(acme, alice, total - Job.objects.filter(state=JobState.RUNNING).count())
        _tick()  # places the new jobs
        _tick()  # a tick with nothing new: the kept state is up to date
        assert Job.objects.filter(state=JobState.RUNNING).count() == total
        serial += 1000
        counts[total], result = _churned_tick(acme, alice, serial)
        started = Job.objects.filter(state=JobState.RUNNING, name="new").count()
        assert started == CHURN * (1 + (total == 500)), "the arrivals start"
        assert len(result.changed_jobs) == CHURN
        assert Job.objects.filter(state=JobState.RUNNING).count() == total
    assert counts[500] == counts[50], counts
    # Nor per changed job: three times the churn, the same queries (the writes go in bulk).
    more, result = _churned_tick(acme, alice, serial + 1000, churn=3 * CHURN)
    assert len(result.changed_jobs) == 3 * CHURN
    assert more == counts[50], (more, counts)
