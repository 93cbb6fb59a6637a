"""Helpers shared by the workflow tests (arrays, dependencies, sweeps) of the jobs app."""

from __future__ import annotations

from typing import Any

from django.test import Client

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
