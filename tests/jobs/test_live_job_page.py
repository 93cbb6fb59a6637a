"""What the live job page reads from its snapshot (issue 19, item 5)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from devtools.job_steps import move
from jobs.artifacts import record_artifact
from jobs.choices import ArtifactKind, EventKind
from jobs.lifecycle import record
from jobs.live.snapshots import job_snapshot
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def submit(user: Any, tenant: Tenant) -> Job:
    data = {"name": "j", "workload": "mlp-digits", "gpus": 1, "max_gpus": 4, "args": {"epochs": 3}}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def test_history_names_what_happened(alice: Any, acme: Tenant) -> None:
    job = submit(alice, acme)
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=1)
    now = timezone.now()
    record(job, EventKind.PROFILED, now, reason="profiling throughput from 4 down to 1 GPUs")
    record(job, EventKind.PROFILED, now, reason="throughput profiled at 1 GPUs: 90/s")
    labels = [e["label"] for e in job_snapshot(job)["events"]]
    assert labels[-4:] == ["Queued", "Running", "Profiling started", "Throughput profiled"]
    assert "Running" in labels and "State changed" not in labels


def test_settings_card_fields_and_arguments_as_json(alice: Any, acme: Tenant) -> None:
    job = submit(alice, acme)
    snap = job_snapshot(job)
    assert snap["started_at"] is None and snap["finished_at"] is None
    assert (snap["min_gpus"], snap["max_gpus"], snap["restarts"]) == (1, 4, 0)
    assert json.loads(snap["args_json"])["epochs"] == 3
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=1)
    job.refresh_from_db()
    assert job_snapshot(job)["started_at"] == job.started_at.isoformat()


def test_a_completed_jobs_progress_ends_at_its_final_checkpoint(alice: Any, acme: Tenant) -> None:
    job = submit(alice, acme)
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=1)
    Job.objects.filter(pk=job.pk).update(step=40)
    record_artifact(
        job=job, kind=ArtifactKind.FINAL, job_path="checkpoints/final.pt", size=1,
        sha256="0" * 64, at=timezone.now(), step=57,
    )  # fmt: skip
    job.refresh_from_db()
    assert job_snapshot(job)["step"] == 40  # running: the last report
    move(job_id=job.pk, to_state="completed", reason="training finished at step 57")
    job.refresh_from_db()
    assert job_snapshot(job)["step"] == 57
