"""A job's own extra package index (``environment.indexes``): refused with a 400 naming the
field unless the operator sets ENVIRONMENT_ALLOW_JOB_INDEX; then stored, shown on the job's
page and in the API, and carried to the agents as stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from jobs.agent_commands import GpuHome, membership_commands
from jobs.models import Job
from jobs.outbox import launch_of
from tenancy.models import Tenant
from tests.jobs.test_environment_field import program_body
from tests.jobs.test_programs import bundle_of
from workers.protocol import Command, StartWorkers

pytestmark = pytest.mark.django_db

INDEX = "https://pypi.example.org/simple"
ASKED = {"requirements": ["einops==0.8.1"], "indexes": [INDEX]}
STORED = {"requirements": ["einops==0.8.1"], "python": None, "replace": [], "indexes": [INDEX]}


@pytest.fixture(autouse=True)
def store(tmp_path: Path, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


def submit(client: Any, code: str, environment: Any) -> Any:
    return client.post("/api/v1/jobs/", program_body(code, environment=environment), format="json")


def test_the_setting_is_off_by_default() -> None:
    from django.conf import settings

    assert settings.ENVIRONMENT_ALLOW_JOB_INDEX is False


@pytest.mark.parametrize("environment", [ASKED, {"indexes": [INDEX]}])
def test_with_the_setting_off_an_index_is_a_400_naming_the_field_and_the_setting(
    token_client: Any, alice: Any, acme: Tenant, settings: Any, environment: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = False
    response = submit(token_client(alice), bundle_of(alice, acme).sha256, environment)
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert "environment.indexes" in errors, errors
    assert "ENVIRONMENT_ALLOW_JOB_INDEX" in " ".join(errors["environment.indexes"])
    assert not Job.objects.exists()


@pytest.mark.parametrize("allowed", [False, True])
@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://me:s3cret@pypi.example.org/simple", "credentials"),
        ("http://pypi.example.org/simple", "https://"),
        ("file:///etc/passwd", "https://"),
    ],
)
def test_a_bad_index_is_a_400_whatever_the_setting_and_never_echoes_a_password(
    token_client: Any,
    alice: Any,
    acme: Tenant,
    settings: Any,
    allowed: bool,
    url: str,
    words: str,
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = allowed
    response = submit(token_client(alice), bundle_of(alice, acme).sha256, {"indexes": [url]})
    assert response.status_code == 400, response.json()
    said = " ".join(response.json()["errors"]["environment.indexes"])
    assert words in said and "s3cret" not in response.content.decode()
    assert not Job.objects.exists()


def test_more_than_three_indexes_are_a_400(
    token_client: Any, alice: Any, acme: Tenant, settings: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = True
    four = {"indexes": [f"https://i{n}.example.org/simple" for n in range(4)]}
    response = submit(token_client(alice), bundle_of(alice, acme).sha256, four)
    assert response.status_code == 400 and "environment.indexes" in response.json()["errors"]
    assert not Job.objects.exists()


def test_with_the_setting_on_an_index_is_stored_shown_and_sent_to_the_agents(
    token_client: Any, alice: Any, acme: Tenant, settings: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = True
    client = token_client(alice)
    response = submit(client, bundle_of(alice, acme).sha256, ASKED)
    assert response.status_code == 201, response.json()
    assert response.json()["environment"] == STORED
    job = Job.objects.select_related("tenant", "code").get()
    assert job.environment == STORED
    assert client.get(f"/api/v1/jobs/{job.pk}/").json()["environment"] == STORED
    page = Client()
    page.force_login(alice)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    shown = html.split('id="job-indexes">', 1)[1].split("</dd>", 1)[0]
    assert f"<code>{INDEX}</code>" in shown
    homes = {0: GpuHome(node="n0", local=0), 1: GpuHome(node="n0", local=1)}
    commands = membership_commands(launch_of(job), (), (0, 1), homes, reason="start")
    command = Command.from_dict(commands[0][1].to_dict())  # as the agent receives it
    assert isinstance(command, StartWorkers) and command.program is not None
    assert command.program.environment == STORED


def test_an_index_alone_serves_the_bundles_requirements(
    token_client: Any, alice: Any, acme: Tenant, settings: Any
) -> None:
    settings.ENVIRONMENT_ALLOW_JOB_INDEX = True
    bundle = bundle_of(alice, acme, {"train.py": b"pass\n", "requirements.txt": b"private-pkg\n"})
    response = submit(token_client(alice), bundle.sha256, {"indexes": [INDEX]})
    assert response.status_code == 201, response.json()
    assert Job.objects.get().environment == {
        "requirements": [], "python": None, "replace": [], "indexes": [INDEX]
    }  # fmt: skip


def test_a_job_without_an_index_shows_no_index_row(
    token_client: Any, alice: Any, acme: Tenant
) -> None:
    response = submit(token_client(alice), bundle_of(alice, acme).sha256, {"requirements": ["six"]})
    assert response.status_code == 201, response.json()
    assert "indexes" not in Job.objects.get().environment
    page = Client()
    page.force_login(alice)
    assert 'id="job-indexes"' not in page.get(f"/jobs/{response.json()['id']}/").content.decode()
