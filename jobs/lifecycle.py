"""The one door for a job's state: transitions, history events, live updates, tick requests.

Every change of a job's state goes through :func:`transition`, which checks
it against the lifecycle table (``jobs.choices``), saves the job and records
a :class:`~jobs.models.JobEvent`; :func:`record` adds any other event.
Browsers hear about a change through :func:`broadcast`, after the transaction
commits; :func:`request_tick` asks the control plane for a tick, also after
commit; a job that ends has its log exported to the artifact store
(:func:`export_log_on_commit`).  Services and the control plane call these; nothing else writes a
job's state or history.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field
from django.db.models.signals import post_save
from django.utils import timezone

from jobs.choices import TERMINAL_STATES, EventKind, JobState, can_transition
from jobs.errors import JobConflictError, JobValidationError
from jobs.live.patches import cluster_fields, page_fields, sample_row
from jobs.live.summary import note_job_event
from jobs.models import Job, JobEvent, JobMetric
from utilities import bulk_rows
from utilities.realtime import (
    CLUSTER_GROUP,
    Message,
    broadcast_on_commit,
    job_group,
    messages_on_commit,
    tenant_group,
)

log = logging.getLogger(__name__)

TICK_TASK = "control.scheduler_tick"
TICK_QUEUE = "tick"
"""The tick's own queue and worker: a backlog of agent reports never delays or expires a tick."""
EXPORT_LOG_TASK = "jobs.tasks.export_job_log"
EXPORT_LOG_DELAY_S = 15.0
"""How long after a job ends its log is exported: the agents' last lines may still come."""
TICK_DEBOUNCE_KEY = "portal:tick-requested"
REASON_MAX = 500


def job_payload(job: Job, kind: str) -> dict[str, Any]:
    """The small live-update message for a change of ``job``.

    A new job's event also carries what its dashboard row shows and never
    changes (name, workload, size, submission), so pages add the row without
    reloading their snapshot.
    """
    payload: dict[str, Any] = {
        "type": kind,
        "job": job.pk,
        "tenant": job.tenant_id,
        "state": job.state,
        "parallelism": job.parallelism,
        "attained_gpu_seconds": round(job.attained_gpu_seconds, 1),
        "step": job.step,
        "samples_per_s": None if job.samples_per_s is None else round(job.samples_per_s, 1),
    }
    if kind == "job.created":
        payload["row"] = {
            "name": job.name,
            "workload": job.runs,
            "gpus": job.gpus,
            "min_gpus": job.min_gpus,
            "max_gpus": job.max_gpus,
            "submitted_at": job.submitted_at.isoformat(),
            "url": f"/jobs/{job.pk}/",
        }
    return payload


def broadcast(job: Job, kind: str) -> None:
    """Tell the job's tenant, its page and the cluster view about ``job``, after commit.

    The page and the cluster view get what they show besides the row
    (``jobs.live.patches``), so they patch instead of reloading.  The tenant's new
    counts and queue positions follow in the same batch, built once per
    transaction (``jobs.live.summary``).
    """
    # The patches are built after commit (in the finisher thread) from a copy: the
    # caller may go on changing its object, the copy keeps the values committed.
    messages_on_commit(functools.partial(_job_messages, copy.copy(job), kind))
    note_job_event(tenant=job.tenant_id, kind=kind, state=job.state)


def _job_messages(job: Job, kind: str) -> list[Message]:
    """The three patches of one change of ``job``: its tenant's, its page's, the cluster view's."""
    payload = job_payload(job, kind)
    return [
        Message((tenant_group(job.tenant_id),), payload),
        Message((job_group(job.pk),), {**payload, **page_fields(job)}),
        Message((CLUSTER_GROUP,), {**payload, **cluster_fields(job)}),
    ]


def record(job: Job, kind: str, at: datetime, reason: str = "", **fields: Any) -> JobEvent:
    """Add one event to the job's history (reasons are cut to 500 characters)."""
    event = _event(job, kind, at, reason, **fields)
    event.save(force_insert=True)
    return event


