"""Token create/revoke and code uploads leave one audit row each, never a secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tenancy.models import ApiToken, Tenant
from tenancy.token_services import do_create_token
from tests.audit.helpers import count, only_row
from workers.tests.bundles import tar_gz

pytestmark = pytest.mark.django_db


def test_a_token_made_and_revoked_through_the_api(alice: Any) -> None:
    bootstrap = do_create_token(user=alice, name="bootstrap")
    client = APIClient(HTTP_AUTHORIZATION=f"Token {bootstrap.secret}", REMOTE_ADDR="10.2.3.4")
    created = client.post("/api/v1/tokens/", {"name": "ci", "scope": "read"}, format="json")
    assert created.status_code == 201
    secret = created.json()["token"]
    token = ApiToken.objects.get(pk=created.json()["id"])
    rows = list(AuditEntry.objects.filter(action="token.create").order_by("-id"))
    assert [r.object_id for r in rows] == [str(token.pk), str(bootstrap.token.pk)]
    row = rows[0]
    assert (row.actor_name, row.client_address) == ("alice", "10.2.3.4")
    assert row.via == f"token bootstrap ({bootstrap.token.prefix}…)"
    assert row.tenant_id is None
    assert set(row.after) == {"name", "scope", "prefix", "expires_at"}
    assert (row.after["name"], row.after["scope"]) == ("ci", "read")
    text = json.dumps([row.before, row.after, row.object_repr])
    assert secret not in text and token.key_hash not in text
    assert secret[8:] not in text  # only the display prefix, never the rest

    assert client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    revoked = only_row("token.revoke")
    assert revoked.before == {"revoked_at": None}
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert revoked.after == {"revoked_at": token.revoked_at.isoformat()}
    other = APIClient()
    other.force_authenticate(alice)
    assert other.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    assert count("token.revoke") == 1  # revoking twice changes nothing


def test_a_code_upload_is_recorded_once(
    alice: Any, acme: Tenant, tmp_path: Path, settings: Any
) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'store'}"
    data = tar_gz(tmp_path / "code.tar.gz").read_bytes()
    client = APIClient(REMOTE_ADDR="10.5.5.5")
    client.force_login(alice)

    def upload() -> Any:
        archive = SimpleUploadedFile("code.tar.gz", data)
        return client.post("/api/v1/code/", {"archive": archive}, format="multipart")

    first = upload()
    assert first.status_code == 201, first.json()
    row = only_row("code.upload")
    assert (row.actor_name, row.via, row.tenant_slug) == ("alice", "session", "acme")
    assert row.client_address == "10.5.5.5"
    assert row.after["sha256"] == first.json()["id"] and row.after["size"] == len(data)
    assert upload().status_code == 200  # the same bytes: nothing new, nothing recorded
    assert count("code.upload") == 1
