"""Retries and run-time limits in the live control plane: the real tick, reports, API and form.

A failing program is requeued while it has restarts left (resuming from its
latest checkpoint) and then fails; losing a server, reconcile's requeue and
preemption never count as a failure; a job at its run-time limit is stopped
(the stop asks for a final checkpoint) and ends failed.  Agent reports go
through the real report path; commands are read off the agents' real queues.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from control.limits import limit_reached
from control.reports import handle_report
from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_set_server_state
from jobs.agent_commands import runtime_job_name
from jobs.artifacts import prefix_of
from jobs.models import Job, JobEvent, JobGpu
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import Tenant
from tests.conftest import job_body
from tests.jobs.control_helpers import demo_cluster, drain_all
from tests.jobs.test_programs import exited, submit_program
from tests.jobs.test_reconcile import at, heartbeat, hosts, placed
from workers.artifacts import ArtifactStore
from workers.elastic.checkpoint import Checkpoints

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Any, **fields: Any) -> Job:
    data = {"name": "retry", "workload": "mlp-digits", "gpus": 2, **fields}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def commands(nodes: list[str]) -> list[dict[str, Any]]:
    return [c for cmds in drain_all(nodes).values() for c in cmds]


def failed(job: Job, error: str = "CUDA error: an illegal memory access") -> str:
    """The runtime's ``failed`` report, as an agent forwards it (no event id: the agent saw it)."""
    return handle_report(
        {"type": "failed", "node": "node-0", "job": runtime_job_name(job.pk), "error": error}
    )


def kinds(job: Job) -> list[str]:
    return list(job.events.order_by("pk").values_list("kind", flat=True))


@pytest.fixture
def store(tmp_path: Path, settings: Any) -> Path:
    settings.ARTIFACT_URL = f"file://{tmp_path}"
    return tmp_path


# --------------------------------------------------------------------------- retries


def test_a_failing_program_is_retried_max_restarts_times_then_fails(
    alice: Any, acme: Any, store: Path
) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, max_restarts=2)
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running"
    Checkpoints(ArtifactStore(f"file://{store}").child(prefix_of(job))).save(40, {"w": 1})
    drain_all(nodes)

    for attempt in (2, 3):
        assert failed(job) == "retried"
        job.refresh_from_db()
        assert (job.state, job.restarts, job.step, job.failure_reason) == (
            "queued",
            attempt - 1,
            40,
            "",
        )
        assert not JobGpu.objects.filter(job=job).exists()
        retried = job.events.filter(kind="retried").order_by("-pk").first()
        assert retried is not None and (retried.from_state, retried.to_state) == (
            "running",
            "queued",
        )
        assert retried.reason.startswith(f"retried (attempt {attempt} of 3): requeued, resumes")
        assert "from step 40" in retried.reason and "illegal memory access" in retried.reason
        # What may still run of the failed attempt is stopped; then a tick places it again.
        assert {c["type"] for c in commands(nodes)} == {"stop_job"}
        assert failed(job) == "stale"  # the same failure, reported again: no second restart
        run_tick(policy="fifo")
        job.refresh_from_db()
        assert job.state == "running" and job.restarts == attempt - 1
        assert {c["type"] for c in commands(nodes)} == {"start_workers"}

    assert failed(job) == "failed"
    job.refresh_from_db()
    assert (job.state, job.restarts) == ("failed", 2)
    assert job.failure_reason == "CUDA error: an illegal memory access (after 2 restarts)"
    assert kinds(job).count("retried") == 2 and "preempted" not in kinds(job)
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "failed"  # never requeued again
    # The job page's history and Settings card say what happened.
    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Requeued after a failure" in page and "retried (attempt 3 of 3)" in page
    assert "2 of 2 used" in page and "(after 2 restarts)" in page