def _enter(
    job: Job,
    to_state: str,
    *,
    reason: str,
    at: datetime,
    parallelism: int | None,
    kind: str | None,
) -> JobEvent:
    """Check and make ``job``'s move to ``to_state`` in memory; return its event, unsaved."""
    if to_state not in JobState.values:
        raise JobValidationError(f"unknown state {to_state!r}")
    if not can_transition(job.state, to_state):
        raise JobConflictError(f"a {job.state} job cannot become {to_state}")
    from_state, from_parallelism = job.state, job.parallelism
    job.state = to_state
    if to_state == JobState.RUNNING and job.started_at is None:
        job.started_at = at
    if to_state in TERMINAL_STATES:
        job.finished_at = at
        job.parallelism = 0
    elif to_state == JobState.QUEUED:
        job.parallelism = 0
    if parallelism is not None and to_state not in TERMINAL_STATES:
        job.parallelism = parallelism
    if to_state in TERMINAL_STATES:
        export_log_on_commit(job.pk)
    preempted = from_state in (JobState.RUNNING, JobState.SCALING) and to_state == JobState.QUEUED
    return _event(
        job,
        kind or (EventKind.PREEMPTED if preempted else EventKind.STATE),
        at,
        reason,
        from_state=from_state,
        to_state=to_state,
        from_parallelism=from_parallelism,
        to_parallelism=job.parallelism,
    )


def _event(job: Job, kind: str, at: datetime, reason: str, **fields: Any) -> JobEvent:
    return JobEvent(job=job, at=at, kind=kind, reason=reason[:REASON_MAX], **fields)


def transition(
    job: Job,
    to_state: str,
    *,
    reason: str,
    at: datetime,
    parallelism: int | None = None,
    kind: str | None = None,
) -> None:
    """Move ``job`` to ``to_state`` (saving the whole job) and record why.

    Refuses unknown states (``JobValidationError``) and transitions the
    lifecycle table does not allow (``JobConflictError``).  A job that leaves the
    GPUs (queued or terminal) holds no parallelism.  The event is a state change,
    or a preemption when a running job goes back to the queue, unless ``kind``
    names another (a retry after a failure is no preemption).
    """
    event = _enter(job, to_state, reason=reason, at=at, parallelism=parallelism, kind=kind)
    job.save()
    event.save(force_insert=True)


def save_fields(job: Job, *fields: str) -> None:
    """Persist the named fields of ``job`` that a service or the control plane just set.

    The single place a job's non-state fields are written (progress, curves,
    wait reason, logs); its state only changes through :func:`transition`.
    """
    if "state" in fields:
        raise ValueError("a job's state changes only through transition()")
    job.save(update_fields=list(fields))


def update_jobs(jobs: Sequence[Job], names: Sequence[str]) -> None:
    """Write the fields ``names`` of every job in ``jobs`` from the objects, in one statement.

    On PostgreSQL the rows go as one JSON document (``utilities.bulk_rows``);
    a value JSON cannot carry exactly (a float that is not finite) sends them
    as one array per column (``unnest``) instead.  Either is far cheaper than
    ``bulk_update``'s ``CASE`` of one ``WHEN`` per job and field, which costs
    milliseconds in Python for a handful of jobs and is what SQLite gets.
    Values are prepared by each field (``get_db_prep_save``), as a save would.
    """
    if not jobs or not names:
        return
    if connection.vendor != "postgresql":
        Job.objects.bulk_update(jobs, list(names), batch_size=500)
        return
    fields = _job_columns(names)
    if not bulk_rows.update_rows(Job, jobs, fields):
        _update_from_arrays(jobs, fields)


