"""Job changes leave one audit row each: submit, update, cancel, scale (a person's only)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from audit.context import serving
from audit.models import AuditEntry
from devtools.job_steps import move
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import check_job_spec, do_set_parallelism, do_submit_job
from tenancy.models import ApiToken, Role, Tenant
from tenancy.token_services import do_create_token
from tests.audit.helpers import count, only_row
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


def token_client(user: Any, name: str = "ci") -> tuple[APIClient, str]:
    """A client with a new named token of ``user``, and the audit label of that token."""
    issued = do_create_token(user=user, name=name)
    client = APIClient(HTTP_AUTHORIZATION=f"Token {issued.secret}", REMOTE_ADDR="10.9.8.7")
    return client, ApiToken.objects.get(pk=issued.token.pk).audit_label


def test_a_token_submission_names_the_token_the_address_and_the_job(
    alice: Any, acme: Tenant
) -> None:
    client, label = token_client(alice)
    response = client.post("/api/v1/jobs/", job_body(), format="json")
    assert response.status_code == 201, response.json()
    row = only_row("job.submit")
    assert label.startswith("token ci (") and label.endswith("…)")
    assert (row.actor_id, row.actor_name, row.via) == (alice.pk, "alice", label)
    assert row.client_address == "10.9.8.7"
    assert (row.tenant_id, row.tenant_slug) == (acme.pk, "acme")
    assert (row.object_type, row.object_id) == ("jobs.job", str(response.json()["id"]))
    assert row.before == {}
    assert row.after["name"] == "train" and row.after["gpus"] == 2
    assert row.after["priority"] == 50 and row.after["state"] == JobState.QUEUED
    assert row.after["env_names"] == []


def test_an_update_records_exactly_the_changed_fields(alice: Any) -> None:
    client, label = token_client(alice)
    job_id = client.post(
        "/api/v1/jobs/", job_body(gpus=2, min_gpus=1, max_gpus=4), format="json"
    ).json()["id"]
    response = client.patch(
        f"/api/v1/jobs/{job_id}/", {"priority": 90, "max_gpus": 8, "min_gpus": 1}, format="json"
    )
    assert response.status_code == 200, response.json()
    row = only_row("job.update")
    assert (row.before, row.after) == (
        {"priority": 50, "max_gpus": 4},
        {"priority": 90, "max_gpus": 8},
    )
    assert (row.actor_name, row.via, row.object_id) == ("alice", label, str(job_id))

    assert (
        client.patch(f"/api/v1/jobs/{job_id}/", {"priority": 90}, format="json").status_code == 200
    )
    assert count("job.update") == 1  # nothing changed, nothing recorded
    refused = client.patch(f"/api/v1/jobs/{job_id}/", {"min_gpus": 3}, format="json")
    assert refused.status_code == 400
    assert count("job.update") == 1  # a refused change leaves no row

    limits = client.patch(
        f"/api/v1/jobs/{job_id}/", {"max_restarts": 3, "max_runtime_s": 600}, format="json"
    )
    assert limits.status_code == 200, limits.json()
    assert count("job.update") == 2
    newest = AuditEntry.objects.filter(action="job.update").order_by("-id")[0]
    assert newest.before == {"max_restarts": 0, "max_runtime_s": None}
    assert newest.after == {"max_restarts": 3, "max_runtime_s": 600}


def test_a_cancel_on_the_page_is_the_sessions_and_a_refused_one_leaves_nothing(
    alice: Any, acme: Tenant, make_user: Any
) -> None:
    job = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=job_body()))
    viewer = make_user("vic", acme, role=Role.VIEWER)
    as_viewer = Client(REMOTE_ADDR="10.0.0.9")
    as_viewer.force_login(viewer)
    as_viewer.post(f"/jobs/{job.pk}/cancel/")
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert count("job.cancel") == 0

    page = Client(REMOTE_ADDR="10.0.0.8")
    page.force_login(alice)
    assert page.post(f"/jobs/{job.pk}/cancel/").status_code == 302
    row = only_row("job.cancel")
    assert (row.actor_name, row.via, row.client_address) == ("alice", "session", "10.0.0.8")
    assert row.tenant_slug == "acme"
    assert row.before == {"state": JobState.QUEUED}
    assert row.after == {"state": JobState.CANCELLED, "reason": "cancelled by alice"}


def test_a_scale_is_audited_for_a_person_but_not_for_the_control_plane(
    alice: Any, acme: Tenant
) -> None:
    job = do_submit_job(
        user=alice,
        tenant=acme,
        spec=check_job_spec(tenant=acme, data=job_body(gpus=2, min_gpus=1, max_gpus=4)),
    )
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=2)
    do_set_parallelism(job_id=job.pk, parallelism=1, reason="runtime: a worker left")
    assert count("job.scale") == 0  # the control plane: the system, not recorded

    request = RequestFactory().post("/", REMOTE_ADDR="10.1.1.1")
    request.user = alice
    with serving(request):
        do_set_parallelism(job_id=job.pk, parallelism=3, reason="asked by alice")
    row = only_row("job.scale")
    assert (row.actor_name, row.via, row.client_address) == ("alice", "session", "10.1.1.1")
    assert (row.before, row.after) == (
        {"parallelism": 1},
        {"parallelism": 3, "reason": "asked by alice"},
    )
