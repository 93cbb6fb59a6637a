"""The code API: uploads stored once per tenant, every refusal stores nothing, tenant isolation."""

from __future__ import annotations

import hashlib
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import IntegrityError
from rest_framework.test import APIClient

from bundles import services
from bundles.models import CodeBundle
from tenancy.models import Role
from tenancy.services import do_add_member
from workers.bundle import MiB
from workers.tests.bundles import GOOD_FILES, tar_bomb, tar_entry, tar_gz, zip_file

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store_root(tmp_path: Path, settings: Any) -> Path:
    """Each test gets its own artifact store, so 'nothing stored' can be checked."""
    root = tmp_path / "artifacts"
    settings.ARTIFACT_URL = f"file://{root}"
    return root


def stored_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def upload(client: APIClient, data: bytes, name: str = "code.tar.gz", **fields: str) -> Any:
    archive = SimpleUploadedFile(name, data, content_type="application/octet-stream")
    return client.post("/api/v1/code/", {"archive": archive, **fields}, format="multipart")


def build(tmp_path: Path, maker: Callable[..., Path], *args: Any, **kwargs: Any) -> bytes:
    return maker(tmp_path / "build.bin", *args, **kwargs).read_bytes()


@pytest.mark.parametrize("maker", [tar_gz, zip_file])
def test_upload_is_stored_once_and_the_same_bytes_again_are_a_200(
    token_client: Any, alice: Any, tmp_path: Path, store_root: Path, maker: Callable[..., Path]
) -> None:
    data = build(tmp_path, maker)
    client = token_client(alice)
    first = upload(client, data)
    assert first.status_code == 201, first.json()
    body = first.json()
    sha = hashlib.sha256(data).hexdigest()
    assert body["id"] == sha and body["size"] == len(data) and body["files"] == len(GOOD_FILES)
    assert body["created_at"] and body["tenant"] == "acme"
    kind = "tar.gz" if maker is tar_gz else "zip"
    stored = store_root / "tenants" / "acme" / "bundles" / f"{sha}.{kind}"
    assert stored_files(store_root) == [stored]
    assert stored.read_bytes() == data
    bundle = CodeBundle.objects.get()
    assert bundle.store_path == f"tenants/acme/bundles/{sha}.{kind}"
    assert bundle.uploaded_by == alice and bundle.unpacked_bytes == sum(
        map(len, GOOD_FILES.values())
    )

    again = upload(client, data, name="renamed.zip")
    assert again.status_code == 200
    assert again.json() == body
    assert CodeBundle.objects.count() == 1 and stored_files(store_root) == [stored]


def _bomb(tmp_path: Path) -> bytes:
    return tar_bomb(tmp_path / "bomb.tgz", 200 * MiB).read_bytes()


REFUSALS: list[tuple[str, Callable[[Path], bytes], str]] = [
    ("not-archive", lambda tmp: b"#!/bin/sh\necho I am a script\n", "not an archive"),
    (
        "symlink",
        lambda tmp: build(tmp, tar_gz, extra=[tar_entry("ln", tarfile.SYMTYPE, "/etc")]),
        "'ln'",
    ),
    (
        "hardlink",
        lambda tmp: build(tmp, tar_gz, extra=[tar_entry("hl", tarfile.LNKTYPE, "train.py")]),
        "'hl'",
    ),
    ("fifo", lambda tmp: build(tmp, tar_gz, extra=[tar_entry("pipe", tarfile.FIFOTYPE)]), "'pipe'"),
    ("device", lambda tmp: build(tmp, tar_gz, extra=[tar_entry("sda", tarfile.BLKTYPE)]), "'sda'"),
    ("absolute", lambda tmp: build(tmp, tar_gz, {"/etc/evil": b"x"}), "'/etc/evil'"),
    ("dotdot", lambda tmp: build(tmp, tar_gz, {"a/../../evil": b"x"}), "'a/../../evil'"),
    ("zip-dotdot", lambda tmp: build(tmp, zip_file, {"../evil.py": b"x"}), "'../evil.py'"),
    (
        "zip-symlink",
        lambda tmp: build(tmp, zip_file, {"ln": b"/etc"}, {"ln": stat.S_IFLNK | 0o777}),
        "'ln'",
    ),
    (
        "duplicate",
        lambda tmp: build(tmp, tar_gz, extra=[tar_entry("train.py", tarfile.REGTYPE)]),
        "more than once",
    ),
    (
        "too-many",
        lambda tmp: build(tmp, tar_gz, {f"f{i}": b"x" for i in range(6)}),
        "more than 5 entries",
    ),
    (
        "too-big",
        lambda tmp: build(tmp, tar_gz, {"r.bin": bytes(range(256)) * 64}),
        "over the limit",
    ),
    ("unpacked", lambda tmp: build(tmp, tar_gz, {"z.bin": bytes(3000)}), "'z.bin'"),
    ("bomb", _bomb, "'zeros.bin'"),
    ("empty", lambda tmp: build(tmp, tar_gz, {}), "no files"),
]


