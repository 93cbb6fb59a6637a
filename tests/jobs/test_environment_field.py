"""A job's own Python dependencies (issue 36): the ``environment`` field from the API and the
form to the job's page and to the agents' StartWorkers.

The rule itself is ``workers.environment`` (tested there); these tests check that the
portal applies it, names the field it refuses, stores nothing then, and passes on what it
stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from control.tick import run_tick
from jobs.agent_commands import GpuHome, membership_commands
from jobs.forms import PROGRAM, JobForm
from jobs.models import Job
from jobs.outbox import launch_of
from tenancy.models import Tenant
from tests.conftest import job_body
from tests.jobs.control_helpers import demo_cluster, drain_all
from tests.jobs.test_programs import bundle_of
from workers.environment import MAX_REQUIREMENTS
from workers.protocol import Command, StartWorkers

pytestmark = pytest.mark.django_db

ASKED = {"requirements": ["einops==0.8.1", "tqdm >= 4"], "python": "3.11"}
STORED = {"requirements": ["einops==0.8.1", "tqdm>=4"], "python": "3.11", "replace": []}


@pytest.fixture(autouse=True)
def store(tmp_path: Path, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


def program_body(code: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "mine",
        "code": code,
        "entrypoint": "train.py",
        "launcher": "torchrun",
        "gpus": 2,
    }
    body.update(overrides)
    return body


def test_an_environment_is_stored_normalised_and_shown_by_the_detail_api(
    token_client: Any, alice: Any, acme: Tenant
) -> None:
    client = token_client(alice)
    bundle = bundle_of(alice, acme)
    response = client.post(
        "/api/v1/jobs/", program_body(bundle.sha256, environment=ASKED), format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["environment"] == STORED
    job = Job.objects.get()
    assert job.environment == STORED
    detail = client.get(f"/api/v1/jobs/{job.pk}/")
    assert detail.status_code == 200 and detail.json()["environment"] == STORED


@pytest.mark.parametrize("environment", [None, {}, {"requirements": []}, {"python": "3.11"}])
def test_asking_for_nothing_stores_an_empty_environment(
    token_client: Any, alice: Any, acme: Tenant, environment: Any
) -> None:
    bundle = bundle_of(alice, acme)
    body = program_body(bundle.sha256)
    if environment is not None:
        body["environment"] = environment
    response = token_client(alice).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["environment"] == {} and Job.objects.get().environment == {}


@pytest.mark.parametrize(
    ("environment", "field", "words"),
    [
        ({"requirements": ["--index-url https://evil.example/simple"]}, "environment.requirements",
         "'--index-url' is not allowed"),
        ({"requirements": ["-e ."]}, "environment.requirements", "'-e' is not allowed"),
        ({"requirements": ["evil @ https://evil.example/evil.whl"]}, "environment.requirements",
         "is not allowed"),
        ({"requirements": ["not a requirement!"]}, "environment.requirements",
         "is not a requirement"),
        ({"requirements": "einops"}, "environment.requirements", "list of strings"),
        ({"requirements": [f"pkg{i}" for i in range(MAX_REQUIREMENTS + 1)]},
         "environment.requirements", f"more than {MAX_REQUIREMENTS}"),
        ({"python": "2"}, "environment.python", "Python version"),
        ({"replace": ["../torch"]}, "environment.replace", "not a package name"),
        ({"pip": ["einops"]}, "environment", "unknown keys: pip"),
        ("einops==0.8.1", "environment", "must be an object"),
    ],
)  # fmt: skip
def test_a_bad_environment_is_a_400_naming_the_field_and_creates_nothing(
    token_client: Any, alice: Any, acme: Tenant, environment: Any, field: str, words: str
) -> None:
    bundle = bundle_of(alice, acme)
    response = token_client(alice).post(
        "/api/v1/jobs/", program_body(bundle.sha256, environment=environment), format="json"
    )
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert field in errors and words.lower() in " ".join(errors[field]).lower(), errors
    assert not Job.objects.exists()


def test_the_bundles_requirements_count_with_the_jobs(
    token_client: Any, alice: Any, acme: Tenant
) -> None:
    """The agent installs both, so the rule's cap is on the two together."""
    declared = "\n".join(f"pkg{i}" for i in range(MAX_REQUIREMENTS - 1)).encode()
    bundle = bundle_of(alice, acme, {"train.py": b"pass\n", "requirements.txt": declared})
    assert len(bundle.requirements) == MAX_REQUIREMENTS - 1
    client = token_client(alice)
    one_more = program_body(bundle.sha256, environment={"requirements": ["einops"]})
    assert client.post("/api/v1/jobs/", one_more, format="json").status_code == 201
    two_more = program_body(bundle.sha256, environment={"requirements": ["einops", "tqdm"]})
    response = client.post("/api/v1/jobs/", two_more, format="json")
    assert response.status_code == 400 and "environment.requirements" in response.json()["errors"]
    assert Job.objects.count() == 1


