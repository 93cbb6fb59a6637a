"""The live JSON snapshots and the log follow take an API token: no browser session needed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import Job
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from tenancy.models import Tenant
from tenancy.token_services import do_create_token
from tests.conftest import job_body


def token_header(user: Any, scope: str = "read", **kwargs: Any) -> dict[str, str]:
    secret = do_create_token(user=user, name=f"t-{scope}", scope=scope, **kwargs).secret
    return {"HTTP_AUTHORIZATION": f"Token {secret}"}


def submit(user: Any, tenant: Tenant) -> Job:
    return do_submit_job(
        user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=job_body())
    )


@pytest.mark.django_db
def test_live_json_with_a_token_keeps_tenant_scoping(
    alice: Any, bob: Any, acme: Tenant, globex: Tenant
) -> None:
    mine, theirs = submit(alice, acme), submit(bob, globex)
    headers = token_header(alice)
    client = Client()
    job = client.get(f"/live/jobs/{mine.pk}.json", **headers)
    assert job.status_code == 200 and job.json()["job"] == mine.pk
    assert client.get(f"/live/tenants/{acme.pk}/jobs.json", **headers).status_code == 200
    assert client.get(f"/live/jobs/{theirs.pk}.json", **headers).status_code == 404
    assert client.get(f"/live/tenants/{globex.pk}/jobs.json", **headers).status_code == 404
    assert client.get(f"/live/jobs/{mine.pk}.json").status_code == 302  # no token: login page

    bad = client.get(f"/live/jobs/{mine.pk}.json", HTTP_AUTHORIZATION="Token nope")
    assert bad.status_code == 401 and bad.json()["message"] == "invalid token"
    old = token_header(alice, "write", expires_in_days=1, now=timezone.now() - timedelta(days=3))
    expired = client.get(f"/live/jobs/{mine.pk}.json", **old)
    assert expired.status_code == 401 and expired.json()["message"].startswith("token expired on")


@pytest.mark.django_db
def test_the_cluster_json_takes_an_admins_token_only(
    make_user: Any, alice: Any, acme: Tenant
) -> None:
    admin = make_user("root", staff=True)
    client = Client()
    assert client.get("/live/cluster.json", **token_header(admin)).status_code == 200
    assert client.get("/live/cluster.json", **token_header(alice)).status_code == 404


@pytest.mark.django_db(transaction=True)  # the stream polls through database_sync_to_async
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_log_follow_takes_a_read_token(alice: Any, acme: Tenant) -> None:
    job = submit(alice, acme)
    do_cancel_job(user=alice, job_id=job.pk)
    client = Client()
    url = f"/api/v1/jobs/{job.pk}/logs/?follow=1"
    response = client.get(url, HTTP_ACCEPT="text/event-stream", **token_header(alice))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert b"event: end" in b"".join(response)
    refused = client.get(url, HTTP_ACCEPT="text/event-stream", HTTP_AUTHORIZATION="Token nope")
    assert refused.status_code == 401 and b"invalid token" in refused.content