def test_a_final_failure_fails_at_once_with_restarts_left_and_a_start_says_its_environment(
    alice: Any, acme: Any
) -> None:
    """An environment that does not build would not build on a retry either (issue 36)."""
    nodes = demo_cluster()
    job = submit(alice, acme, max_restarts=3)
    run_tick(policy="fifo")
    drain_all(nodes)
    name = runtime_job_name(job.pk)
    used = {"key": "0123456789abcdef" * 2, "hit": False, "build_s": 2.5,
            "packages": ["einops==0.8.1"]}  # fmt: skip
    started = {"type": "started", "node": "node-0", "job": name, "command_id": "c-1",
               "workers": [], "environment": used}  # fmt: skip
    handle_report(started)
    note = job.events.filter(kind="note").order_by("-pk").first()
    assert note is not None and note.reason == (
        f"node-0: environment {used['key']}: built in 2.5 s (einops==0.8.1)"
    )
    assert note.data == {"environment": used["key"], "hit": False, "build_s": 2.5,
                         "packages": ["einops==0.8.1"], "node": "node-0"}  # fmt: skip
    job.refresh_from_db()  # the job itself says what it runs in: API, page, portalctl get
    assert job.environment_used == note.data
    client = Client()
    client.force_login(alice)
    assert client.get(f"/api/v1/jobs/{job.pk}/").json()["environment_used"] == note.data
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "built in 2.5 s" in page and "<code>einops==0.8.1</code>" in page
    forged = {**started, "environment": {**used, "key": "../../etc"}}
    assert handle_report(forged).startswith("invalid")  # a bad report is refused, nothing noted
    report = {"type": "failed", "node": "node-0", "job": name, "final": True,
              "error": "its environment does not build: No solution found"}  # fmt: skip
    assert handle_report(report) == "failed"
    job.refresh_from_db()
    assert (job.state, job.restarts) == ("failed", 0)
    assert job.failure_reason == "its environment does not build: No solution found"
    assert {c["type"] for c in commands(nodes)} == {"stop_job"}
    assert handle_report(report) == "noted"


def test_without_restarts_a_failure_fails_the_job_as_before(alice: Any, acme: Any) -> None:
    demo_cluster()
    job = submit(alice, acme)
    run_tick(policy="fifo")
    assert failed(job, "boom") == "failed"
    job.refresh_from_db()
    assert (job.state, job.failure_reason, job.restarts) == ("failed", "boom", 0)


def test_a_crashed_torchrun_program_is_retried_as_a_new_run(
    alice: Any, acme: Any, store: Path
) -> None:
    nodes = demo_cluster()
    program = submit_program(alice, acme, "torchrun", lo=2, hi=2, gpus=2)
    Job.objects.filter(pk=program.pk).update(max_restarts=1)
    run_tick(policy="fifo")
    program.refresh_from_db()
    assert (program.state, program.generation) == ("running", 1)
    drain_all(nodes)
    assert exited(program, "w0", "crashed", 1, generation=1) == "retried"
    program.refresh_from_db()
    assert program.state == "queued" and program.restarts == 1
    reason = program.events.get(kind="retried").reason
    assert "attempt 2 of 2" in reason and "resumes from its CHECKPOINT_DIR" in reason
    assert "worker w0 crashed (exit 1)" in reason
    run_tick(policy="fifo")
    program.refresh_from_db()
    assert (program.state, program.generation) == ("running", 2)
    # The first run's other worker exits late: that run is over, nothing changes.
    assert exited(program, "w1", "crashed", 1, generation=1) == "earlier run"
    assert exited(program, "w0", "crashed", 1, generation=2) == "failed"
    program.refresh_from_db()
    assert program.state == "failed" and program.failure_reason.endswith("(after 1 restart)")


def test_losing_a_server_does_not_count(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, max_restarts=1)
    run_tick(policy="fifo")
    homes = set(Server.objects.filter(gpu_set__assignment__job=job).values_list("node", flat=True))
    for node in homes:
        do_set_server_state(node=node, state="down")
    run_tick(policy="fifo")  # requeued off its dead servers, placed again elsewhere
    job.refresh_from_db()
    assert job.state == "running" and job.restarts == 0
    assert "went down" in " ".join(job.events.values_list("reason", flat=True))
    drain_all(nodes)
    # With its one restart intact, a real failure is still retried once.
    assert failed(job) == "retried"
    job.refresh_from_db()
    assert job.restarts == 1 and "retried" in kinds(job)


def test_a_preemption_does_not_count(alice: Any, acme: Any, bob: Any, globex: Any) -> None:
    demo_cluster()
    old = submit(alice, acme, gpus=8, max_restarts=1)
    run_tick(policy="tiresias")
    # Past Tiresias' first threshold: a newcomer in the first queue takes its GPUs.
    Job.objects.filter(pk=old.pk).update(attained_gpu_seconds=4000.0)
    new = submit(bob, globex, gpus=4)
    run_tick(policy="tiresias")
    old.refresh_from_db()
    assert (old.state, old.restarts) == ("queued", 0)
    assert "preempted" in kinds(old) and "retried" not in kinds(old)
    run_tick(policy="tiresias")
    assert Job.objects.get(pk=new.pk).state == "running"


def test_a_reconcile_requeue_does_not_use_a_restart(
    alice: Any, acme: Any, store: Path, settings: Any
) -> None:
    settings.RECONCILE_SECONDS = 15.0
    job, nodes, start = placed(alice, acme, job=submit(alice, acme, max_restarts=1))
    heartbeat(nodes, at(2, start), {hosts(job)[0]: [job]})
    heartbeat(nodes, at(20, start))  # no agent runs it any more
    run_tick(policy="fifo", now=at(20, start))
    job.refresh_from_db()
    assert job.restarts == 0 and "retried" not in kinds(job)
    assert any("requeued" in r for r in job.events.values_list("reason", flat=True))