def _job_columns(names: Sequence[str]) -> list[Field[Any, Any]]:
    """The job's fields ``names``; ValueError for one that is not a column."""
    fields: list[Field[Any, Any]] = []
    for name in names:
        field = Job._meta.get_field(name)
        if not isinstance(field, Field) or not field.concrete:
            raise ValueError(f"{name!r} is not a column of the job")
        fields.append(field)
    return fields


def _update_jobs_and_create(
    jobs: Sequence[Job], names: Sequence[str], events: list[JobEvent]
) -> bool:
    """:func:`update_jobs` and the events' insert in one statement (PostgreSQL, values JSON
    carries exactly); False, having written nothing, otherwise."""
    if connection.vendor != "postgresql":
        return False
    update = bulk_rows.update_statement(Job, jobs, _job_columns(names))
    return update is not None and bulk_rows.update_then_create(update, JobEvent, events)


def _update_from_arrays(jobs: Sequence[Job], fields: Sequence[Field[Any, Any]]) -> None:
    """``update_jobs`` with one array per column (``unnest``): any value psycopg can send."""
    meta = Job._meta
    quote = connection.ops.quote_name
    table, key = quote(meta.db_table), quote(meta.pk.column)
    columns = [quote(field.column) for field in fields]
    arrays = [[job.pk for job in jobs]]
    types = [bulk_rows.column_type(meta.pk)]
    for field in fields:
        arrays.append(
            [field.get_db_prep_save(getattr(job, field.attname), connection) for job in jobs]
        )
        types.append(bulk_rows.column_type(field))
    sets = ", ".join(f"{column} = v.{column}" for column in columns)
    unnest = ", ".join(f"%s::{kind}[]" for kind in types)
    sql = (
        f"UPDATE {table} SET {sets} FROM unnest({unnest}) AS v({key}, {', '.join(columns)}) "
        f"WHERE {table}.{key} = v.{key}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, arrays)


# Written by every transition (``_enter``); ``updated_at`` because a bulk update skips auto_now.
_TRANSITION_FIELDS = ("state", "parallelism", "started_at", "finished_at", "updated_at")


class Batch:
    """Changes to many jobs in one transaction, written together by :meth:`flush`.

    For the scheduler tick, which changes a handful to thousands of jobs at
    once: :meth:`transition`, :meth:`save_fields` and :meth:`record` check and
    do what :func:`transition`, :func:`save_fields` and :func:`record` do, but
    the rows go out in one ``UPDATE`` of the jobs (the union of the fields any
    of them changed) and one ``INSERT`` of the events, in the order they were
    made.  Every job given must be locked by the caller (``select_for_update``
    in this transaction): the update writes each named field from the object,
    so it must hold the row's current values.  Events still send ``post_save``
    (notifications listen to it); nothing is written before :meth:`flush`.
    """

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.fields: set[str] = set()
        self.events: list[JobEvent] = []

    def _job(self, job: Job, fields: tuple[str, ...]) -> None:
        known = self.jobs.setdefault(job.pk, job)
        if known is not job:
            raise ValueError(f"job {job.pk} was given to the batch as two objects")
        self.fields.update(fields)

    def transition(
        self,
        job: Job,
        to_state: str,
        *,
        reason: str,
        at: datetime,
        parallelism: int | None = None,
        kind: str | None = None,
        fields: tuple[str, ...] = (),
    ) -> None:
        """:func:`transition`, written at :meth:`flush`; ``fields``: others the caller set."""
        event = _enter(job, to_state, reason=reason, at=at, parallelism=parallelism, kind=kind)
        self._job(job, _TRANSITION_FIELDS + fields)
        self.events.append(event)

    def save_fields(self, job: Job, *fields: str) -> None:
        """:func:`save_fields`, written at :meth:`flush`."""
        if "state" in fields:
            raise ValueError("a job's state changes only through transition()")
        self._job(job, (*fields, "updated_at"))

    def record(self, job: Job, kind: str, at: datetime, reason: str = "", **fields: Any) -> None:
        """:func:`record`, written at :meth:`flush`."""
        self.events.append(_event(job, kind, at, reason, **fields))

    def flush(self) -> None:
        """Write every job change (one ``UPDATE``) and event (one ``INSERT``), in one
        statement on PostgreSQL; start empty again."""
        jobs, fields, events = list(self.jobs.values()), sorted(self.fields), self.events
        self.jobs, self.fields, self.events = {}, set(), []
        written = False
        if jobs and fields:
            now = timezone.now()
            for job in jobs:
                job.updated_at = now
            written = _update_jobs_and_create(jobs, fields, events)
            if not written:
                update_jobs(jobs, fields)
        if events:
            if not written:
                bulk_rows.bulk_create(JobEvent, events)
            for event in events:  # what event.save() would have sent
                post_save.send(
                    JobEvent, instance=event, created=True, raw=False, using=event._state.db
                )


ESTIMATE_FIELDS = (
    "estimated_start",
    "estimated_finish",
    "queue_position",
    "estimate_reason",
    "estimated_at",
)


FORECAST_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.SCALING)
"""The states of the jobs a forecast predicts (``control.forecast``)."""


