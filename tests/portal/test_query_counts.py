"""Pages and API answer in a fixed number of queries, however many jobs the database holds.

Each page is requested with a small history and again with three times as many
jobs (running, queued and finished, each with events); the number of SQL
queries must not change.  ``bench/pages.py`` measures their time at 10,000 jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_heartbeat, do_load_topology
from jobs.lifecycle import broadcast, transition
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db

SPEC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 4}


def _add_jobs(tenant: Tenant, count: int) -> None:
    """Submit ``count`` jobs, place what fits, and finish half of those still waiting."""
    owner = tenant.memberships.get().user
    for i in range(count):
        data = {"name": f"j{i}", "workload": "mlp-digits", "gpus": 1 + i % 2}
        do_submit_job(user=owner, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))
    for node in Server.objects.values_list("node", flat=True):
        do_heartbeat(node=node, info={})
    run_tick(policy="fifo")
    waiting = list(Job.objects.filter(state="queued").order_by("pk"))
    for job in waiting[::2]:
        transition(job, "cancelled", reason="test history", at=timezone.now())


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(captured)


def test_no_page_makes_more_queries_when_there_are_more_jobs(
    make_tenant: Callable[..., Tenant], make_user: Callable[..., Any]
) -> None:
    do_load_topology(SPEC)
    acme = make_tenant("acme", quota=16)
    admin, owner = Client(), Client()
    admin.force_login(make_user("root", staff=True))
    owner.force_login(acme.memberships.get().user)

    def urls() -> list[tuple[Client, str]]:
        job = Job.objects.filter(tenant=acme, state="running").earliest("pk")
        return [
            (owner, "/"),
            (owner, "/api/v1/jobs/?page_size=50"),
            (admin, "/api/v1/jobs/?page_size=50"),
            (owner, f"/jobs/{job.pk}/"),
            (owner, f"/api/v1/jobs/{job.pk}/events/"),
            (owner, f"/live/tenants/{acme.pk}/jobs.json"),
            (owner, f"/live/jobs/{job.pk}.json"),
            (admin, "/cluster/"),
            (admin, "/live/cluster.json"),
            (owner, "/usage/"),
            (admin, "/usage/all/"),
        ]

    _add_jobs(acme, 8)
    for client, url in urls():  # warm caches (sessions, content types, fair share)
        client.get(url)
    small = {url: _queries(client, url) for client, url in urls()}
    _add_jobs(acme, 24)
    assert Job.objects.count() == 32
    large = {url: _queries(client, url) for client, url in urls()}
    grew = {url: (small[url], large[url]) for url in small if large[url] > small[url]}
    assert not grew, f"queries grew with the number of jobs: {grew}"


def test_a_transactions_live_events_cost_the_same_queries_for_3_or_12_jobs(
    make_tenant: Callable[..., Tenant], django_capture_on_commit_callbacks: Any
) -> None:
    """The page and cluster patches are read from the jobs in memory; the tenant and
    cluster summaries are built once per transaction, whatever the number of jobs."""
    do_load_topology(SPEC)
    acme = make_tenant("acme", quota=16)
    _add_jobs(acme, 12)
    jobs = list(Job.objects.filter(tenant=acme).order_by("pk"))

    def broadcasting(some: list[Job]) -> int:
        with (
            CaptureQueriesContext(connection) as captured,
            django_capture_on_commit_callbacks(execute=True),
            transaction.atomic(),
        ):
            for job in some:
                broadcast(job, "job.updated")
        return len(captured)

    assert broadcasting(jobs[:3]) == broadcasting(jobs) <= 4
