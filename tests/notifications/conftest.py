"""Fixtures of the notifications tests: a live webhook receiver, jobs, subscriptions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from notifications.models import Subscription
from notifications.services import check_subscription, do_create_subscription
from tenancy.models import Tenant
from tests.conftest import emptied_queue
from tests.notifications.receiver import DeadEndpoint, Receiver


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """A webhook receiver on 127.0.0.1 that answers 200 unless told otherwise.

    Loopback is refused by default (``notifications.addresses``): the test
    lets its own receiver in through the operator's allow-list.
    """
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture
def dead_endpoint(settings: Any) -> Iterator[DeadEndpoint]:
    """A port on 127.0.0.1 (allowed, as for ``receiver``) that never answers."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    endpoint = DeadEndpoint()
    yield endpoint
    endpoint.close()


@pytest.fixture
def submit() -> Callable[..., Job]:
    """Submit a job as ``user`` in ``tenant`` (queued, through the real service)."""

    def make(user: Any, tenant: Tenant, **fields: Any) -> Job:
        spec = check_job_spec(
            tenant=tenant, data={"name": "train", "workload": "mlp-digits", "gpus": 1, **fields}
        )
        return do_submit_job(user=user, tenant=tenant, spec=spec)

    return make


@pytest.fixture
def subscribe() -> Callable[..., Subscription]:
    """Create a subscription through the services."""

    def make(
        owner: Any,
        *,
        events: list[str],
        url: str = "",
        tenant: Tenant | None = None,
        channel: str = "webhook",
        email: str = "",
        queued_minutes: int | None = None,
        now: datetime | None = None,
    ) -> Subscription:
        spec = check_subscription(
            owner=owner,
            tenant_slug=tenant.slug if tenant else None,
            events=events,
            channel=channel,
            url=url,
            email=email,
            queued_minutes=queued_minutes,
        )
        return do_create_subscription(owner=owner, spec=spec, now=now or timezone.now())

    return make


@pytest.fixture
def portal_queue() -> Iterator[Any]:
    """The real broker's ``portal`` queue, emptied before and after."""
    yield from emptied_queue("portal")


@pytest.fixture
def webhooks_queue() -> Iterator[Any]:
    """The real broker's ``webhooks`` queue (deliveries), emptied before and after."""
    yield from emptied_queue("webhooks")


def queued_tasks(queue: Any) -> list[tuple[str, Any]]:
    """Every (task name, args) waiting on ``queue`` now (consumed)."""
    found: list[tuple[str, Any]] = []
    while True:
        try:
            message = queue.get(timeout=0.5)
        except queue.Empty:
            return found
        found.append((message.headers["task"], message.decode()[0]))
        message.ack()