def estimate_fields(job: Job) -> dict[str, Any]:
    """A job's estimates as live pages and events carry them (ISO times or None)."""
    return {
        "estimated_start": job.estimated_start.isoformat() if job.estimated_start else None,
        "estimated_finish": job.estimated_finish.isoformat() if job.estimated_finish else None,
        "queue_position": job.queue_position,
        "estimate_reason": job.estimate_reason,
    }


def save_estimates(jobs: list[Job]) -> None:
    """Persist the forecast's fields of many jobs in one bulk update (control.forecast).

    Only :data:`ESTIMATE_FIELDS`: a tick that changed a job's state or
    parallelism meanwhile is never undone by a forecast made before it.
    """
    Job.objects.bulk_update(jobs, list(ESTIMATE_FIELDS), batch_size=500)


def request_tick(delay_s: float = 0.3) -> None:
    """Ask for one scheduler tick shortly after commit; a burst of requests makes one tick."""

    def enqueue() -> None:
        try:
            client = redis.Redis.from_url(settings.REDIS_URL)
            if client.set(TICK_DEBOUNCE_KEY, "1", nx=True, px=int(delay_s * 1000) + 200):
                current_app.send_task(
                    TICK_TASK,
                    countdown=delay_s,
                    queue=TICK_QUEUE,
                    expires=settings.TICK_SECONDS * 4,
                    ignore_result=True,
                )
        except Exception:  # the periodic tick still runs; an extra one is an optimisation
            log.warning("could not request a scheduler tick", exc_info=True)

    transaction.on_commit(enqueue)


def export_log_on_commit(job_id: int, delay_s: float = EXPORT_LOG_DELAY_S) -> None:
    """Have the job's whole log written to the artifact store shortly after commit."""

    def enqueue() -> None:
        try:
            current_app.send_task(
                EXPORT_LOG_TASK,
                args=[job_id],
                countdown=delay_s,
                queue="portal",
                ignore_result=True,
            )
        except Exception:  # the log stays readable in the portal; only the stored copy is missing
            log.warning("could not enqueue the log export of job %s", job_id, exc_info=True)

    transaction.on_commit(enqueue)


def record_metric(
    job: Job, *, at: datetime, step: int, parallelism: int, samples_per_s: float, loss: float | None
) -> None:
    """Add one progress sample to the job's time series (its charts; ``job.sample`` live)."""
    JobMetric.objects.create(
        job=job,
        at=at,
        step=step,
        parallelism=parallelism,
        samples_per_s=samples_per_s,
        loss=loss,
    )
    sample = sample_row(
        at=at, step=step, parallelism=parallelism, samples_per_s=samples_per_s, loss=loss
    )
    broadcast_on_commit(
        (job_group(job.pk),),
        {"type": "job.sample", "job": job.pk, "tenant": job.tenant_id, "sample": sample},
    )
