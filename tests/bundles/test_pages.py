"""The Code page: a tenant's bundles, and an upload form that shows refusals by the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from bundles.models import CodeBundle
from tenancy.models import Role
from workers.tests.bundles import tar_entry, tar_gz

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "artifacts"
    settings.ARTIFACT_URL = f"file://{root}"
    return root


def test_upload_from_the_page_then_see_it_listed(
    client: Client, alice: Any, acme: Any, tmp_path: Path
) -> None:
    client.force_login(alice)
    page = client.get("/code/")
    assert page.status_code == 200
    assert b'href="/code/"' in page.content  # the nav link
    assert b"No bundles yet." in page.content
    data = tar_gz(tmp_path / "c.tgz").read_bytes()
    response = client.post(
        "/code/", {"tenant": "acme", "archive": SimpleUploadedFile("c.tgz", data)}, follow=True
    )
    assert response.status_code == 200
    bundle = CodeBundle.objects.get()
    assert f"Uploaded bundle {bundle.sha256}".encode() in response.content
    assert bundle.sha256.encode() in response.content
    again = client.post(
        "/code/", {"tenant": "acme", "archive": SimpleUploadedFile("c.tgz", data)}, follow=True
    )
    assert b"Already had bundle" in again.content
    assert CodeBundle.objects.count() == 1


def test_a_refused_archive_is_shown_on_the_form(
    client: Client, alice: Any, acme: Any, tmp_path: Path, store_root: Path
) -> None:
    client.force_login(alice)
    data = tar_gz(tmp_path / "c.tgz", extra=[tar_entry("../up", b"0")]).read_bytes()
    response = client.post(
        "/code/", {"tenant": "acme", "archive": SimpleUploadedFile("c.tgz", data)}
    )
    assert response.status_code == 400
    assert b'data-for="archive"' in response.content
    assert b"outside the bundle" in response.content
    assert CodeBundle.objects.count() == 0 and not store_root.exists()


def test_other_tenants_bundles_are_not_listed(
    client: Client, alice: Any, bob: Any, globex: Any, tmp_path: Path
) -> None:
    client.force_login(bob)
    data = tar_gz(tmp_path / "c.tgz").read_bytes()
    client.post("/code/", {"tenant": "globex", "archive": SimpleUploadedFile("c.tgz", data)})
    sha = CodeBundle.objects.get().sha256
    other = Client()
    other.force_login(alice)
    assert sha.encode() not in other.get("/code/").content


def test_a_viewer_sees_no_upload_form(client: Client, make_user: Any, acme: Any) -> None:
    client.force_login(make_user("vic", acme, role=Role.VIEWER))
    page = client.get("/code/")
    assert b"You cannot upload code" in page.content
    assert b'id="code-form"' not in page.content


def test_the_page_needs_a_login(client: Client) -> None:
    response = client.get("/code/")
    assert response.status_code == 302 and "/login/" in response["Location"]
