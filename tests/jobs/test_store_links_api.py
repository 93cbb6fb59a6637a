"""Downloads and retention never follow a link a program planted in its prefix (issue 34).

The job's prefix of a directory store is bound read-write into its sandbox:
whatever the program leaves there (a link to a host file, to a directory, to
another tenant's prefix) must be neither served by the web process nor
followed by a retention pass.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from devtools.job_steps import move
from jobs.api.downloads import ObjectMismatch
from jobs.artifacts import prefix_of
from jobs.expiry import expire_outputs
from jobs.models import Artifact, Job
from tests.jobs.outputs_helpers import put_object, stored, submit

pytestmark = pytest.mark.django_db

DATA = bytes(range(256)) * 4  # 1024 bytes
SECRET = b"SECRET_KEY=hunter2\nDATABASE_URL=postgres://portal:pw@db/portal\n" * 20
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory no job may reach: stands for ``/proc/self`` or ``/etc``."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "environ").write_bytes(SECRET)
    return directory


@pytest.fixture
def job(alice: Any, acme: Any) -> Job:
    return submit(alice, acme)


def recorded(job: Job, store_dir: Path, job_path: str, data: bytes = DATA) -> Artifact:
    """An object stored at ``job_path`` of ``job`` and its row."""
    put_object(store_dir, job, job_path, data)
    assert stored(job, job_path, data, kind="user") == "artifact"
    return Artifact.objects.get(job=job, path=f"{prefix_of(job)}/{job_path}")


def download(client: Any, artifact: Artifact, **headers: str) -> Any:
    url = f"/api/v1/jobs/{artifact.job_id}/artifacts/{artifact.pk}/download/"
    return client.get(url, headers=headers)


def received(response: Any) -> bytes:
    """Whatever bytes the response would put on the wire (a cut stream: those before the cut)."""
    if not response.streaming:
        return bytes(response.content)
    out = bytearray()
    try:
        for piece in response.streaming_content:
            out += piece
    except ObjectMismatch:
        pass
    return bytes(out)


# --------------------------------------------------------------------------- downloads


@pytest.mark.parametrize("headers", [{}, {"Range": "bytes=0-99"}, {"Range": "bytes=-50"}])
def test_a_linked_file_is_not_served(
    token_client: Any, alice: Any, job: Job, store_dir: Path, outside: Path, headers: Any
) -> None:
    artifact = recorded(job, store_dir, "artifacts/x")
    target = store_dir / artifact.path
    target.unlink()
    target.symlink_to(outside / "environ")

    response = download(token_client(alice), artifact, **headers)

    assert response.status_code == 404
    assert b"SECRET_KEY" not in received(response)


@pytest.mark.parametrize("headers", [{}, {"Range": "bytes=0-99"}])
def test_a_file_through_a_linked_directory_is_not_served(
    token_client: Any, alice: Any, job: Job, store_dir: Path, outside: Path, headers: Any
) -> None:
    artifact = recorded(job, store_dir, "artifacts/d/environ")
    linked = store_dir / prefix_of(job) / "artifacts" / "d"
    (linked / "environ").unlink()
    linked.rmdir()
    linked.symlink_to(outside)

    response = download(token_client(alice), artifact, **headers)

    assert response.status_code == 404
    assert b"SECRET_KEY" not in received(response)


def test_a_range_of_an_object_shorter_than_its_record_serves_nothing(
    token_client: Any, alice: Any, job: Job, store_dir: Path
) -> None:
    """The size comes from the opened object and is checked before a range's first byte."""
    artifact = recorded(job, store_dir, "artifacts/model.bin")
    (store_dir / artifact.path).write_bytes(b"other bytes, fewer of them")

    response = download(token_client(alice), artifact, Range="bytes=0-9")

    assert received(response) == b""


def test_a_normal_object_still_downloads_whole_and_in_ranges(
    token_client: Any, alice: Any, job: Job, store_dir: Path
) -> None:
    artifact = recorded(job, store_dir, "artifacts/sub/model.bin")
    client = token_client(alice)
    whole = download(client, artifact)
    assert (whole.status_code, received(whole)) == (200, DATA)
    part = download(client, artifact, Range="bytes=10-19")
    assert (part.status_code, received(part)) == (206, DATA[10:20])
    assert part["Content-Range"] == f"bytes 10-19/{len(DATA)}"


# --------------------------------------------------------------------------- retention


@pytest.fixture
def store_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "store"
    root.mkdir()
    with override_settings(
        ARTIFACT_URL=f"file://{root}", ARTIFACT_RETENTION_DAYS=30, LOG_RETENTION_DAYS=30
    ):
        yield root


def ended_job(user: Any, tenant: Any, root: Path, name: str, days_ago: float) -> Job:
    """A finished job with a model in ``artifacts`` and a checkpoint, both recorded."""
    job = submit(user, tenant, name)
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=1, at=NOW - 60 * DAY)
    for path, kind in (("artifacts/model.onnx", "user"), ("checkpoints/step-1.pt", "checkpoint")):
        data = f"{name}:{path}".encode()
        put_object(root, job, path, data)
        assert stored(job, path, data, kind=kind, step=1 if kind == "checkpoint" else None) == (
            "artifact"
        )
    move(job_id=job.pk, to_state="completed", reason="over", at=NOW - days_ago * DAY)
    return job


def files_below(directory: Path) -> set[str]:
    """Regular files below ``directory``, found without following a link."""
    found = set()
    for current, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(current) / name
            if not path.is_symlink() and path.is_file():
                found.add(str(path.relative_to(directory)))
    return found


def test_retention_never_deletes_through_a_link_to_another_tenants_prefix(
    store_root: Path, alice: Any, bob: Any, acme: Any, globex: Any, outside: Path
) -> None:
    victim = ended_job(bob, globex, store_root, "victim", days_ago=1)  # kept: not expired
    attacker = ended_job(alice, acme, store_root, "attacker", days_ago=40)
    prefix = store_root / prefix_of(attacker)
    for planted in (prefix / "artifacts" / "model.onnx",):
        planted.unlink()
    (prefix / "artifacts").rmdir()
    (prefix / "artifacts").symlink_to(store_root / prefix_of(victim) / "artifacts")
    (prefix / "checkpoints" / "d").symlink_to(outside)
    victims_files = files_below(store_root / prefix_of(victim))

    result = expire_outputs(now=NOW, redis_url=settings.REDIS_URL)

    assert files_below(store_root / prefix_of(victim)) == victims_files
    assert files_below(outside) == {"environ"}
    assert result.errors == 0
    assert not Artifact.objects.filter(job=attacker).exists()
    assert Artifact.objects.filter(job=victim).count() == 2
    assert not os.path.lexists(prefix / "artifacts")  # the link itself went, as a link
    assert not os.path.lexists(prefix / "checkpoints")
