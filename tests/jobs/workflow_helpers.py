"""Helpers shared by the workflow tests (arrays, dependencies, sweeps) of the jobs app."""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections, transaction
from django.test import Client
from django.utils import timezone

from jobs.choices import JobState
from jobs.lifecycle import transition
from jobs.models import Job
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster, drain_all


def quiet_demo_cluster(tenant: Tenant) -> list[str]:
    """The demo cluster with every agent alive and its queues drained, and ``tenant``'s jobs
    not profiled first (the tick starts what is queued at once, on the requested GPUs); the
    nodes' names."""
    nodes = demo_cluster()
    drain_all(nodes)
    tenant.profile_jobs = False
    tenant.save()
    return nodes


def logged_in(user: Any) -> Client:
    """A browser-like test client with ``user`` logged in."""
    client = Client()
    client.force_login(user)
    return client


def end_in_own_transaction(
    job_id: int,
    state: JobState,
    committed: threading.Event,
    hold: threading.Event | None = None,
    held: threading.Event | None = None,
) -> None:
    """End ``job_id`` in ``state`` in this thread's own transaction (a race test's thread);
    with ``hold``, keep it open until told, once what the end does inside it has run
    (``held``)."""
    try:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            transition(job, state, reason=f"ended {state}", at=timezone.now())
            if hold is not None and held is not None:
                held.set()
                hold.wait(10)
        committed.set()
    finally:
        connections.close_all()
