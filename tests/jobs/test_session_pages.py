"""The session pages: the list with its start form (a refusal is said on its field, nothing
started), the session's page (lab link for who may open it, stop button), 404 for another
tenant's session, the navigation link, and the page's script served from static/."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.test import Client

from jobs.choices import JobKind, JobState
from jobs.models import Job
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner(acme: Tenant) -> Any:
    return get_user_model().objects.get(username="acme-owner")


def test_start_from_the_page_opens_the_sessions_page(owner: Any) -> None:
    demo_cluster()
    client = signed_in(owner)
    page = client.get("/sessions/")
    assert page.status_code == 200
    assert b'href="/sessions/"' in page.content  # the navigation's link
    res = client.post(
        "/sessions/",
        {"tenant": "acme", "name": "nb", "gpus": 2, "priority": "normal",
         "lab_access": "tenant", "idle_timeout_s": 900, "requirements": "einops==0.8.1\n"},
    )  # fmt: skip
    job = Job.objects.get(kind=JobKind.SESSION)
    assert res.status_code == 302 and res["Location"] == f"/sessions/{job.pk}/"
    assert (job.gpus, job.idle_timeout_s, job.lab_access) == (2, 900, "tenant")
    assert job.environment["requirements"] == ["einops==0.8.1"]
    detail = client.get(f"/sessions/{job.pk}/")
    assert detail.status_code == 200
    assert b'id="session-stop-form"' in detail.content
    assert b'id="open-lab"' not in detail.content  # queued: nothing to open yet
    assert b"js/sessions.js" in detail.content and b"<script>" not in detail.content
    listed = client.get("/sessions/")
    assert f'href="/sessions/{job.pk}/"'.encode() in listed.content
    stopped = client.post(f"/sessions/{job.pk}/stop/")
    assert stopped.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_a_ceiling_is_said_on_its_field_and_starts_nothing(owner: Any) -> None:
    demo_cluster()
    res = signed_in(owner).post(
        "/sessions/",
        {"tenant": "acme", "gpus": 1, "priority": "normal", "lab_access": "creator",
         "idle_timeout_s": 10**6},
    )  # fmt: skip
    assert res.status_code == 200
    assert b'data-for="idle_timeout_s"' in res.content
    assert not Job.objects.exists()


def test_another_tenants_user_gets_404(owner: Any, bob: Any) -> None:
    demo_cluster()
    signed_in(owner).post(
        "/sessions/", {"tenant": "acme", "gpus": 1, "priority": "normal", "lab_access": "tenant"}
    )
    job = Job.objects.get(kind=JobKind.SESSION)
    stranger = signed_in(bob)
    assert stranger.get(f"/sessions/{job.pk}/").status_code == 404
    assert stranger.post(f"/sessions/{job.pk}/stop/").status_code == 404
    assert str(job.pk).encode() + b": session" not in stranger.get("/sessions/").content
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_batch_job_has_no_session_page(owner: Any) -> None:
    demo_cluster()
    client = signed_in(owner)
    client.post(
        "/api/v1/jobs/",
        {"tenant": "acme", "name": "b", "workload": "mlp-digits", "gpus": 1},
        content_type="application/json",
    )
    job = Job.objects.get()
    assert client.get(f"/sessions/{job.pk}/").status_code == 404
    assert finders.find("js/sessions.js")  # the page's script, served from static/
