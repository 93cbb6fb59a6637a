"""The Django admin cannot change jobs or code bundles behind the services (and the audit log)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from audit.models import AuditEntry
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import ApiToken, Tenant
from tenancy.token_services import do_create_token
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


def test_a_superuser_can_look_at_a_job_but_not_add_change_or_delete_it(
    alice: Any, acme: Tenant
) -> None:
    job = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=job_body()))
    root = get_user_model().objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(root)
    rows = AuditEntry.objects.count()
    page = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.post(f"/admin/jobs/job/{job.pk}/change/", {"priority": 99}).status_code == 403
    assert client.post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/jobs/job/add/").status_code == 403
    assert client.get("/admin/bundles/codebundle/add/").status_code == 403
    job.refresh_from_db()
    assert job.priority == 50 and Job.objects.filter(pk=job.pk).exists()
    assert AuditEntry.objects.count() == rows


def test_the_admin_revokes_tokens_through_the_service_and_edits_none(alice: Any) -> None:
    token = do_create_token(user=alice, name="ci").token
    root = get_user_model().objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(root)
    change = f"/admin/tenancy/apitoken/{token.pk}/change/"
    assert 'name="_save"' not in client.get(change).content.decode()
    assert client.post(change, {"expires_at_0": "2100-01-01"}).status_code == 403
    answer = client.post(
        "/admin/tenancy/apitoken/",
        {"action": "revoke", "_selected_action": [str(token.pk)]},
    )
    assert answer.status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    [row] = AuditEntry.objects.filter(action="token.revoke")
    assert (row.actor_name, row.object_id) == ("root", str(token.pk))
    client.post(  # a second revoke changes nothing and records nothing
        "/admin/tenancy/apitoken/", {"action": "revoke", "_selected_action": [str(token.pk)]}
    )
    assert AuditEntry.objects.filter(action="token.revoke").count() == 1