@pytest.mark.parametrize(("case", "make", "words"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_uploads_are_400_on_archive_and_store_nothing(
    token_client: Any,
    alice: Any,
    tmp_path: Path,
    store_root: Path,
    settings: Any,
    case: str,
    make: Callable[[Path], bytes],
    words: str,
) -> None:
    settings.CODE_MAX_FILES = 5
    settings.CODE_MAX_UNPACKED_BYTES = 2000 if case != "bomb" else 10 * MiB
    data = make(tmp_path)
    if case == "too-big":
        settings.CODE_MAX_BYTES = len(data) - 1
    response = upload(token_client(alice), data)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert list(body["errors"]) == ["archive"]
    assert body["message"].startswith("archive: ")
    assert words in body["errors"]["archive"][0]
    assert CodeBundle.objects.count() == 0
    assert stored_files(store_root) == []


def test_a_body_over_the_limit_is_refused_before_it_is_parsed(
    token_client: Any, alice: Any, settings: Any, store_root: Path
) -> None:
    settings.CODE_MAX_BYTES = 1000
    response = upload(token_client(alice), bytes(200_000))
    assert response.status_code == 400
    assert "over the limit of 1000 bytes" in response.json()["errors"]["archive"][0]
    assert stored_files(store_root) == []


def test_a_missing_archive_is_400_on_archive(token_client: Any, alice: Any) -> None:
    response = token_client(alice).post("/api/v1/code/", {}, format="multipart")
    assert response.status_code == 400
    assert "archive" in response.json()["errors"]


def test_list_and_detail_show_the_callers_tenants_only(
    token_client: Any, alice: Any, bob: Any, tmp_path: Path
) -> None:
    ours = upload(token_client(alice), build(tmp_path, tar_gz)).json()
    theirs = upload(token_client(bob), build(tmp_path, zip_file, {"x.py": b"x"})).json()

    listing = token_client(alice).get("/api/v1/code/")
    assert listing.status_code == 200
    assert [row["id"] for row in listing.json()["results"]] == [ours["id"]]
    assert listing.json()["results"][0] == ours

    detail = token_client(alice).get(f"/api/v1/code/{ours['id']}/")
    assert detail.status_code == 200
    assert detail.json()["file_list"] == [
        {"path": name, "size": len(data)} for name, data in GOOD_FILES.items()
    ]
    assert detail.json()["id"] == ours["id"] and detail.json()["files"] == len(GOOD_FILES)

    other = token_client(alice).get(f"/api/v1/code/{theirs['id']}/")
    assert other.status_code == 404
    assert other.json() == {"message": "Not found.", "errors": {}}
    assert token_client(alice).get(f"/api/v1/code/{'0' * 64}/").status_code == 404


def test_same_bytes_in_two_tenants_are_two_bundles(
    token_client: Any, alice: Any, bob: Any, tmp_path: Path, store_root: Path
) -> None:
    data = build(tmp_path, tar_gz)
    assert upload(token_client(alice), data).status_code == 201
    assert upload(token_client(bob), data).status_code == 201
    assert sorted(CodeBundle.objects.values_list("tenant__slug", flat=True)) == ["acme", "globex"]
    assert len(stored_files(store_root)) == 2


def test_a_viewer_may_list_but_not_upload(
    token_client: Any, alice: Any, make_user: Any, acme: Any, tmp_path: Path, store_root: Path
) -> None:
    upload(token_client(alice), build(tmp_path, tar_gz))
    viewer = make_user("vic", acme, role=Role.VIEWER)
    client = token_client(viewer)
    assert len(client.get("/api/v1/code/").json()["results"]) == 1
    response = upload(client, build(tmp_path, tar_gz, {"other.py": b"y"}))
    assert response.status_code == 403
    assert "read-only" in response.json()["message"]
    assert CodeBundle.objects.count() == 1 and len(stored_files(store_root)) == 1


def test_a_member_of_several_tenants_names_one(
    token_client: Any, make_user: Any, acme: Any, globex: Any, tmp_path: Path
) -> None:
    carol = make_user("carol", acme)
    do_add_member(tenant=globex, user=carol)
    client = token_client(carol)
    data = build(tmp_path, tar_gz)
    response = upload(client, data)
    assert response.status_code == 400 and "tenant" in response.json()["errors"]
    assert upload(client, data, tenant="initech").status_code == 400
    created = upload(client, data, tenant="globex")
    assert created.status_code == 201 and created.json()["tenant"] == "globex"


def test_authentication_required() -> None:
    response = APIClient().get("/api/v1/code/")
    assert response.status_code in (401, 403)


def test_session_auth_works_too(client: Any, alice: Any, tmp_path: Path) -> None:
    client.force_login(alice)
    response = client.post(
        "/api/v1/code/",
        {"archive": SimpleUploadedFile("c.tgz", build(tmp_path, tar_gz))},
    )
    assert response.status_code == 201


def test_a_row_that_cannot_be_written_takes_its_stored_object_with_it(
    alice: Any, acme: Any, tmp_path: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_save(self: CodeBundle, *args: Any, **kwargs: Any) -> None:
        assert stored_files(store_root), "the archive is stored before the row"
        raise IntegrityError("simulated")

    monkeypatch.setattr(CodeBundle, "save", failing_save)
    archive = SimpleUploadedFile("c.tgz", build(tmp_path, tar_gz))
    with pytest.raises(IntegrityError):
        services.do_upload(user=alice, tenant=acme, uploaded_file=archive)
    assert stored_files(store_root) == []
    assert CodeBundle.objects.count() == 0


def test_the_stored_object_is_the_uploaded_archive(alice: Any, acme: Any, tmp_path: Path) -> None:
    data = build(tmp_path, tar_gz, {"big.bin": bytes(300_000)})
    archive = SimpleUploadedFile("c.tgz", data)
    bundle, created = services.do_upload(user=alice, tenant=acme, uploaded_file=archive)
    assert created and bundle.sha256 == hashlib.sha256(data).hexdigest()
    with services.artifact_store().open_read(bundle.store_path) as stream:
        assert stream.read() == data