# --------------------------------------------------------------------------- run-time limit


@pytest.mark.parametrize(
    ("ran_s", "limit", "reached"), [(59.9, 60, False), (60.0, 60, True), (1e6, None, False)]
)
def test_the_limit_is_wall_clock_since_the_first_start(
    ran_s: float, limit: int | None, reached: bool
) -> None:
    now = timezone.now()
    assert limit_reached(now - timedelta(seconds=ran_s), limit, now) is reached
    assert limit_reached(None, 60, now) is False


def test_a_job_at_its_limit_is_stopped_with_a_final_checkpoint_and_fails(
    alice: Any, acme: Any
) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, max_restarts=3, max_runtime_s=60)
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running" and job.runtime_deadline is not None
    drain_all(nodes)
    first_start = timezone.now() - timedelta(seconds=59)
    Job.objects.filter(pk=job.pk).update(started_at=first_start)
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running" and commands(nodes) == []  # 59 s: not yet

    Job.objects.filter(pk=job.pk).update(started_at=first_start - timedelta(seconds=2))
    result = run_tick(policy="fifo")
    assert job.pk in result.changed_jobs
    job.refresh_from_db()
    assert (job.state, job.failure_reason, job.parallelism) == (
        "failed",
        "run-time limit reached",
        0,
    )
    assert not JobGpu.objects.filter(job=job).exists()
    stops = commands(nodes)
    assert stops and {c["type"] for c in stops} == {"stop_job"}
    # A graceful stop: the runtime checkpoints before its workers exit (not a kill).
    assert all(c["reason"] == "run-time limit reached: final checkpoint, then stop" for c in stops)
    assert all(c["grace_seconds"] > 0 for c in stops)
    event = job.events.order_by("-pk")[0]
    assert (event.kind, event.to_state) == ("state", "failed")
    assert "run-time limit reached (60 s since its first start" in event.reason
    # The stopping run's last reports never requeue it, restarts or not.
    assert failed(job) == "noted"
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert (job.state, job.restarts) == ("failed", 0)


def test_time_queued_after_the_first_start_counts(alice: Any, acme: Any) -> None:
    """A job requeued (here: a retry) keeps its first start: its limit does not start over."""
    demo_cluster()
    job = submit(alice, acme, max_restarts=1, max_runtime_s=3600)
    run_tick(policy="fifo")
    job.refresh_from_db()
    first = job.started_at
    assert failed(job) == "retried"
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running" and job.started_at == first


def test_a_job_queued_again_past_its_limit_fails_without_starting(alice: Any, acme: Any) -> None:
    nodes = demo_cluster()
    job = submit(alice, acme, max_restarts=1, max_runtime_s=60)
    run_tick(policy="fifo")
    assert failed(job) == "retried"  # queued again, its first start kept
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=61))
    drain_all(nodes)
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert (job.state, job.failure_reason) == ("failed", "run-time limit reached")
    assert commands(nodes) == []  # nothing ran: nothing to start or stop


# --------------------------------------------------------------------------- submission rules


@pytest.fixture
def limited(acme: Tenant) -> Tenant:
    Tenant.objects.filter(pk=acme.pk).update(
        default_max_restarts=1,
        max_restarts_ceiling=3,
        default_max_runtime_s=None,
        max_runtime_ceiling_s=7200,
    )
    acme.refresh_from_db()
    return acme


def test_submission_takes_the_tenant_defaults(
    token_client: Callable[[Any], APIClient], alice: Any, limited: Tenant
) -> None:
    body = token_client(alice).post("/api/v1/jobs/", job_body(), format="json").json()
    # No default run-time limit but a ceiling: the ceiling.
    assert (body["max_restarts"], body["max_runtime_s"], body["restarts"]) == (1, 7200, 0)
    assert body["runtime_deadline"] is None  # not started yet
    Tenant.objects.filter(pk=limited.pk).update(default_max_runtime_s=600)
    again = token_client(alice).post(
        "/api/v1/jobs/", job_body(max_restarts=3, max_runtime_s=None), format="json"
    )
    assert (again.json()["max_restarts"], again.json()["max_runtime_s"]) == (3, 600)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"max_restarts": 4}, "max_restarts", "allows at most 3 restarts per job, not 4"),
        ({"max_runtime_s": 7201}, "max_runtime_s", "run-time limit of at most 7200 s"),
        ({"max_restarts": -1}, "max_restarts", "Must be between 0 and 100"),
        ({"max_restarts": "many"}, "max_restarts", "whole number"),
        ({"max_restarts": True}, "max_restarts", "whole number"),
        ({"max_runtime_s": 0}, "max_runtime_s", "Must be between 1 and"),
        ({"max_runtime_s": 10**12}, "max_runtime_s", "Must be between 1 and"),
        ({"max_runtime_s": 1.5}, "max_runtime_s", "whole number"),
    ],
)
def test_limits_over_the_ceiling_or_malformed_are_a_400_that_creates_nothing(
    token_client: Callable[[Any], APIClient],
    alice: Any,
    limited: Tenant,
    fields: dict[str, Any],
    field: str,
    message: str,
) -> None:
    response = token_client(alice).post("/api/v1/jobs/", job_body(**fields), format="json")
    assert response.status_code == 400, response.json()
    assert any(message in m for m in response.json()["errors"][field]), response.json()
    assert not Job.objects.exists()


