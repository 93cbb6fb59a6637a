"""API tokens through the API: list, create, revoke; hashed at rest; 401s; read-only 403s."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import ApiToken, Tenant
from tenancy.token_services import do_create_token, do_revoke_token, do_use_token
from tenancy.tokens import hash_secret
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


def client_with(secret: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Token {secret}")


def issue(user: Any, name: str = "t", scope: str = "write", **kwargs: Any) -> str:
    return do_create_token(user=user, name=name, scope=scope, **kwargs).secret


def submit(user: Any, tenant: Tenant) -> Job:
    spec = check_job_spec(tenant=tenant, data=job_body())
    return do_submit_job(user=user, tenant=tenant, spec=spec)


def test_create_list_and_revoke(alice: Any) -> None:
    client = client_with(issue(alice, "bootstrap"))
    created = client.post(
        "/api/v1/tokens/", {"name": "ci", "scope": "read", "expires_in_days": 7}, format="json"
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    secret = body["token"]
    assert body["name"] == "ci" and body["scope"] == "read" and body["prefix"] == secret[:8]
    assert body["revoked_at"] is None and body["last_used_at"] is None
    lifetime = timezone.datetime.fromisoformat(body["expires_at"]) - timezone.now()
    assert timedelta(days=6, hours=23) < lifetime <= timedelta(days=7)

    listed = client.get("/api/v1/tokens/").json()
    assert [t["name"] for t in listed] == ["ci", "bootstrap"]
    assert all("token" not in t for t in listed)
    assert listed[1]["last_used_at"] is not None  # the bootstrap token is the one in use

    assert client_with(secret).get("/api/v1/me/").status_code == 200
    assert client.delete(f"/api/v1/tokens/{body['id']}/").status_code == 204
    refused = client_with(secret).get("/api/v1/me/")
    today = timezone.now().date().isoformat()
    assert refused.status_code == 401
    assert refused.json()["message"] == f"token revoked on {today}"
    assert refused["WWW-Authenticate"] == "Token"
    assert client.get(f"/api/v1/tokens/{body['id']}/").json()["revoked_at"] is not None
    # A revoked token frees its name.
    again = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert again.status_code == 201 and again.json()["scope"] == "write"


def test_defaults_and_refusals_of_create(alice: Any, settings: Any) -> None:
    settings.API_TOKEN_DAYS = 30
    client = client_with(issue(alice, "bootstrap"))
    made = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()
    token = ApiToken.objects.get(pk=made["id"])
    assert token.scope == "write"
    assert token.expires_at - token.created_at == timedelta(days=30)
    duplicate = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert duplicate.status_code == 400
    assert duplicate.json()["message"] == "you already have a token named 'laptop'"
    for bad, field in [
        ({"name": "x", "scope": "admin"}, "scope"),
        ({"name": "x", "expires_in_days": 0}, "expires_in_days"),
        ({"scope": "read"}, "name"),
    ]:
        response = client.post("/api/v1/tokens/", bad, format="json")
        assert response.status_code == 400 and field in response.json()["errors"], bad


def test_the_secret_is_not_stored(alice: Any) -> None:
    secret = issue(alice, "ci")
    token = ApiToken.objects.get(user=alice)
    assert token.key_hash == hash_secret(secret) and token.prefix == secret[:8]
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM tenancy_apitoken")
        rows = cursor.fetchall()
    assert rows and not any(secret in str(value) for row in rows for value in row)


def test_another_users_tokens_are_not_found(alice: Any, bob: Any) -> None:
    issue(alice, "alices")
    alices = ApiToken.objects.get(user=alice)
    bobs = client_with(issue(bob, "bobs"))
    assert [t["name"] for t in bobs.get("/api/v1/tokens/").json()] == ["bobs"]
    assert bobs.get(f"/api/v1/tokens/{alices.pk}/").status_code == 404
    gone = bobs.delete(f"/api/v1/tokens/{alices.pk}/")
    assert gone.status_code == 404 and gone.json()["message"] == "Not found."
    alices.refresh_from_db()
    assert alices.revoked_at is None
    with pytest.raises(ApiToken.DoesNotExist):
        do_revoke_token(user=bob, token_id=alices.pk)


def test_expired_unknown_and_malformed_tokens_are_401(alice: Any) -> None:
    long_ago = timezone.now() - timedelta(days=10)
    expired = issue(alice, "old", expires_in_days=2, now=long_ago)
    response = client_with(expired).get("/api/v1/jobs/")
    assert response.status_code == 401
    day = (long_ago + timedelta(days=2)).date().isoformat()
    assert response.json() == {"message": f"token expired on {day}", "errors": {}}

    unknown = client_with("not-a-token").get("/api/v1/jobs/")
    assert unknown.status_code == 401 and unknown.json()["message"] == "invalid token"
    malformed = APIClient(HTTP_AUTHORIZATION="Token two parts").get("/api/v1/jobs/")
    assert malformed.status_code == 401
    assert malformed.json()["message"].startswith("invalid token header")

    secret = issue(alice, "fine")
    alice.is_active = False
    alice.save()
    assert client_with(secret).get("/api/v1/jobs/").json()["message"] == "invalid token"


def test_use_is_written_down_at_most_once_a_minute(alice: Any) -> None:
    secret = issue(alice, "ci")
    start = timezone.now()
    assert do_use_token(secret=secret, now=start).last_used_at == start
    do_use_token(secret=secret, now=start + timedelta(seconds=30))
    assert ApiToken.objects.get(user=alice).last_used_at == start
    later = start + timedelta(seconds=61)
    do_use_token(secret=secret, now=later)
    assert ApiToken.objects.get(user=alice).last_used_at == later


def test_a_read_token_reads_but_changes_nothing(alice: Any, acme: Tenant) -> None:
    job = submit(alice, acme)
    reader = client_with(issue(alice, "reader", scope="read"))
    for path in ["/api/v1/jobs/", f"/api/v1/jobs/{job.pk}/", "/api/v1/me/", "/api/v1/tokens/"]:
        assert reader.get(path).status_code == 200, path
    assert reader.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 200
    archive = SimpleUploadedFile("code.tar.gz", b"bytes", content_type="application/octet-stream")
    refused = [
        reader.post("/api/v1/jobs/", job_body(), format="json"),
        reader.post(f"/api/v1/jobs/{job.pk}/cancel/", {}, format="json"),
        reader.patch(f"/api/v1/jobs/{job.pk}/", {"max_gpus": 4}, format="json"),
        reader.post("/api/v1/code/", {"archive": archive}, format="multipart"),
        reader.post("/api/v1/tokens/", {"name": "more"}, format="json"),
        reader.delete(f"/api/v1/tokens/{ApiToken.objects.get(name='reader').pk}/"),
    ]
    for response in refused:
        assert response.status_code == 403, response.content
        assert response.json()["message"] == "this token is read-only"
    job.refresh_from_db()
    assert job.state != "cancelled" and Job.objects.count() == 1
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1

    writer = client_with(issue(alice, "writer"))
    assert writer.post(f"/api/v1/jobs/{job.pk}/cancel/", {}, format="json").status_code == 200


def test_the_schema_describes_the_token_endpoints(client: Any) -> None:
    import yaml

    schema = yaml.safe_load(client.get("/api/schema/").content)
    assert {"get", "post"} <= set(schema["paths"]["/api/v1/tokens/"])
    assert {"get", "delete"} <= set(schema["paths"]["/api/v1/tokens/{id}/"])
    created = schema["components"]["schemas"]["ApiTokenCreated"]["properties"]
    assert "token" in created
    assert "token" not in schema["components"]["schemas"]["ApiToken"]["properties"]
