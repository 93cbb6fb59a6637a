"""The submit form's workflow parts: Run after (dependencies) and Array (tasks, at most running).

Through the real page (POST /jobs/new/): a valid form creates what the API would,
bad input shows the API's words next to its field and creates nothing, and a
tenant's form cannot name another tenant's job.
"""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.test import Client

from jobs.forms import after_entries
from jobs.models import Job, JobArray, JobDependency
from tests.jobs.test_programs import bundle_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def store(tmp_path: Any, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


def post(user: Any, tenant: Any, **fields: Any) -> Any:
    client = Client()
    client.force_login(user)
    data = {
        "tenant": tenant.slug,
        "name": "grid",
        "source": "program",
        "code": bundle_of(user, tenant).sha256,
        "entrypoint": "train.py",
        "launcher": "torchrun",
        "gpus": "1",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "50",
    }
    data.update({k: str(v) for k, v in fields.items()})
    return client.post("/jobs/new/", data)


def field_errors(response: Any, field: str) -> str:
    """The errors the page shows next to ``field``, one a line (empty if none)."""
    page = response.content.decode()
    shown = re.findall(rf'<div class="error field-error" data-for="{field}">(.*?)</div>', page)
    return "\n".join(unescape(text) for text in shown)


def test_after_lines_become_the_apis_after_list() -> None:
    entries, lines = after_entries("after_ok job 12\n\n  after_any array 3\nafter_failed 7\n")
    assert entries == [
        {"kind": "after_ok", "job": 12},
        {"kind": "after_any", "array": 3},
        {"kind": "after_failed", "job": 7},
    ]
    assert lines == [1, 3, 4]
    with pytest.raises(ValueError, match="Line 2: write a kind"):
        after_entries("after_ok job 1\nafter_ok")


def test_the_form_submits_a_job_that_waits(alice: Any, acme: Any) -> None:
    first = post(alice, acme, name="prep")
    assert first.status_code == 302
    prep = Job.objects.get(name="prep")
    then = post(alice, acme, name="train", after=f"after_ok job {prep.pk}")
    assert then.status_code == 302
    train = Job.objects.get(name="train")
    assert then["Location"] == f"/jobs/{train.pk}/"
    assert train.state == "pending" and f"job {prep.pk} to complete" in train.wait_reason
    assert list(JobDependency.objects.filter(job=train).values_list("kind", "on_job")) == [
        ("after_ok", prep.pk)
    ]


def test_the_form_submits_an_array_with_a_cap(alice: Any, acme: Any) -> None:
    response = post(alice, acme, array_size=4, array_max_running=2)
    array = JobArray.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/arrays/{array.pk}/"
    assert (array.size, array.max_running) == (4, 2)
    states = sorted(Job.objects.filter(array=array).values_list("state", flat=True))
    assert states == ["pending", "pending", "queued", "queued"]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"after": "after_soon job 1"}, "after", "Line 1: Unknown kind 'after_soon'"),
        ({"after": "after_ok job 1\nafter_ok job x"}, "after", "Line 2: Must be a positive"),
        ({"after": "after_ok thing 1"}, "after", "Line 1: Unknown field(s): thing."),
        ({"after": "after_ok"}, "after", "Line 1: write a kind, then job or array"),
        ({"after": "after_ok job 999999"}, "after", "Line 1: No job 999999 in tenant acme."),
        ({"after": "after_any array 999999"}, "after", "No array 999999 in tenant acme."),
        ({"array_size": 0}, "array_size", "A whole number of tasks from 1 to 1000."),
        ({"launcher": "session"}, "launcher", "Select a valid choice"),
        ({"array_size": 2000}, "array_size", "A whole number of tasks from 1 to 1000."),
        ({"array_size": 3, "array_max_running": 0}, "array_max_running", "at least 1"),
        ({"array_max_running": 2}, "array_size", "Give the number of tasks"),
        ({"array_size": 2, "env": "TASK_ID=3"}, "env", "TASK_ID is set by the array"),
    ],
)
def test_bad_input_is_shown_next_to_its_field_and_creates_nothing(
    alice: Any, acme: Any, fields: dict[str, Any], field: str, words: str
) -> None:
    response = post(alice, acme, **fields)
    assert response.status_code == 200
    assert words in field_errors(response, field), response.content.decode()[-3000:]
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_another_tenants_job_is_answered_as_a_missing_one(
    alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    assert post(bob, globex, name="theirs").status_code == 302
    theirs = Job.objects.get(name="theirs")
    response = post(alice, acme, after=f"after_ok job {theirs.pk}")
    assert f"Line 1: No job {theirs.pk} in tenant acme." in field_errors(response, "after")
    assert not Job.objects.filter(tenant=acme).exists()


def test_an_array_of_a_built_in_workload_is_refused(alice: Any, acme: Any) -> None:
    response = post(alice, acme, source="builtin", workload="mlp-digits", array_size=2)
    assert "An array runs a program" in field_errors(response, "workload")
    assert not JobArray.objects.exists()


def test_an_array_may_run_after_a_job(alice: Any, acme: Any) -> None:
    assert post(alice, acme, name="prep").status_code == 302
    prep = Job.objects.get(name="prep")
    response = post(alice, acme, name="grid", array_size=2, after=f"after_ok {prep.pk}")
    array = JobArray.objects.get()
    assert response["Location"] == f"/arrays/{array.pk}/"
    tasks = list(Job.objects.filter(array=array))
    assert [t.state for t in tasks] == ["pending", "pending"]
    assert all(f"job {prep.pk} to complete" in t.wait_reason for t in tasks)
    assert JobDependency.objects.filter(job__in=tasks, on_job=prep).count() == 2