def test_a_built_in_workload_with_an_environment_is_a_400_naming_it(
    token_client: Any, alice: Any
) -> None:
    client = token_client(alice)
    response = client.post(
        "/api/v1/jobs/", job_body(environment={"requirements": ["einops"]}), format="json"
    )
    assert response.status_code == 400 and "environment" in response.json()["errors"]
    assert not Job.objects.exists()
    response = client.post("/api/v1/jobs/", job_body(environment={}), format="json")
    assert response.status_code == 201 and response.json()["environment"] == {}


def test_another_tenant_sees_neither_the_job_nor_its_environment(
    token_client: Any, alice: Any, acme: Tenant, bob: Any
) -> None:
    bundle = bundle_of(alice, acme)
    job_id = (
        token_client(alice)
        .post("/api/v1/jobs/", program_body(bundle.sha256, environment=ASKED), format="json")
        .json()["id"]
    )
    theirs = token_client(bob)
    assert theirs.get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert "einops" not in theirs.get("/api/v1/jobs/").content.decode()
    # and an environment does not open another tenant's bundle
    response = theirs.post(
        "/api/v1/jobs/", program_body(bundle.sha256, environment=ASKED), format="json"
    )
    assert response.status_code == 400 and "code" in response.json()["errors"]
    assert Job.objects.count() == 1


def test_the_start_command_carries_the_environment_as_stored(
    token_client: Any, alice: Any, acme: Tenant
) -> None:
    bundle = bundle_of(alice, acme)
    token_client(alice).post(
        "/api/v1/jobs/", program_body(bundle.sha256, environment=ASKED), format="json"
    )
    job = Job.objects.select_related("tenant", "code").get()
    homes = {0: GpuHome(node="n0", local=0), 1: GpuHome(node="n0", local=1)}
    commands = membership_commands(launch_of(job), (), (0, 1), homes, reason="start")
    command = Command.from_dict(commands[0][1].to_dict())  # as the agent receives it
    assert isinstance(command, StartWorkers) and command.program is not None
    assert command.program.environment == STORED


@pytest.mark.django_db(transaction=True)
def test_the_tick_sends_the_agents_a_start_with_the_environment(
    token_client: Any, alice: Any, acme: Tenant
) -> None:
    nodes = demo_cluster()
    drain_all(nodes)  # what earlier tests left on the agents' queues
    bundle = bundle_of(alice, acme)
    response = token_client(alice).post(
        "/api/v1/jobs/", program_body(bundle.sha256, environment=ASKED), format="json"
    )
    assert response.status_code == 201, response.json()
    run_tick(policy="fifo")
    starts = [c for cmds in drain_all(nodes).values() for c in cmds if c["type"] == "start_workers"]
    assert starts and all(c["program"]["environment"] == STORED for c in starts)


def test_the_job_page_shows_the_bundles_and_the_jobs_requirements(
    token_client: Any, alice: Any, acme: Tenant
) -> None:
    bundle = bundle_of(
        alice, acme, {"train.py": b"pass\n", "requirements.txt": b"numpy-quaternion\n"}
    )
    job_id = (
        token_client(alice)
        .post("/api/v1/jobs/", program_body(bundle.sha256, environment=ASKED), format="json")
        .json()["id"]
    )
    page = Client()
    page.force_login(alice)
    html = page.get(f"/jobs/{job_id}/").content.decode()
    shown = html.split('id="job-requirements">', 1)[1].split("</dd>", 1)[0]
    assert "numpy-quaternion" in shown and "einops==0.8.1" in shown and "tqdm&gt;=4" in shown
    assert "Python 3.11" in shown


def form_for(user: Any, code: str, **fields: str) -> JobForm:
    data = {
        "tenant": "acme",
        "name": "train",
        "source": PROGRAM,
        "code": code,
        "entrypoint": "train.py",
        "launcher": "torchrun",
        "gpus": "2",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "50",
        **fields,
    }
    return JobForm(data, tenants=Tenant.objects.filter(slug="acme"), user=user)


def test_the_forms_requirements_box_is_read_as_requirements_txt(alice: Any, acme: Tenant) -> None:
    bundle = bundle_of(alice, acme)
    form = form_for(alice, bundle.sha256, environment="einops==0.8.1  # layers\n\ntqdm >= 4\n")
    assert form.is_valid(), form.errors
    assert form.spec is not None and form.spec.program is not None
    assert form.spec.program.environment_field == {
        "requirements": ["einops==0.8.1", "tqdm>=4"],
        "python": None,
        "replace": [],
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("--extra-index-url https://evil.example/simple", "'--extra-index-url' is not allowed"),
        ("evil @ file:///etc/passwd", "is not allowed"),
        ("\n".join(f"pkg{i}" for i in range(MAX_REQUIREMENTS + 1)), "more than"),
    ],
)
def test_a_bad_requirements_box_is_an_error_on_that_field(
    alice: Any, acme: Tenant, text: str, words: str
) -> None:
    bundle = bundle_of(alice, acme)
    form = form_for(alice, bundle.sha256, environment=text)
    assert not form.is_valid()
    assert words.lower() in " ".join(form.errors["environment"]).lower(), form.errors
    assert not Job.objects.exists()
