"""``portalctl sessions`` against the real portal in this process (httpx into the Django
application): start with an idle timeout written as a duration, list, open prints the lab
URL, stop; refusals come back as exit 4 with the server's message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.choices import JobKind, JobState
from jobs.models import Job
from portalctl.sessions import lab_url, start_fields
from tests.cli.in_process import env, run, store
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["env", "store"]  # tests.cli.in_process's fixtures, used here by name


def test_start_fields_leave_out_what_was_not_given() -> None:
    assert start_fields(gpus=1) == {"gpus": 1}
    assert start_fields(gpus=2, idle_s=1800, priority="70", requirements=["einops"]) == {
        "gpus": 2,
        "idle_timeout_s": 1800,
        "priority": 70,
        "environment": {"requirements": ["einops"]},
    }
    assert lab_url("http://p:8000/", {"lab_url": "/sessions/3/lab-open/"}) == (
        "http://p:8000/sessions/3/lab-open/"
    )


def test_start_ls_open_stop(env: dict[str, str], alice: Any, acme: Any) -> None:
    demo_cluster()
    started = run(env, "sessions", "start", "--gpus", "2", "--idle", "30m", "--priority", "high")
    assert started.exit_code == 0, started.output
    job = Job.objects.get(pk=int(started.output))
    assert (job.kind, job.gpus, job.idle_timeout_s, job.priority) == (
        JobKind.SESSION, 2, 1800, 90,
    )  # fmt: skip
    listed = run(env, "sessions", "ls")
    assert listed.exit_code == 0 and "30m" in listed.output and "queued" in listed.output
    opened = run(env, "sessions", "open", str(job.pk), "-o", "json")
    assert json.loads(opened.output)["lab_url"] == f"http://portal.test/sessions/{job.pk}/lab-open/"
    plain = run(env, "sessions", "open", str(job.pk))
    assert plain.exit_code == 0 and f"/sessions/{job.pk}/lab-open/" in plain.output
    stopped = run(env, "sessions", "stop", str(job.pk), "-o", "json")
    assert stopped.exit_code == 0 and json.loads(stopped.output)["state"] == JobState.CANCELLED
    again = run(env, "sessions", "stop", str(job.pk))
    assert again.exit_code == 4 and "already cancelled" in again.output


def test_a_refused_start_names_the_field(env: dict[str, str], alice: Any, acme: Any) -> None:
    demo_cluster()
    refused = run(env, "sessions", "start", "--idle", "30d")
    assert refused.exit_code == 4 and "idle" in refused.output
    bad = run(env, "sessions", "start", "--idle", "soon")
    assert bad.exit_code == 2
    assert not Job.objects.exists()