def test_update_obeys_the_ceilings_and_records_the_change(
    token_client: Callable[[Any], APIClient], alice: Any, limited: Tenant
) -> None:
    client = token_client(alice)
    job_id = client.post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    url = f"/api/v1/jobs/{job_id}/"
    for body in ({"max_restarts": 4}, {"max_runtime_s": 9999}, {"max_runtime_s": 0}):
        refused = client.patch(url, body, format="json")
        assert refused.status_code == 400, body
    job = Job.objects.get(pk=job_id)
    assert (job.max_restarts, job.max_runtime_s) == (1, 7200)
    assert not job.events.filter(kind="limits").exists()
    ok = client.patch(url, {"max_restarts": 3, "max_runtime_s": 1800}, format="json")
    assert ok.status_code == 200, ok.json()
    assert (ok.json()["max_restarts"], ok.json()["max_runtime_s"]) == (3, 1800)
    event = JobEvent.objects.get(job_id=job_id, kind="limits")
    assert event.reason == "restarts 1 → 3, run-time limit 7200 s → 1800 s"
    assert client.patch(url, {"restarts": 0}, format="json").status_code == 400  # read-only


def test_the_form_takes_limits_and_refuses_them_over_the_ceiling(
    alice: Any, limited: Tenant
) -> None:
    client = Client()
    client.force_login(alice)
    form = {
        "tenant": limited.slug,
        "name": "f",
        "workload": "mlp-digits",
        "gpus": "1",
        "priority": "50",
        "recovery": "consistent",
        "checkpoint_interval": "10",
        "max_restarts": "9",
    }
    page = client.post("/jobs/new/", form)
    assert page.status_code == 200
    assert b"allows at most 3 restarts per job, not 9" in page.content
    assert not Job.objects.exists()
    assert client.post("/jobs/new/", {**form, "max_restarts": "2"}).status_code == 302
    job = Job.objects.get()
    assert (job.max_restarts, job.max_runtime_s) == (2, 7200)
    detail = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "0 of 2 used" in detail and "2 h (7200 s) since the first start" in detail


def test_a_tenant_cannot_see_or_change_another_tenants_limits(
    token_client: Callable[[Any], APIClient], alice: Any, bob: Any, limited: Tenant
) -> None:
    job_id = token_client(alice).post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    b = token_client(bob)
    assert b.get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert b.patch(f"/api/v1/jobs/{job_id}/", {"max_restarts": 0}, format="json").status_code == 404
    assert Job.objects.get(pk=job_id).max_restarts == 1
    [own] = b.get("/api/v1/tenants/").json()["results"]
    assert own["slug"] == "globex" and own["max_restarts_ceiling"] is None
    assert b.get(f"/api/v1/tenants/{limited.slug}/").status_code == 404
    mine = token_client(alice).get(f"/api/v1/tenants/{limited.slug}/").json()
    assert (mine["default_max_restarts"], mine["max_runtime_ceiling_s"]) == (1, 7200)
    # Tenants' limits are the cluster admins' to set: a member's PATCH is refused.
    refused = token_client(alice).patch(
        f"/api/v1/tenants/{limited.slug}/", {"max_restarts_ceiling": 100}, format="json"
    )
    assert refused.status_code == 403
    limited.refresh_from_db()
    assert limited.max_restarts_ceiling == 3


@pytest.mark.parametrize(
    "fields",
    [
        {"default_max_restarts": 5, "max_restarts_ceiling": 3},
        {"default_max_runtime_s": 7200, "max_runtime_ceiling_s": 3600},
        {"default_max_runtime_s": 0},
        {"max_runtime_ceiling_s": 0},
    ],
)
def test_a_tenant_default_above_its_ceiling_is_refused(
    acme: Tenant, fields: dict[str, int]
) -> None:
    """The admin form validates the model's constraints; the database holds them too."""
    for name, value in fields.items():
        setattr(acme, name, value)
    with pytest.raises(ValidationError):
        acme.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        Tenant.objects.filter(pk=acme.pk).update(**fields)
    acme.refresh_from_db()
    assert (acme.default_max_restarts, acme.default_max_runtime_s) == (0, None)
