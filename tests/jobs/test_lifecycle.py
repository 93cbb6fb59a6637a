"""The job lifecycle: allowed transitions, timestamps, parallelism and the event history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from control.endings import accrue_service
from devtools.job_steps import move
from jobs.choices import ALLOWED_TRANSITIONS, EventKind, JobState, can_transition
from jobs.lifecycle import Batch, record, save_fields, transition, update_jobs
from jobs.models import Job
from jobs.services import (
    JobConflictError,
    JobValidationError,
    check_job_spec,
    do_set_parallelism,
    do_submit_job,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued_job(alice: Any, acme: Any) -> Job:
    spec = check_job_spec(
        tenant=acme, data={"name": "t", "workload": "mlp-digits", "gpus": 2, "max_gpus": 4}
    )
    return do_submit_job(user=alice, tenant=acme, spec=spec)


def _accrue(job: Job, *, seconds: tuple[float, ...]) -> Job:
    """Account service as progress reports do, ``seconds`` apart (at the job's parallelism)."""
    at = job.last_service_at = timezone.now()
    for step in seconds:
        at += timedelta(seconds=step)
        accrue_service(job, at)
    save_fields(job, "attained_gpu_seconds", "last_service_at")
    return Job.objects.get(pk=job.pk)


ALL_PAIRS = [(a, b) for a in JobState.values for b in JobState.values if a != b]


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS)
def test_transition_table(source: str, target: str) -> None:
    expected = target in ALLOWED_TRANSITIONS[source]
    assert can_transition(source, target) is expected


def test_full_elastic_life(queued_job: Job) -> None:
    job = move(job_id=queued_job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=2)
    assert job.started_at is not None and job.parallelism == 2
    first_start = job.started_at
    job = move(job_id=job.pk, to_state=JobState.SCALING, reason="scale out")
    job = do_set_parallelism(job_id=job.pk, parallelism=4, reason="idle GPUs")
    job = move(job_id=job.pk, to_state=JobState.RUNNING, reason="switched")
    job = move(job_id=job.pk, to_state=JobState.QUEUED, reason="preempted by LAS")
    assert job.parallelism == 0
    job = move(job_id=job.pk, to_state=JobState.RUNNING, reason="resumed", parallelism=1)
    assert job.started_at == first_start  # first start is kept
    job = _accrue(job, seconds=(60.0, 60.0))  # one GPU for two minutes of reports
    job = move(job_id=job.pk, to_state=JobState.COMPLETED, reason="done")
    assert job.finished_at is not None and job.parallelism == 0
    assert job.attained_gpu_seconds == 120.0
    history = list(job.events.values_list("kind", "to_state", "to_parallelism"))
    assert history == [
        ("submitted", "pending", None),
        ("state", "queued", 0),
        ("state", "running", 2),
        ("state", "scaling", 2),
        ("scaled", "", 4),
        ("state", "running", 4),
        ("preempted", "queued", 0),
        ("state", "running", 1),
        ("state", "completed", 0),
    ]


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ([], JobState.COMPLETED),  # queued → completed
        ([], JobState.SCALING),
        ([JobState.CANCELLED], JobState.RUNNING),  # terminal is terminal
        ([JobState.RUNNING, JobState.COMPLETED], JobState.RUNNING),
        ([JobState.RUNNING, JobState.FAILED], JobState.QUEUED),
    ],
)
def test_nonsense_transitions_are_refused(queued_job: Job, path: list[str], bad: str) -> None:
    for state in path:
        move(job_id=queued_job.pk, to_state=state, reason="setup", parallelism=1)
    before = Job.objects.get(pk=queued_job.pk)
    events = before.events.count()
    with pytest.raises(JobConflictError):
        move(job_id=queued_job.pk, to_state=bad, reason="nonsense")
    after = Job.objects.get(pk=queued_job.pk)
    assert after.state == before.state and after.events.count() == events


def test_parallelism_only_for_running_jobs(queued_job: Job) -> None:
    with pytest.raises(JobConflictError):
        do_set_parallelism(job_id=queued_job.pk, parallelism=2, reason="x")
    move(job_id=queued_job.pk, to_state=JobState.RUNNING, reason="x", parallelism=2)
    with pytest.raises(JobValidationError):
        do_set_parallelism(job_id=queued_job.pk, parallelism=0, reason="x")
    job = Job.objects.get(pk=queued_job.pk)
    assert _accrue(job, seconds=(-30.0,)).attained_gpu_seconds == 0  # service only grows
    with pytest.raises(JobValidationError):
        move(job_id=queued_job.pk, to_state="exploded", reason="x")


