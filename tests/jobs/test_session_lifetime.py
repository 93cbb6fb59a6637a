"""A session that reaches its maximum lifetime ends cancelled, not failed (``control.limits``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from control.limits import RUNTIME_LIMIT_REASON, stop_jobs_at_limit
from jobs.choices import JobState
from jobs.models import JobEvent
from jobs.outbox import Outbox
from tenancy.models import Tenant
from tests.jobs.test_sessions import a_session

pytestmark = pytest.mark.django_db


def test_a_session_at_its_lifetime_is_cancelled_and_a_batch_job_fails(
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("life")
    owner = get_user_model().objects.get(username="life-owner")
    now = timezone.now()
    started = now - timedelta(seconds=120)
    session = a_session(tenant, owner, state=JobState.RUNNING, started_at=started, max_runtime_s=60)
    batch = a_session(
        tenant,
        owner,
        kind="batch",
        launcher="edl",
        idle_timeout_s=None,
        state=JobState.RUNNING,
        started_at=started,
        max_runtime_s=60,
    )

    assert sorted(stop_jobs_at_limit(now, Outbox())) == sorted([session.pk, batch.pk])

    session.refresh_from_db()
    batch.refresh_from_db()
    assert session.state == JobState.CANCELLED
    assert session.failure_reason == ""
    last = JobEvent.objects.filter(job=session).latest("pk")
    assert last.to_state == JobState.CANCELLED
    assert "lifetime 60 s reached" in last.reason
    assert batch.state == JobState.FAILED
    assert batch.failure_reason == RUNTIME_LIMIT_REASON
