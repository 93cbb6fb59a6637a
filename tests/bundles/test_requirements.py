"""A bundle's declared requirements (issue 36): its top-level requirements.txt or
pyproject.toml, read at upload under the rule the agent builds with, stored, shown; a bad one
refuses the upload naming the file, and stores nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

from bundles.models import CodeBundle
from jobs.forms import PROGRAM, JobForm
from tenancy.models import Tenant
from workers.environment import MAX_FILE_BYTES
from workers.tests.bundles import tar_gz, zip_file

pytestmark = pytest.mark.django_db

TRAIN = b"import einops\n"
PYPROJECT = b"""
[project]
name = "mine"
version = "0.1"
dependencies = ["einops==0.8.1", "tqdm >= 4"]

[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
"""


@pytest.fixture(autouse=True)
def store_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "artifacts"
    settings.ARTIFACT_URL = f"file://{root}"
    return root


def stored_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def upload(client: APIClient, data: bytes) -> Any:
    archive = SimpleUploadedFile("code.tgz", data, content_type="application/octet-stream")
    return client.post("/api/v1/code/", {"archive": archive}, format="multipart")


def archive(tmp_path: Path, maker: Callable[..., Path], files: dict[str, bytes]) -> bytes:
    return maker(tmp_path / "build.bin", files).read_bytes()


@pytest.mark.parametrize("maker", [tar_gz, zip_file])
def test_a_requirements_txt_is_read_stored_and_shown(
    token_client: Any, alice: Any, tmp_path: Path, maker: Callable[..., Path]
) -> None:
    text = b"# what train.py needs\neinops==0.8.1  # layers\n\ntqdm >= 4 \\\n  , < 5\n"
    client = token_client(alice)
    response = upload(
        client, archive(tmp_path, maker, {"train.py": TRAIN, "requirements.txt": text})
    )
    assert response.status_code == 201, response.json()
    assert response.json()["requirements"] == ["einops==0.8.1", "tqdm<5,>=4"]
    assert CodeBundle.objects.get().requirements == ["einops==0.8.1", "tqdm<5,>=4"]
    detail = client.get(f"/api/v1/code/{response.json()['id']}/").json()
    assert detail["requirements"] == ["einops==0.8.1", "tqdm<5,>=4"]
    listed = client.get("/api/v1/code/").json()["results"]
    assert [row["requirements"] for row in listed] == [["einops==0.8.1", "tqdm<5,>=4"]]


@pytest.mark.parametrize("maker", [tar_gz, zip_file])
def test_a_pyprojects_dependencies_are_read_and_its_build_backend_is_never_run(
    token_client: Any, alice: Any, tmp_path: Path, maker: Callable[..., Path]
) -> None:
    marker = tmp_path / "setup-ran"
    setup = f"open({str(marker)!r}, 'w').write('ran')\n".encode()
    files = {"train.py": TRAIN, "pyproject.toml": PYPROJECT, "setup.py": setup}
    response = upload(token_client(alice), archive(tmp_path, maker, files))
    assert response.status_code == 201, response.json()
    assert response.json()["requirements"] == ["einops==0.8.1", "tqdm>=4"]
    assert not marker.exists()


def test_requirements_txt_wins_over_pyproject_and_only_the_top_level_counts(
    token_client: Any, alice: Any, tmp_path: Path
) -> None:
    client = token_client(alice)
    both = {"train.py": TRAIN, "requirements.txt": b"einops\n", "pyproject.toml": PYPROJECT}
    assert upload(client, archive(tmp_path, tar_gz, both)).json()["requirements"] == ["einops"]
    nested = {"train.py": TRAIN, "sub/requirements.txt": b"--index-url https://evil/\n"}
    response = upload(client, archive(tmp_path, tar_gz, nested))
    assert response.status_code == 201 and response.json()["requirements"] == []
    dotted = {"./requirements.txt": b"einops\n", "./train.py": TRAIN}
    assert upload(client, archive(tmp_path, tar_gz, dotted)).json()["requirements"] == ["einops"]


REFUSED = [
    ("requirements.txt", b"--index-url https://evil.example/simple\neinops\n",
     "requirements.txt: '--index-url' is not allowed: packages come from the operator's index"),
    ("requirements.txt", b"-r other.txt\n", "requirements.txt: '-r' is not allowed"),
    ("requirements.txt", b"evil @ https://evil.example/evil.whl\n", "requirements.txt: evil @"),
    ("requirements.txt", b"./local-package\n", "requirements.txt: './local-package' is not a"),
    ("requirements.txt", b"einops\n\xff\xfe\n", "requirements.txt: is not UTF-8 text"),
    ("requirements.txt", b"# padding\n" * (MAX_FILE_BYTES // 10 + 1),
     "requirements.txt: is larger than 256 KiB"),
    ("requirements.txt", "\n".join(f"pkg{i}" for i in range(201)).encode(),
     "requirements.txt: more than 200 requirements"),
    ("pyproject.toml", b"[project\n", "pyproject.toml: is not valid TOML"),
    ("pyproject.toml", b'[project]\ndependencies = ["x @ file:///etc/passwd"]\n',
     "pyproject.toml: x @ ... is not allowed"),
    ("pyproject.toml", b'[project]\ndependencies = "einops"\n',
     "pyproject.toml: [project] dependencies must be a list"),
]  # fmt: skip


@pytest.mark.parametrize("maker", [tar_gz, zip_file])
@pytest.mark.parametrize(("name", "contents", "words"), REFUSED)
def test_a_bad_declaration_refuses_the_upload_naming_the_file_and_stores_nothing(
    token_client: Any,
    alice: Any,
    tmp_path: Path,
    store_root: Path,
    maker: Callable[..., Path],
    name: str,
    contents: bytes,
    words: str,
) -> None:
    response = upload(
        token_client(alice), archive(tmp_path, maker, {"train.py": TRAIN, name: contents})
    )
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert list(errors) == ["archive"] and errors["archive"][0].startswith(words), errors
    assert not CodeBundle.objects.exists() and stored_files(store_root) == []


def test_the_web_upload_shows_the_refusal_on_the_archive_field(
    alice: Any, acme: Any, tmp_path: Path, store_root: Path
) -> None:
    data = archive(tmp_path, tar_gz, {"train.py": TRAIN, "requirements.txt": b"-e .\n"})
    form = JobForm(
        {
            "tenant": "acme",
            "name": "train",
            "source": PROGRAM,
            "entrypoint": "train.py",
            "launcher": "torchrun",
            "gpus": "2",
            "priority": "50",
            "recovery": "consistent",
            "checkpoint_interval": "50",
        },
        {"archive": SimpleUploadedFile("code.tgz", data)},
        tenants=Tenant.objects.filter(slug="acme"),
        user=alice,
    )
    assert not form.is_valid()
    assert form.errors["archive"][0].startswith("requirements.txt: '-e' is not allowed")
    assert not CodeBundle.objects.exists() and stored_files(store_root) == []


def test_the_code_page_lists_each_bundles_requirements(
    alice: Any, tmp_path: Path, store_root: Path
) -> None:
    page = Client()
    page.force_login(alice)
    data = archive(tmp_path, tar_gz, {"train.py": TRAIN, "requirements.txt": b"tqdm >= 4\n"})
    response = page.post(
        "/code/", {"tenant": "acme", "archive": SimpleUploadedFile("c.tgz", data)}, follow=True
    )
    assert response.status_code == 200
    cell = response.content.decode().split('class="bundle-requirements">', 1)[1].split("</td>")[0]
    assert cell == "<code>tqdm&gt;=4</code> "


def test_another_tenant_sees_no_bundle_nor_its_requirements(
    token_client: Any, alice: Any, bob: Any, tmp_path: Path
) -> None:
    files = {"train.py": TRAIN, "requirements.txt": b"secret-internal-pkg==1.0\n"}
    ours = upload(token_client(alice), archive(tmp_path, tar_gz, files)).json()
    theirs = token_client(bob)
    assert theirs.get(f"/api/v1/code/{ours['id']}/").status_code == 404
    assert "secret-internal-pkg" not in theirs.get("/api/v1/code/").content.decode()
