"""``utilities.bulk_rows``: rows written from one JSON document are the rows Django writes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.choices import EventKind
from jobs.models import Job, JobEvent
from jobs.services import check_job_spec, do_submit_job
from utilities import bulk_rows

pytestmark = pytest.mark.django_db

HOSTILE = '\'; DROP TABLE jobs_job; -- "quoted" \\ ünï\ncode'


def _events(job: Job, at: Any) -> list[JobEvent]:
    return [
        JobEvent(job=job, at=at, kind=EventKind.NOTE, reason=HOSTILE, data={"x": [None, 1.5]}),
        JobEvent(job=job, at=at, kind=EventKind.NOTE, from_parallelism=None, to_parallelism=3),
        JobEvent(job=job, at=at, kind=EventKind.NOTE, data={"nested": {"inf": "Infinity"}}),
    ]


def _rows(ids: list[int]) -> list[tuple[Any, ...]]:
    fields = ("at", "kind", "from_parallelism", "to_parallelism", "reason", "data")
    return [JobEvent.objects.filter(pk=pk).values_list(*fields).get() for pk in ids]


def test_bulk_create_writes_the_rows_django_writes_and_sets_their_keys(
    alice: Any, acme: Any
) -> None:
    spec = check_job_spec(tenant=acme, data={"name": "b", "workload": "mlp-digits", "gpus": 1})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    at = timezone.now().replace(microsecond=654321)
    ours, django = _events(job, at), _events(job, at)
    with CaptureQueriesContext(connection) as queries:
        bulk_rows.bulk_create(JobEvent, ours)
    assert len(queries) == 1
    JobEvent.objects.bulk_create(django)
    assert all(event.pk is not None and not event._state.adding for event in ours)
    assert _rows([e.pk for e in ours]) == _rows([e.pk for e in django])
    assert Job.objects.filter(pk=job.pk).exists()  # the hostile text was only text


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the JSON path is PostgreSQL's")
def test_a_value_without_a_json_form_writes_nothing_and_says_so(alice: Any, acme: Any) -> None:
    spec = check_job_spec(tenant=acme, data={"name": "b", "workload": "mlp-digits", "gpus": 1})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    job.samples_per_s = float("nan")
    field = Job._meta.get_field("samples_per_s")
    assert bulk_rows.update_rows(Job, [job], [field]) is False
    assert Job.objects.get(pk=job.pk).samples_per_s is None
    job.samples_per_s = 2.5
    assert bulk_rows.update_rows(Job, [job], [field]) is True
    assert Job.objects.get(pk=job.pk).samples_per_s == 2.5


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the JSON path is PostgreSQL's")
def test_an_update_and_a_create_in_one_statement_write_what_the_two_write(
    alice: Any, acme: Any
) -> None:
    """A tick's jobs and their events: one round trip; an event JSON cannot carry writes
    nothing, and the caller writes the two apart."""
    spec = check_job_spec(tenant=acme, data={"name": "b", "workload": "mlp-digits", "gpus": 1})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    field = Job._meta.get_field("samples_per_s")
    at = timezone.now().replace(microsecond=123456)
    job.samples_per_s = 7.5
    update = bulk_rows.update_statement(Job, [job], [field])
    assert update is not None
    ours, django = _events(job, at), _events(job, at)
    with CaptureQueriesContext(connection) as queries:
        assert bulk_rows.update_then_create(update, JobEvent, ours) is True
    assert len(queries) == 1
    JobEvent.objects.bulk_create(django)
    assert Job.objects.get(pk=job.pk).samples_per_s == 7.5
    assert _rows([e.pk for e in ours]) == _rows([e.pk for e in django])
    job.samples_per_s = 1.0
    update = bulk_rows.update_statement(Job, [job], [field])
    assert update is not None
    bad = [JobEvent(job=job, at=at, kind=EventKind.NOTE, data={"x": float("nan")})]
    before = JobEvent.objects.count()
    assert bulk_rows.update_then_create(update, JobEvent, bad) is False
    assert Job.objects.get(pk=job.pk).samples_per_s == 7.5 and JobEvent.objects.count() == before
