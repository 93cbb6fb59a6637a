"""A bundle's ``uv.lock``: read at upload under the rule the agent builds with, its index
packages stored as exact pins and shown on the Code page; a package from anywhere else
refuses the upload naming the file and the package, and stores nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils.html import escape

from bundles.models import CodeBundle
from tests.bundles.test_requirements import PYPROJECT, TRAIN, archive, stored_files, upload
from workers.tests.bundles import tar_gz, zip_file

pytestmark = pytest.mark.django_db

LOCK = (Path(__file__).parents[2] / "workers" / "tests" / "fixtures" / "uv.lock").read_bytes()
PINS = [
    'colorama==0.4.6; sys_platform == "win32"',
    "einops==0.8.1",
    "markdown-it-py==3.0.0",
    "mdurl==0.1.2",
    "pygments==2.18.0",
    "rich==13.9.4",
    "tqdm==4.67.1",
    'typing-extensions==4.12.2; python_full_version < "3.11"',
]
GIT_SOURCE = LOCK.replace(
    b'name = "einops"\nversion = "0.8.1"\nsource = { registry = "https://pypi.org/simple" }',
    b'name = "einops"\nversion = "0.8.1"\n'
    b'source = { git = "https://github.com/evil/einops?rev=main#0123456789abcdef" }',
)
PATH_SOURCE = LOCK.replace(
    b'name = "mdurl"\nversion = "0.1.2"\nsource = { registry = "https://pypi.org/simple" }',
    b'name = "mdurl"\nversion = "0.1.2"\nsource = { path = "/etc/wheels/mdurl.whl" }',
)


@pytest.fixture(autouse=True)
def store_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "artifacts"
    settings.ARTIFACT_URL = f"file://{root}"
    return root


@pytest.mark.parametrize(
    ("lock", "words"),
    [
        (GIT_SOURCE, "uv.lock: package einops comes from a git source: only packages from "
                     "the operator's index"),
        (PATH_SOURCE, "uv.lock: package mdurl comes from a path source: only packages from "
                      "the operator's index"),
        (LOCK + b'\n[[package]]\nname = "rich"\nversion = "14.0.0"\n'
                b'source = { registry = "https://pypi.org/simple" }\n',
         "uv.lock: holds two versions of rich (13.9.4 and 14.0.0"),
        (b"version = 1\n[[package]\n", "uv.lock: is not valid TOML"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("maker", [tar_gz, zip_file])
def test_a_lock_with_a_package_from_elsewhere_refuses_the_upload_and_stores_nothing(
    token_client: Any,
    alice: Any,
    tmp_path: Path,
    store_root: Path,
    maker: Callable[..., Path],
    lock: bytes,
    words: str,
) -> None:
    files = {"train.py": TRAIN, "uv.lock": lock, "requirements.txt": b"einops\n"}
    response = upload(token_client(alice), archive(tmp_path, maker, files))
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert list(errors) == ["archive"] and errors["archive"][0].startswith(words), errors
    assert not CodeBundle.objects.exists() and stored_files(store_root) == []


@pytest.mark.parametrize("maker", [tar_gz, zip_file])
def test_a_lock_wins_and_its_pins_are_stored_and_listed(
    token_client: Any, alice: Any, tmp_path: Path, maker: Callable[..., Path]
) -> None:
    files = {
        "train.py": TRAIN,
        "uv.lock": LOCK,
        "pyproject.toml": PYPROJECT,
        "requirements.txt": b"six\n",
    }
    client = token_client(alice)
    response = upload(client, archive(tmp_path, maker, files))
    assert response.status_code == 201, response.json()
    assert response.json()["requirements"] == PINS
    assert CodeBundle.objects.get().requirements == PINS
    listed = client.get("/api/v1/code/").json()["results"]
    assert [row["requirements"] for row in listed] == [PINS]


def test_the_code_page_shows_a_locks_pins(alice: Any, tmp_path: Path) -> None:
    page = Client()
    page.force_login(alice)
    data = archive(tmp_path, tar_gz, {"train.py": TRAIN, "uv.lock": LOCK})
    response = page.post(
        "/code/", {"tenant": "acme", "archive": SimpleUploadedFile("c.tgz", data)}, follow=True
    )
    assert response.status_code == 200
    cell = response.content.decode().split('class="bundle-requirements">', 1)[1].split("</td>")[0]
    assert cell == "".join(f"<code>{escape(pin)}</code> " for pin in PINS)
