"""A tenant's cap on waiting jobs: a submission beyond it is a clear 4xx or form error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import Client, override_settings
from rest_framework.test import APIClient

from devtools.job_steps import move
from jobs.errors import JobConflictError
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import Tenant
from tenancy.services import do_add_member, do_create_tenant
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def capped(acme: Tenant) -> Tenant:
    Tenant.objects.filter(pk=acme.pk).update(max_queued_jobs=2)
    return acme


def test_api_submission_beyond_the_cap_is_409_and_creates_nothing(
    token_client: Callable[[Any], APIClient], alice: Any, capped: Tenant
) -> None:
    client = token_client(alice)
    first, second = (
        client.post("/api/v1/jobs/", job_body(name=f"j{n}", gpus=1), format="json") for n in (1, 2)
    )
    assert first.status_code == second.status_code == 201
    refused = client.post("/api/v1/jobs/", job_body(name="j3", gpus=1), format="json")
    assert refused.status_code == 409
    body = refused.json()
    assert "already has 2 jobs waiting, its limit of 2" in body["message"]
    assert body["errors"]["tenant"] == [body["message"]]
    assert Job.objects.filter(tenant=capped).count() == 2
    # a job that starts frees its place in the queue
    move(job_id=first.json()["id"], to_state="running", reason="placed", parallelism=1)
    again = client.post("/api/v1/jobs/", job_body(name="j3", gpus=1), format="json")
    assert again.status_code == 201


def test_form_submission_beyond_the_cap_is_a_form_error(alice: Any, capped: Tenant) -> None:
    client = Client()
    client.force_login(alice)
    form = {
        "tenant": capped.slug,
        "name": "f",
        "workload": "mlp-digits",
        "gpus": "1",
        "min_gpus": "1",
        "max_gpus": "1",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "10",
    }
    for _ in range(2):
        assert client.post("/jobs/new/", form).status_code == 302
    page = client.post("/jobs/new/", form)
    assert page.status_code == 200
    assert b"already has 2 jobs waiting, its limit of 2" in page.content
    assert Job.objects.filter(tenant=capped).count() == 2


def test_the_cap_is_per_tenant(
    token_client: Callable[[Any], APIClient],
    make_user: Callable[..., Any],
    capped: Tenant,
    globex: Tenant,
) -> None:
    both = make_user("both", capped)
    do_add_member(tenant=globex, user=both)
    client = token_client(both)
    for n in range(2):
        body = job_body(name=f"a{n}", gpus=1, tenant=capped.slug)
        assert client.post("/api/v1/jobs/", body, format="json").status_code == 201
    body = job_body(name="g", gpus=1, tenant=globex.slug)
    assert client.post("/api/v1/jobs/", body, format="json").status_code == 201


@override_settings(DEFAULT_TENANT_MAX_QUEUED_JOBS=7)
def test_new_tenants_take_the_default_cap_from_settings() -> None:
    tenant = do_create_tenant(slug="fresh", owner_username="fresh-owner").tenant
    assert tenant.max_queued_jobs == 7


def test_a_zero_cap_refuses_every_submission(
    token_client: Callable[[Any], APIClient], alice: Any, acme: Tenant
) -> None:
    Tenant.objects.filter(pk=acme.pk).update(max_queued_jobs=0)
    refused = token_client(alice).post("/api/v1/jobs/", job_body(gpus=1), format="json")
    assert refused.status_code == 409 and not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_cannot_both_take_the_last_place(alice: Any, acme: Tenant) -> None:
    """The tenant row is locked while a submission counts: two at once, one place, one job."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (SQLite serializes every write anyway)")
    Tenant.objects.filter(pk=acme.pk).update(max_queued_jobs=1)
    spec = check_job_spec(tenant=acme, data=job_body(gpus=1))
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def submit_at_once() -> None:
        try:
            with transaction.atomic():
                barrier.wait(5)
                do_submit_job(user=alice, tenant=acme, spec=spec)
                time.sleep(0.3)  # hold the transaction open: the other one must wait
            outcomes.append("created")
        except JobConflictError:
            outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit_at_once) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["created", "refused"]
    assert Job.objects.filter(tenant=acme).count() == 1


def test_createtenant_sets_the_cap_and_refuses_a_negative_one() -> None:
    out = StringIO()
    call_command("createtenant", "big", "--owner", "bea", "--max-queued-jobs", "5000", stdout=out)
    assert Tenant.objects.get(slug="big").max_queued_jobs == 5000
    with pytest.raises(CommandError, match="zero or more"):
        call_command("createtenant", "neg", "--owner", "bea", "--max-queued-jobs", "-1")
    assert not Tenant.objects.filter(slug="neg").exists()
