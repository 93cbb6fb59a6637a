"""Shared fixtures: tenants, users with roles, API clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from portal.celery import app
from portal.cluster_timeline import forget as forget_timelines
from tenancy.models import Role, Tenant
from tenancy.services import do_add_member, do_create_tenant
from tenancy.token_services import do_issue_token


@pytest.fixture(scope="session", autouse=True)
def empty_agent_queues() -> None:
    """Agents' command queues start the run empty.

    The machine's Redis outlives test runs: commands an earlier run left on
    ``agent.<node>`` were signed long ago, and a test that reads them would
    fail on a stale signature rather than on what it tests.
    """
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(match="agent.*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture(autouse=True)
def fresh_cluster_timeline() -> Iterator[None]:
    """Each test's cluster view replays its own events (a kept replay is per process)."""
    forget_timelines()
    yield
    forget_timelines()


@pytest.fixture
def make_tenant(db: None) -> Callable[..., Tenant]:
    """Create a tenant with an owner user named ``<slug>-owner``."""

    def make(slug: str, quota: int = 8) -> Tenant:
        return do_create_tenant(
            slug=slug, owner_username=f"{slug}-owner", password="pw-" + slug, gpu_quota=quota
        ).tenant

    return make


@pytest.fixture
def make_user(db: None) -> Callable[..., Any]:
    """Create a user, optionally a member of ``tenant`` with ``role``."""

    def make(
        username: str, tenant: Tenant | None = None, role: str = Role.MEMBER, staff: bool = False
    ) -> Any:
        user = get_user_model().objects.create_user(username, password="pw", is_staff=staff)
        if tenant is not None:
            do_add_member(tenant=tenant, user=user, role=role)
        return user

    return make


@pytest.fixture
def token_client() -> Callable[[Any], APIClient]:
    """An API client authenticated with the user's token (the real header path)."""

    def make(user: Any) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {do_issue_token(user=user)}")
        return client

    return make


@pytest.fixture
def acme(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant("acme", quota=8)


@pytest.fixture
def globex(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant("globex", quota=4)


@pytest.fixture
def alice(make_user: Callable[..., Any], acme: Tenant) -> Any:
    """A member of acme."""
    return make_user("alice", acme)


@pytest.fixture
def bob(make_user: Callable[..., Any], globex: Tenant) -> Any:
    """A member of globex."""
    return make_user("bob", globex)


def job_body(**overrides: Any) -> dict[str, Any]:
    """A valid submission body."""
    body: dict[str, Any] = {"name": "train", "workload": "mlp-digits", "gpus": 2}
    body.update(overrides)
    return body


def emptied_queue(name: str) -> Iterator[Any]:
    """The real broker's queue ``name``, emptied before and after (a fixture's body)."""
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(name)
        queue.clear()
        try:
            yield queue
        finally:
            queue.clear()
            queue.close()


@pytest.fixture
def whatif_queue() -> Iterator[Any]:
    """The real broker's ``whatif`` queue, emptied before and after."""
    yield from emptied_queue("whatif")
