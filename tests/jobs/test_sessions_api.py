"""The sessions API and lifecycle on the real database: start (the portal's empty bundle,
tenant defaults and ceilings), list and get scoped to the user's tenants (404 otherwise),
stop, and idle culling of a session a real tick placed; the lifetime through the run-time
limit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from bundles.models import CodeBundle
from control.tick import run_tick
from jobs.choices import JobKind, JobState, Launcher
from jobs.models import Job, JobEvent
from jobs.session_bundle import empty_archive
from jobs.session_cull import cull_idle_sessions
from jobs.sessions import note_activity
from tenancy.models import Role, Tenant
from tests.jobs.control_helpers import demo_cluster, drain_all
from workers.program import LAUNCHERS

needs_agent_launcher = pytest.mark.skipif(
    "session" not in LAUNCHERS,
    reason="the agents' command schema does not know launcher 'session' yet (workers.program)",
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]

URL = "/api/v1/sessions/"


@pytest.fixture
def owner_client(acme: Tenant, token_client: Callable[[Any], Any]) -> Any:
    from django.contrib.auth import get_user_model

    return token_client(get_user_model().objects.get(username="acme-owner"))


def start(client: Any, **body: Any) -> Any:
    return client.post(URL, {"tenant": "acme", **body}, format="json")


def test_a_session_starts_as_a_fixed_size_job_on_the_empty_bundle(owner_client: Any) -> None:
    demo_cluster()
    res = start(owner_client, gpus=2, priority="high")
    assert res.status_code == 201, res.content
    body = res.json()
    job = Job.objects.get(pk=body["id"])
    assert (job.kind, job.launcher, job.entrypoint) == (JobKind.SESSION, Launcher.SESSION, "lab")
    assert (job.gpus, job.min_gpus, job.max_gpus, job.priority) == (2, 2, 2, 90)
    assert job.state == JobState.QUEUED
    assert body["idle_timeout_s"] == 3600 and body["max_lifetime_s"] == 12 * 3600
    assert body["lab_url"] == f"/sessions/{job.pk}/lab-open/"
    assert job.code is not None and job.code.files == [
        {"path": "README.md", "size": job.code.files[0]["size"]}
    ]
    again = start(owner_client).json()
    assert again["code"] == body["code"]  # the same bytes, stored once per tenant
    assert CodeBundle.objects.filter(tenant__slug="acme").count() == 1
    assert empty_archive() == empty_archive()
    assert AuditEntry.objects.filter(action="job.submit", object_id=str(job.pk)).exists()


@pytest.mark.parametrize(
    ("field", "value"), [("idle_timeout_s", 86401), ("max_lifetime_s", 7 * 86400 + 1)]
)
def test_values_above_the_tenants_ceiling_are_refused_naming_the_field(
    owner_client: Any, field: str, value: int
) -> None:
    demo_cluster()
    res = start(owner_client, **{field: value})
    assert res.status_code == 400
    assert field in res.json()["errors"] or field in str(res.json())
    assert not Job.objects.exists()


def test_a_lowered_ceiling_and_bad_values_are_refused(owner_client: Any, acme: Tenant) -> None:
    demo_cluster()
    Tenant.objects.filter(pk=acme.pk).update(default_session_idle_s=600, session_idle_ceiling_s=900)
    assert start(owner_client, idle_timeout_s=901).status_code == 400
    assert start(owner_client, idle_timeout_s=900).status_code == 201
    for bad in ({"lab_access": "world"}, {"gpus": 0}, {"gpus": 9}, {"code": "x"}, {"extra": 1}):
        assert start(owner_client, **bad).status_code == 400, bad
    assert Job.objects.count() == 1


def test_another_tenants_user_gets_404_on_get_and_stop(
    owner_client: Any, bob: Any, token_client: Callable[[Any], Any]
) -> None:
    demo_cluster()
    session = start(owner_client).json()
    stranger = token_client(bob)
    assert stranger.get(f"{URL}{session['id']}/").status_code == 404
    assert stranger.post(f"{URL}{session['id']}/stop/", {}, format="json").status_code == 404
    assert stranger.get(URL).json()["results"] == []
    assert Job.objects.get(pk=session["id"]).state == JobState.QUEUED


def test_list_holds_sessions_only_and_stop_ends_one(
    owner_client: Any, acme: Tenant, alice: Any, token_client: Callable[[Any], Any]
) -> None:
    demo_cluster()
    owner_client.post(
        "/api/v1/jobs/",
        {"tenant": "acme", "name": "b", "workload": "mlp-digits", "gpus": 1},
        format="json",
    )
    session = start(owner_client).json()
    listed = owner_client.get(URL).json()["results"]
    assert [s["id"] for s in listed] == [session["id"]]
    # A fellow member may see it but not stop a creator-only session; its creator may.
    fellow = token_client(alice)
    assert fellow.get(f"{URL}{session['id']}/").status_code == 200
    assert fellow.post(f"{URL}{session['id']}/stop/", {}, format="json").status_code == 403
    res = owner_client.post(f"{URL}{session['id']}/stop/", {}, format="json")
    assert res.status_code == 200 and res.json()["state"] == JobState.CANCELLED
    again = owner_client.post(f"{URL}{session['id']}/stop/", {}, format="json")
    assert again.status_code == 409


@needs_agent_launcher
def test_an_idle_session_placed_by_a_real_tick_is_culled(owner_client: Any) -> None:
    nodes = demo_cluster()
    session = start(owner_client, gpus=2, idle_timeout_s=60).json()
    run_tick(policy="elastic-tiresias")
    job = Job.objects.get(pk=session["id"])
    assert job.state == JobState.RUNNING and job.parallelism == 2
    drain_all(nodes)
    started = job.started_at
    assert started is not None
    assert cull_idle_sessions(started + timedelta(seconds=59)) == []
    note_activity(job.pk, started + timedelta(seconds=50))  # a request through the proxy
    assert cull_idle_sessions(started + timedelta(seconds=100)) == []  # 50 s idle only
    assert cull_idle_sessions(started + timedelta(seconds=111)) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.parallelism == 0
    assert not job.gpu_slots.exists()
    last = JobEvent.objects.filter(job=job).last()
    assert last is not None and last.reason == "idle for 60 s: culled"
    stops = [c for cmds in drain_all(nodes).values() for c in cmds if c["type"] == "stop_job"]
    assert stops and all(c["reason"] == "idle for 60 s: culled" for c in stops)
    assert cull_idle_sessions(started + timedelta(hours=1)) == []


@needs_agent_launcher
def test_the_lifetime_is_the_run_time_limit(owner_client: Any) -> None:
    demo_cluster()
    session = start(owner_client, max_lifetime_s=120, idle_timeout_s=3600).json()
    run_tick(policy="elastic-tiresias")
    job = Job.objects.get(pk=session["id"])
    assert job.state == JobState.RUNNING and job.started_at is not None
    run_tick(policy="elastic-tiresias", now=job.started_at + timedelta(seconds=121))
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED  # the end it was started with, not a failure
    assert job.failure_reason == ""
    assert "lifetime 120 s reached" in job.events.latest("pk").reason


def test_a_viewer_may_not_start_a_session(
    acme: Tenant, make_user: Callable[..., Any], token_client: Callable[[Any], Any]
) -> None:
    demo_cluster()
    viewer = token_client(make_user("vera", acme, Role.VIEWER))
    assert start(viewer).status_code in (403, 400)
    assert not Job.objects.exists()
    assert timezone.now()  # the clock the services use is the real one


def test_batch_routes_refuse_the_session_launcher_and_session_changes(
    owner_client: Any, acme: Tenant
) -> None:
    demo_cluster()
    bad = owner_client.post(
        "/api/v1/jobs/",
        {"tenant": "acme", "name": "x", "code": "0" * 64, "entrypoint": "a.py",
         "launcher": "session", "gpus": 1},
        format="json",
    )  # fmt: skip
    assert bad.status_code == 400 and "launcher" in bad.json()["errors"]
    session = start(owner_client, gpus=2).json()
    url = f"/api/v1/jobs/{session['id']}/"
    for change in ({"max_gpus": 4}, {"min_gpus": 1}, {"max_runtime_s": 7 * 86400 + 1}):
        res = owner_client.patch(url, change, format="json")
        assert res.status_code == 400, change
        assert next(iter(change)) in res.json()["errors"]
    ok = owner_client.patch(url, {"priority": 80, "max_runtime_s": 3600}, format="json")
    assert ok.status_code == 200 and ok.json()["max_runtime_s"] == 3600
    job = Job.objects.get(pk=session["id"])
    assert (job.min_gpus, job.max_gpus, job.priority) == (2, 2, 80)


def test_the_beat_task_culls_by_the_clock(owner_client: Any) -> None:
    from jobs.session_tasks import cull_sessions

    nodes = demo_cluster()
    idle = start(owner_client, gpus=1, idle_timeout_s=60).json()
    busy = start(owner_client, gpus=1, idle_timeout_s=60).json()
    run_tick(policy="elastic-tiresias")
    drain_all(nodes)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.RUNNING}
    long_ago = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(pk__in=[idle["id"], busy["id"]]).update(started_at=long_ago)
    note_activity(busy["id"], timezone.now())  # someone typed in it just now
    assert cull_sessions() == [idle["id"]]
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {idle["id"]: JobState.CANCELLED, busy["id"]: JobState.RUNNING}


def test_an_admin_who_is_no_member_may_close_but_not_open(
    owner_client: Any, make_user: Callable[..., Any], token_client: Callable[[Any], Any]
) -> None:
    from django.http import Http404

    from jobs.sessions import lab_job

    demo_cluster()
    session = start(owner_client, lab_access="tenant").json()
    admin = make_user("root", staff=True)
    with pytest.raises(Http404):
        lab_job(admin, session["id"])
    assert owner_client.get(URL, {"state": "queued,nonsense"}).status_code == 400
    assert [s["id"] for s in owner_client.get(URL, {"state": "queued"}).json()["results"]] == [
        session["id"]
    ]
    res = token_client(admin).post(f"{URL}{session['id']}/stop/", {}, format="json")
    assert res.status_code == 200 and res.json()["state"] == JobState.CANCELLED
    assert AuditEntry.objects.filter(action="job.cancel", object_id=str(session["id"])).exists()


def test_a_session_on_the_tenants_own_code(owner_client: Any, acme: Tenant) -> None:
    from django.contrib.auth import get_user_model

    from tests.jobs.test_programs import bundle_of

    demo_cluster()
    owner = get_user_model().objects.get(username="acme-owner")
    files = {"nb.py": b"x = 1\n", "requirements.txt": b"einops==0.8.1\n"}
    bundle = bundle_of(owner, acme, files)
    res = start(owner_client, code=bundle.sha256, environment={"requirements": ["rich"]})
    assert res.status_code == 201, res.content
    job = Job.objects.get(pk=res.json()["id"])
    assert job.code_id == bundle.pk and job.entrypoint == "lab"
    # The job keeps its own requirements; the agent installs the bundle's first.
    assert job.environment["requirements"] == ["rich"]
    missing = start(owner_client, code="f" * 64)
    assert missing.status_code == 400 and "code" in missing.json()["errors"]


def test_a_session_holds_its_tenants_quota_like_any_job(owner_client: Any, acme: Tenant) -> None:
    nodes = demo_cluster()
    Tenant.objects.filter(pk=acme.pk).update(gpu_quota=2)
    session = start(owner_client, gpus=2).json()
    run_tick(policy="elastic-tiresias")
    drain_all(nodes)
    batch = owner_client.post(
        "/api/v1/jobs/",
        {"tenant": "acme", "name": "b", "workload": "mlp-digits", "gpus": 1},
        format="json",
    ).json()
    run_tick(policy="elastic-tiresias")
    drain_all(nodes)
    job, waiting = Job.objects.get(pk=session["id"]), Job.objects.get(pk=batch["id"])
    assert job.state == JobState.RUNNING and waiting.state == JobState.QUEUED
    assert "quota" in waiting.wait_reason
    listed = owner_client.get("/api/v1/jobs/").json()["results"]
    assert {j["id"]: j["kind"] for j in listed} == {job.pk: "session", waiting.pk: "batch"}