def _submitted(alice: Any, acme: Any, count: int) -> list[Job]:
    spec = check_job_spec(
        tenant=acme, data={"name": "b", "workload": "mlp-digits", "gpus": 1, "max_gpus": 2}
    )
    return [do_submit_job(user=alice, tenant=acme, spec=spec) for _ in range(count)]


def test_a_batch_writes_what_single_transitions_write(alice: Any, acme: Any) -> None:
    """Batch.transition/save_fields/record leave the rows one transition each would leave."""
    now = timezone.now()
    single, batched = _submitted(alice, acme, 3), _submitted(alice, acme, 3)
    for job in single:
        job.allocation = {"job": f"job-{job.pk}", "gpus": [0], "leaves": [0]}
        job.wait_reason = ""
        transition(job, JobState.RUNNING, reason="placed", at=now, parallelism=1)
        record(job, EventKind.NOTE, now, reason="a note", data={"from": [], "to": [0]})
    batch = Batch()
    for job in batched:
        job.allocation = {"job": f"job-{job.pk}", "gpus": [0], "leaves": [0]}
        job.wait_reason = ""
        batch.transition(
            job,
            JobState.RUNNING,
            reason="placed",
            at=now,
            parallelism=1,
            fields=("allocation", "wait_reason"),
        )
        batch.record(job, EventKind.NOTE, now, reason="a note", data={"from": [], "to": [0]})
    assert all(Job.objects.get(pk=j.pk).state == JobState.QUEUED for j in batched)  # not yet
    with CaptureQueriesContext(connection) as queries:
        batch.flush()
    # On PostgreSQL the jobs' UPDATE and the events' INSERT go as one statement; elsewhere two.
    assert len(queries) == (1 if connection.vendor == "postgresql" else 2)

    def row(job: Job) -> tuple[Any, ...]:
        fresh = Job.objects.get(pk=job.pk)
        events = [
            (
                e.kind,
                e.from_state,
                e.to_state,
                e.from_parallelism,
                e.to_parallelism,
                e.reason,
                e.data,
            )
            for e in fresh.events.order_by("id")
        ]
        return (
            fresh.state,
            fresh.parallelism,
            fresh.started_at,
            fresh.finished_at,
            fresh.wait_reason,
            fresh.allocation["gpus"],
            fresh.updated_at > job.submitted_at,
            events,
        )

    for one, many in zip(single, batched, strict=True):
        assert row(one) == row(many)


def test_a_batch_refuses_what_a_transition_refuses(alice: Any, acme: Any) -> None:
    (job,) = _submitted(alice, acme, 1)
    batch = Batch()
    with pytest.raises(JobConflictError):
        batch.transition(job, JobState.COMPLETED, reason="never ran", at=timezone.now())
    with pytest.raises(ValueError):
        batch.save_fields(job, "state")
    with pytest.raises(ValueError):  # the same job as a second object would lose a write
        batch.save_fields(Job.objects.get(pk=job.pk), "wait_reason")
        batch.save_fields(Job.objects.get(pk=job.pk), "wait_reason")
    batch.flush()
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_update_jobs_writes_every_kind_of_value_as_a_save_would(alice: Any, acme: Any) -> None:
    """Times to the microsecond, nested JSON, None, quotes and non-ASCII text, floats.

    The PostgreSQL path sends the rows as one JSON document; a float JSON
    cannot carry (infinity) goes by the per-column arrays instead, to the same rows.
    """
    saved, batched = _submitted(alice, acme, 2), _submitted(alice, acme, 2)
    at = timezone.now().replace(microsecond=123456)
    names = ("wait_reason", "last_service_at", "finished_at", "allocation", "throughput_curve")
    names += ("attained_gpu_seconds", "samples_per_s", "generation")
    for index, job in enumerate(saved + batched):
        job.wait_reason = 'waits for "8" GPUs — ünïcode, \\ and \n' if index % 2 else ""
        job.last_service_at = at
        job.finished_at = None
        job.allocation = {"gpus": [3, 1], "nested": {"x": [None, 1.5], "y": '\u00e9"}'}}
        job.throughput_curve = {} if index % 2 else {"1": 10.0, "2": [19.5, None]}
        job.attained_gpu_seconds = 12.25
        job.samples_per_s = float("inf") if index % 2 else 0.1 + 0.2
        job.generation = 7
    for job in saved:
        job.save(update_fields=list(names))
    update_jobs(batched[:1], names)  # finite values: one JSON document
    update_jobs(batched[1:], names)  # infinity: the arrays
    for one, other in zip(saved, batched, strict=True):
        mine = Job.objects.filter(pk=one.pk).values(*names).get()
        theirs = Job.objects.filter(pk=other.pk).values(*names).get()
        assert mine == theirs
        assert theirs["last_service_at"] == at
