"""Retention deletes expired artifacts and logs and nothing else; finished jobs' Redis keys go.

A fake clock (``now``) stands weeks after a set of jobs of two tenants, one
of which keeps things for fewer days than the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from control.reports import handle_report
from devtools.job_steps import move
from jobs.choices import EventKind
from jobs.expiry import expire_outputs
from jobs.models import Artifact, Job, LogChunk, LogStream
from jobs.retention import RetentionPolicy, StoredOutput, policy_for, select_expired
from tests.jobs.outputs_helpers import file_store, put_object, stored, submit
from workers.artifacts import ArtifactStore
from workers.elastic.keys import JobKeys
from workers.protocol import LogLines

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
OUTPUTS = {
    "checkpoints/step-000000010.pt": "checkpoint",
    "checkpoints/step-000000020.pt": "final",
    "artifacts/model.onnx": "user",
    "logs/job.log": "log",
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Path, ArtifactStore]]:
    root, settings_override, artifact_store = file_store(tmp_path)
    with settings_override, override_settings(ARTIFACT_RETENTION_DAYS=30, LOG_RETENTION_DAYS=30):
        yield root, artifact_store


def make_job(
    user: Any, tenant: Any, root: Path, name: str, ended_days_ago: float | None, state: str
) -> Job:
    """A job with every kind of output in the store, its rows and stored log lines."""
    job = submit(user, tenant, name)
    if state != "queued":
        move(job_id=job.pk, to_state="running", reason="placed", parallelism=1, at=NOW - 60 * DAY)
    for path, kind in OUTPUTS.items():
        data = f"{name}:{path}".encode()
        put_object(root, job, path, data)
        step = int(path[-12:-3]) if path.endswith(".pt") else None
        assert stored(job, path, data, kind=kind, step=step) == "artifact"
    put_object(root, job, "checkpoints/step-000000010.json", b"{}")  # a manifest
    put_object(root, job, "checkpoints/ddp.pt", b"a torchrun program's own")  # no row
    report = LogLines(
        node="node-0", job=f"job-{job.pk}", worker_id="w0", log_id="l0", offset=0, text="hi\n"
    )
    assert handle_report(report.to_dict()) == "log"
    if ended_days_ago is not None:
        move(job_id=job.pk, to_state=state, reason="over", at=NOW - ended_days_ago * DAY)
    return job


@dataclass
class Fleet:
    acme_old: Job  # acme keeps artifacts 7 days, logs 3: everything expired
    acme_recent: Job  # 5 days: artifacts kept, log expired
    acme_running: Job
    globex_old: Job  # cluster: 30 days; ended 40 days ago: everything expired
    globex_mid: Job  # ended 10 days ago: everything kept
    globex_queued: Job


@pytest.fixture
def fleet(store: tuple[Path, ArtifactStore], alice: Any, bob: Any, acme: Any, globex: Any) -> Fleet:
    root, _ = store
    acme.artifact_retention_days = 7
    acme.log_retention_days = 3
    acme.save()
    return Fleet(
        acme_old=make_job(alice, acme, root, "a-old", 10, "completed"),
        acme_recent=make_job(alice, acme, root, "a-recent", 5, "failed"),
        acme_running=make_job(alice, acme, root, "a-running", None, "running"),
        globex_old=make_job(bob, globex, root, "g-old", 40, "cancelled"),
        globex_mid=make_job(bob, globex, root, "g-mid", 10, "completed"),
        globex_queued=make_job(bob, globex, root, "g-queued", None, "queued"),
    )


def objects(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def everything_of(job: Job) -> set[str]:
    prefix = f"tenants/{job.tenant.slug}/jobs/{job.pk}/"
    return {prefix + p for p in [*OUTPUTS, "checkpoints/step-000000010.json", "checkpoints/ddp.pt"]}


def test_deletes_expired_artifacts_and_logs_and_nothing_else(
    fleet: Fleet, store: tuple[Path, ArtifactStore]
) -> None:
    root, _ = store
    before = objects(root)
    result = expire_outputs(now=NOW, redis_url=settings.REDIS_URL)

    recent_prefix = f"tenants/acme/jobs/{fleet.acme_recent.pk}/"
    gone = (
        everything_of(fleet.acme_old)
        | everything_of(fleet.globex_old)
        | {recent_prefix + "logs/job.log"}
    )
    assert objects(root) == before - gone
    remaining_rows = set(Artifact.objects.values_list("path", flat=True))
    assert remaining_rows == {p for p in before - gone if not p.endswith((".json", "ddp.pt"))}
    assert (result.artifacts, result.errors) == (2 * 4 + 1, 0)
    assert result.bytes == sum(
        len(f"{job.name}:{path}".encode())
        for job in (fleet.acme_old, fleet.globex_old)
        for path in OUTPUTS
    ) + len(b"a-recent:logs/job.log")

    with_lines = set(LogChunk.objects.values_list("job_id", flat=True))
    assert with_lines == {fleet.acme_running.pk, fleet.globex_mid.pk, fleet.globex_queued.pk}
    assert set(LogStream.objects.values_list("job_id", flat=True)) == with_lines

    expired = Job.objects.filter(events__kind=EventKind.EXPIRED)
    reasons = dict(expired.values_list("pk", "events__reason"))
    old_bytes = sum(len(f"a-old:{p}".encode()) for p in OUTPUTS if p != "logs/job.log")
    assert reasons == {
        fleet.acme_old.pk: f"expired 3 artifacts ({old_bytes} bytes); removed 1 other files "
        "of the job; expired the log (retention)",
        fleet.globex_old.pk: reasons[fleet.globex_old.pk],
        fleet.acme_recent.pk: "expired the log (retention)",
    }
    assert reasons[fleet.globex_old.pk].startswith("expired 3 artifacts (")

    again = expire_outputs(now=NOW, redis_url=settings.REDIS_URL)
    assert (again.artifacts, again.logs) == (0, 0)
    assert Job.objects.filter(events__kind=EventKind.EXPIRED).count() == 3


def test_a_store_error_keeps_the_row_for_the_next_run(
    fleet: Fleet, store: tuple[Path, ArtifactStore]
) -> None:
    root, real = store
    broken = f"tenants/acme/jobs/{fleet.acme_old.pk}/artifacts/model.onnx"

    class Flaky(ArtifactStore):
        def delete(self, rel: str) -> None:
            if rel == broken:
                raise OSError("store unreachable")
            super().delete(rel)

    result = expire_outputs(now=NOW, store=Flaky(real.url), redis_url=settings.REDIS_URL)
    assert result.errors == 1
    assert result.artifacts == 2 * 4 + 1 - 1
    assert Artifact.objects.filter(path=broken).exists()
    assert broken in objects(root)
    later = expire_outputs(now=NOW, redis_url=settings.REDIS_URL)
    assert (later.artifacts, later.errors) == (1, 0)
    assert not Artifact.objects.filter(path=broken).exists()


def test_a_run_deletes_at_most_one_batch(fleet: Fleet) -> None:
    result = expire_outputs(now=NOW, batch=3, redis_url=settings.REDIS_URL)
    assert (result.artifacts, result.full) == (3, True)
    # the jobs that ended first go first
    assert Artifact.objects.filter(job=fleet.globex_old).count() == 1
    assert Artifact.objects.filter(job=fleet.acme_old).count() == 4


def test_policies_and_selection_are_pure() -> None:
    cluster = RetentionPolicy(artifact_days=30, log_days=30)
    assert policy_for(None, 3, artifact_default=30, log_default=30) == RetentionPolicy(30, 3)
    rows = [
        StoredOutput(1, tenant_id=1, job_id=1, kind="user", size=1, job_ended_at=NOW - 31 * DAY),
        StoredOutput(2, tenant_id=1, job_id=2, kind="log", size=1, job_ended_at=NOW - 4 * DAY),
        StoredOutput(3, tenant_id=2, job_id=3, kind="log", size=1, job_ended_at=NOW - 4 * DAY),
        StoredOutput(4, tenant_id=2, job_id=4, kind="final", size=1, job_ended_at=None),
        StoredOutput(5, tenant_id=2, job_id=5, kind="final", size=1, job_ended_at=NOW - 40 * DAY),
    ]
    policies = {1: RetentionPolicy(30, 3)}
    assert [o.id for o in select_expired(rows, policies, cluster, NOW, 10)] == [5, 1, 2]
    assert [o.id for o in select_expired(rows, policies, cluster, NOW, 1)] == [5]


@pytest.fixture
def coordination() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    for key in client.scan_iter(match="edl:job-*"):
        client.delete(key)


def test_finished_jobs_coordination_keys_go_once_a_few_minutes_after_the_end(
    alice: Any, acme: Any, coordination: redis.Redis
) -> None:
    done = submit(alice, acme, "done")
    fresh = submit(alice, acme, "fresh")
    running = submit(alice, acme, "running")
    for job in (done, fresh, running):
        move(job_id=job.pk, to_state="running", reason="placed", parallelism=1, at=NOW - DAY)
        keys = JobKeys(f"job-{job.pk}")
        coordination.hset(keys.meta, "state", "x")
        coordination.xadd(keys.events, {"kind": "progress"})
    move(job_id=done.pk, to_state="completed", reason="over", at=NOW - timedelta(minutes=10))
    move(job_id=fresh.pk, to_state="failed", reason="over", at=NOW - timedelta(minutes=1))

    result = expire_outputs(now=NOW, redis_url=settings.REDIS_URL)
    assert result.coordination == 1

    def keys_of(job: Job) -> list[bytes]:
        return list(coordination.scan_iter(match=JobKeys(f"job-{job.pk}").prefix + "*"))

    assert keys_of(done) == []
    assert len(keys_of(fresh)) == 2 and len(keys_of(running)) == 2
    done.refresh_from_db()
    assert done.coordination_cleaned_at == NOW
    assert Job.objects.filter(coordination_cleaned_at__isnull=False).count() == 1
    later = expire_outputs(now=NOW + timedelta(minutes=10), redis_url=settings.REDIS_URL)
    assert later.coordination == 1  # the one that ended a minute ago, now; done stays done
    assert keys_of(fresh) == [] and len(keys_of(running)) == 2


def test_an_admin_sets_a_tenants_retention_days(client: Any, make_user: Any, acme: Any) -> None:
    admin = make_user("root", staff=True)
    admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    url = f"/admin/tenancy/tenant/{acme.pk}/change/"
    page = client.get(url).content.decode()
    assert 'name="artifact_retention_days"' in page and 'name="log_retention_days"' in page
    form = {
        "slug": "acme",
        "name": acme.name,
        "gpu_quota": 8,
        "max_queued_jobs": 100,
        "default_max_restarts": 0,
        "priority_weight": 1.0,
        "profile_jobs": "on",
        "artifact_retention_days": "7",
        "log_retention_days": "",
        # The page shows every setting with its value; a browser sends them all back.
        "default_session_idle_s": acme.default_session_idle_s,
        "session_idle_ceiling_s": acme.session_idle_ceiling_s,
        "default_session_lifetime_s": acme.default_session_lifetime_s,
        "session_lifetime_ceiling_s": acme.session_lifetime_ceiling_s,
        "session_home_quota_mib": acme.session_home_quota_mib,
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
    }
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    acme.refresh_from_db()
    assert (acme.artifact_retention_days, acme.log_retention_days) == (7, None)
