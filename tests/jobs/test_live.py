"""The live pages' snapshots: scoping, queue positions, series, and a fixed number of queries."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devtools.job_steps import move
from jobs.live.snapshots import job_snapshot, tenant_snapshot
from jobs.live.summary import queue_state
from jobs.models import Job, JobMetric
from jobs.services import check_job_spec, do_set_parallelism, do_submit_job
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def submit(user: Any, tenant: Tenant, name: str = "j", gpus: int = 1) -> Job:
    spec = check_job_spec(
        tenant=tenant, data={"name": name, "workload": "mlp-digits", "gpus": gpus, "max_gpus": 4}
    )
    return do_submit_job(user=user, tenant=tenant, spec=spec)


def test_snapshots_are_scoped_like_pages(
    alice: Any, bob: Any, acme: Tenant, globex: Tenant
) -> None:
    mine = submit(alice, acme)
    theirs = submit(bob, globex)
    client = Client()
    client.force_login(alice)
    assert client.get(f"/live/tenants/{acme.pk}/jobs.json").status_code == 200
    assert client.get(f"/live/tenants/{globex.pk}/jobs.json").status_code == 404
    assert client.get(f"/live/jobs/{mine.pk}.json").status_code == 200
    assert client.get(f"/live/jobs/{theirs.pk}.json").status_code == 404
    assert Client().get(f"/live/jobs/{mine.pk}.json").status_code == 302  # to the login page


def test_tenant_snapshot_counts_queue_and_quota(
    alice: Any, bob: Any, acme: Tenant, globex: Tenant
) -> None:
    first = submit(alice, acme, "a")
    second = submit(bob, globex, "b")  # another tenant's job, submitted earlier
    third = submit(alice, acme, "c", gpus=2)
    move(job_id=first.pk, to_state="running", reason="t", parallelism=3)
    # Positions are the policy's order as the forecast stored it, not submission order;
    # a job no longer queued shows none even before the next refresh clears it.
    Job.objects.filter(pk=third.pk).update(queue_position=1)
    Job.objects.filter(pk=second.pk).update(queue_position=2)
    Job.objects.filter(pk=first.pk).update(queue_position=3)
    snap = tenant_snapshot(acme, Job.objects.restrict(alice))
    rows = {row["id"]: row for row in snap["jobs"]}
    assert set(rows) == {first.pk, third.pk}
    assert rows[first.pk]["queue_position"] is None and rows[third.pk]["queue_position"] == 1
    assert snap["in_use"] == 3 and snap["counts"]["running"] == 1 and snap["counts"]["queued"] == 1


def test_tenant_snapshot_query_count_does_not_grow_with_jobs(alice: Any, acme: Tenant) -> None:
    submit(alice, acme)
    with CaptureQueriesContext(connection) as few:
        tenant_snapshot(acme, Job.objects.restrict(alice))
    for i in range(15):
        submit(alice, acme, f"j{i}")
    with CaptureQueriesContext(connection) as many:
        tenant_snapshot(acme, Job.objects.restrict(alice))
    assert len(many) == len(few)


def test_job_snapshot_series(alice: Any, acme: Tenant) -> None:
    job = submit(alice, acme)
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=1)
    do_set_parallelism(job_id=job.pk, parallelism=4, reason="grew onto idle GPUs")
    now = timezone.now()
    for step in (10, 20, 30):
        JobMetric.objects.create(
            job=job, at=now, step=step, parallelism=4, samples_per_s=step * 10.0
        )
    Job.objects.filter(pk=job.pk).update(
        throughput_curve={"4": 300.0, "1": 100.0, "2": 180.0}, log_tail="a\nb\nc\n"
    )
    job.refresh_from_db()
    snap = job_snapshot(job)
    assert snap["parallelism_series"]["gpus"] == [0, 0, 1, 4]
    assert snap["throughput_series"]["step"] == [10, 20, 30]
    assert snap["profile"] == {"gpus": [1, 2, 4], "samples_per_second": [100.0, 180.0, 300.0]}
    assert snap["log"] == ["a", "b", "c"]
    assert snap["events"][-1]["reason"] == "grew onto idle GPUs"


def test_queue_state_ranks_the_stored_order_and_counts_the_unranked(
    alice: Any, bob: Any, acme: Tenant, globex: Tenant
) -> None:
    """One query gives the events' positions (1, 2, ... with leavers taken out) and the length."""
    left, second, first, fresh = (submit(alice, acme, n) for n in "abcd")
    theirs = submit(bob, globex, "e")
    for job, position in ((left, 1), (first, 2), (theirs, 4), (second, 7)):
        Job.objects.filter(pk=job.pk).update(queue_position=position)
    move(job_id=left.pk, to_state="running", reason="t", parallelism=1)  # left the queue
    ranks, queued = queue_state()
    assert ranks == {first.pk: (1, acme.pk), theirs.pk: (2, globex.pk), second.pk: (3, acme.pk)}
    assert fresh.pk not in ranks and queued == 4  # queued since the refresh: counted, unranked
