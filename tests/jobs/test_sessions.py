"""jobs.sessions: who may open a session's lab (404 for everyone else), activity that only
moves forward, and the per-user home prefix; on the real database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone

from jobs.choices import JobKind, LabAccess, Launcher
from jobs.models import Job
from jobs.sessions import home_prefix, lab_job, note_activity
from tenancy.models import Role, Tenant
from tenancy.services import do_add_member

pytestmark = pytest.mark.django_db


def a_user(name: str, **extra: Any) -> Any:
    return get_user_model().objects.create_user(username=name, password="pw-" + name, **extra)


def a_session(tenant: Tenant, user: Any, **fields: Any) -> Job:
    values: dict[str, Any] = {
        "tenant": tenant,
        "submitter": user,
        "name": "lab",
        "gpus": 1,
        "min_gpus": 1,
        "max_gpus": 1,
        "batch_size": 1,
        "submitted_at": timezone.now(),
        "kind": JobKind.SESSION,
        "launcher": Launcher.SESSION,
        "idle_timeout_s": 600,
        **fields,
    }
    return Job.objects.create(**values)


@pytest.fixture
def team(make_tenant: Callable[..., Tenant]) -> dict[str, Any]:
    tenant = make_tenant("lab")
    owner = get_user_model().objects.get(username="lab-owner")
    fellow, viewer = a_user("fellow"), a_user("viewer")
    do_add_member(tenant=tenant, user=fellow, role=Role.MEMBER)
    do_add_member(tenant=tenant, user=viewer, role=Role.VIEWER)
    other = make_tenant("other")
    stranger = get_user_model().objects.get(username="other-owner")
    return {
        "tenant": tenant,
        "owner": owner,
        "fellow": fellow,
        "viewer": viewer,
        "other": other,
        "stranger": stranger,
    }


def test_the_creator_opens_their_session(team: dict[str, Any]) -> None:
    job = a_session(team["tenant"], team["owner"])
    assert lab_job(team["owner"], job.pk).pk == job.pk


def test_creator_only_refuses_a_fellow_member_with_404(team: dict[str, Any]) -> None:
    job = a_session(team["tenant"], team["owner"], lab_access=LabAccess.CREATOR)
    with pytest.raises(Http404):
        lab_job(team["fellow"], job.pk)


def test_tenant_access_admits_writers_not_viewers(team: dict[str, Any]) -> None:
    job = a_session(team["tenant"], team["owner"], lab_access=LabAccess.TENANT)
    assert lab_job(team["fellow"], job.pk).pk == job.pk
    with pytest.raises(Http404):
        lab_job(team["viewer"], job.pk)


def test_another_tenants_user_and_anonymous_get_404(team: dict[str, Any]) -> None:
    from django.contrib.auth.models import AnonymousUser

    job = a_session(team["tenant"], team["owner"], lab_access=LabAccess.TENANT)
    for user in (team["stranger"], AnonymousUser()):
        with pytest.raises(Http404):
            lab_job(user, job.pk)


def test_a_cluster_admin_who_is_no_member_gets_404(team: dict[str, Any]) -> None:
    job = a_session(team["tenant"], team["owner"], lab_access=LabAccess.TENANT)
    admin = a_user("root", is_staff=True)
    with pytest.raises(Http404):
        lab_job(admin, job.pk)


def test_a_batch_job_or_a_missing_id_is_no_session(team: dict[str, Any]) -> None:
    batch = a_session(team["tenant"], team["owner"], kind=JobKind.BATCH, idle_timeout_s=None)
    for job_id in (batch.pk, batch.pk + 1000):
        with pytest.raises(Http404):
            lab_job(team["owner"], job_id)


def test_a_session_is_fixed_size_and_has_an_idle_timeout(team: dict[str, Any]) -> None:
    for fields in ({"max_gpus": 2}, {"idle_timeout_s": None}):
        with pytest.raises(IntegrityError), transaction.atomic():
            a_session(team["tenant"], team["owner"], **fields)


def test_activity_only_moves_forward(team: dict[str, Any]) -> None:
    job = a_session(team["tenant"], team["owner"])
    now = timezone.now()
    note_activity(job.pk, now)
    note_activity(job.pk, now - timedelta(minutes=5))  # a late report: ignored
    job.refresh_from_db()
    assert job.last_activity_at == now
    note_activity(job.pk, now + timedelta(seconds=30))
    job.refresh_from_db()
    assert job.last_activity_at == now + timedelta(seconds=30)


def test_activity_on_a_batch_job_or_a_missing_one_changes_nothing(team: dict[str, Any]) -> None:
    batch = a_session(team["tenant"], team["owner"], kind=JobKind.BATCH, idle_timeout_s=None)
    note_activity(batch.pk, timezone.now())
    note_activity(batch.pk + 1000, timezone.now())
    batch.refresh_from_db()
    assert batch.last_activity_at is None


def test_home_prefix_is_per_tenant_and_user(team: dict[str, Any]) -> None:
    job = a_session(team["tenant"], team["fellow"])
    assert home_prefix(job) == f"homes/lab/{team['fellow'].pk}/"
