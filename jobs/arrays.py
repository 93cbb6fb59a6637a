"""Job arrays: one submission, N tasks of the same program (``check_*`` validate, ``do_*``
change state).

Each task is an ordinary :class:`~jobs.models.Job` (the tick schedules it,
quotas, accounting and logs treat it like any other) whose environment holds
``TASK_ID`` (0 to N-1) and ``TASK_COUNT`` (N).  An array runs a program (code):
a built-in workload takes no environment, so its tasks could not tell
themselves apart.  ``max_running`` caps how many tasks are queued or running
at once: the others stay ``pending`` with a reason, and each task's end
releases the next (``jobs.dependencies.fill_slots``, called from
``jobs.workflow_events`` in the transaction that ended it) — the tick is not
involved.  A retry makes a new job for each failed task, with the same
``TASK_ID``; the array's counts are over each task's latest attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from audit import services as audit
from jobs.choices import TERMINAL_STATES, JobState
from jobs.dependencies import current_tasks, fill_slots
from jobs.errors import JobConflictError, JobPermissionError, JobValidationError
from jobs.lifecycle import broadcast, request_tick
from jobs.models import Job, JobArray
from jobs.services import (
    JobSpec,
    after_field,
    check_job_spec,
    check_queue_room,
    create_job,
    create_task_retry,
    do_cancel_job,
)
from tenancy.models import Tenant
from tenancy.services import can_write

MAX_ARRAY_SIZE = 1000
TASK_ENV = ("TASK_ID", "TASK_COUNT")
"""The variables an array sets in each task's environment (a submission may not)."""
ARRAY_FIELDS = ("size", "max_running")


@dataclass(frozen=True)
class ArraySpec:
    """A checked array submission: the tasks' job, how many, how many at once."""

    job: JobSpec
    size: int
    max_running: int | None


def _whole(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def check_array_spec(*, tenant: Tenant, data: Mapping[str, Any]) -> ArraySpec:
    """Validate an array submission for ``tenant``: a job submission (``check_job_spec``: a
    program, its GPUs, ``after``...) plus ``size`` (1 to 1000 tasks) and an optional
    ``max_running`` (at least 1); ``env`` may not set ``TASK_ID`` or ``TASK_COUNT``.  Every
    problem is reported by its field at once (``JobValidationError``)."""
    errors: dict[str, list[str]] = {}
    size = _whole(data.get("size"))
    if size is None or not 1 <= size <= MAX_ARRAY_SIZE:
        errors["size"] = [f"A whole number of tasks from 1 to {MAX_ARRAY_SIZE}."]
    max_running = None
    if data.get("max_running") is not None:
        max_running = _whole(data.get("max_running"))
        if max_running is None or max_running < 1:
            errors["max_running"] = ["A whole number of at least 1 (or leave it out: no cap)."]
    if data.get("workload") and not (data.get("code") or data.get("entrypoint")):
        errors["workload"] = [
            "An array runs a program (code, entrypoint, launcher): a built-in workload takes "
            "no environment, so its tasks could not see their TASK_ID."
        ]
    job_data = {k: v for k, v in data.items() if k not in ARRAY_FIELDS}
    spec = None
    try:
        spec = check_job_spec(tenant=tenant, data=job_data)
    except JobValidationError as exc:
        for field, messages in exc.errors.items():
            errors.setdefault(field, []).extend(messages)
    if spec is not None and spec.program is None and "workload" not in errors:
        errors["workload"] = ["An array runs a program (code, entrypoint, launcher)."]
    taken = [
        name for name in TASK_ENV if spec is not None and spec.program and name in spec.program.env
    ]
    if taken:  # read from the checked env: a JSON object or NAME=value lines alike
        errors["env"] = [f"{', '.join(taken)} is set by the array for each task."]
    if errors:
        field, messages = next(iter(errors.items()))
        raise JobValidationError(f"{field}: {messages[0]}", errors)
    assert spec is not None and size is not None
    return ArraySpec(job=spec, size=size, max_running=max_running)


def _task_env(spec: JobSpec, index: int, size: int) -> dict[str, str]:
    assert spec.program is not None
    return {**spec.program.env, "TASK_ID": str(index), "TASK_COUNT": str(size)}


@transaction.atomic
def do_submit_array(
    *,
    user: AbstractBaseUser | AnonymousUser,
    tenant: Tenant,
    spec: ArraySpec,
    at: datetime | None = None,
) -> JobArray:
    """Create an array of ``spec.size`` tasks for ``tenant``: the first ``max_running`` whose
    dependencies are met are queued, the rest wait pending with the reason."""
    if not can_write(user, tenant):
        raise JobPermissionError(f"you cannot submit jobs to tenant {tenant.slug!r}")
    check_queue_room(tenant_id=tenant.pk, adding=spec.size)
    now = at or timezone.now()
    array = JobArray.objects.create(
        tenant=tenant,
        submitter_id=cast(int, user.pk),  # can_write refused anonymous users
        name=spec.job.name,
        size=spec.size,
        max_running=spec.max_running,
        created_at=now,
    )
    tasks = [
        create_job(
            user=user,
            tenant=tenant,
            spec=spec.job,
            at=now,
            array=array,
            index=index,
            env=_task_env(spec.job, index, spec.size),
        )
        for index in range(spec.size)
    ]
    fill_slots(array.pk, at=now)
    audit.record(
        "array.submit",
        obj=array,
        tenant=tenant,
        user=user,
        after={
            "name": array.name,
            "size": array.size,
            "max_running": array.max_running,
            "jobs": [task.pk for task in tasks],
            **({"after": after_field(spec.job.after)} if spec.job.after else {}),
        },
    )
    for task in Job.objects.filter(array=array):
        broadcast(task, "job.created")
    request_tick()
    return array


def _check_writable(user: AbstractBaseUser | AnonymousUser, array: JobArray) -> None:
    if not can_write(user, array.tenant):
        raise JobPermissionError("your role in this tenant is read-only")


@transaction.atomic
def do_cancel_array(
    *, user: AbstractBaseUser | AnonymousUser, array_id: int, reason: str = ""
) -> JobArray:
    """Cancel every task of the array that has not ended (a 409 when none is left).

    The array row is locked first and the waiting tasks go first, so no task
    ending meanwhile releases one that is about to be cancelled.
    """
    array: JobArray = JobArray.objects.select_for_update().select_related("tenant").get(pk=array_id)
    _check_writable(user, array)
    live = list(
        Job.objects.filter(array=array)
        .exclude(state__in=TERMINAL_STATES)
        .order_by("array_index", "pk")
        .values_list("pk", "state")
    )
    if not live:
        raise JobConflictError(f"array {array.pk} has no task left to cancel")
    why = reason or f"array {array.pk} cancelled by {user.get_username()}"
    live.sort(key=lambda row: row[1] != JobState.PENDING)  # the waiting ones first
    for pk, _state in live:
        do_cancel_job(user=user, job_id=pk, reason=why)
    audit.record(
        "array.cancel",
        obj=array,
        tenant=array.tenant,
        user=user,
        after={"cancelled": [pk for pk, _state in live], "reason": why},
    )
    return array


@transaction.atomic
def do_retry_array(*, user: AbstractBaseUser | AnonymousUser, array_id: int) -> list[Job]:
    """Submit again every task of the array whose latest attempt failed: a new job with the
    same program and ``TASK_ID``, queued as the array's cap allows (409: none failed)."""
    array = JobArray.objects.select_for_update().select_related("tenant").get(pk=array_id)
    _check_writable(user, array)
    rows = Job.objects.filter(array=array).values_list("array_id", "array_index", "pk", "state")
    latest = current_tasks(rows).get(array.pk, {})
    failed_indexes = sorted(i for i, state in latest.items() if state == JobState.FAILED)
    if not failed_indexes:
        raise JobConflictError(f"array {array.pk} has no failed task to retry")
    check_queue_room(tenant_id=array.tenant_id, adding=len(failed_indexes))
    now = timezone.now()
    originals = {
        job.array_index: job
        for job in Job.objects.filter(array=array, array_index__in=failed_indexes).order_by("pk")
    }  # the newest attempt of each index wins
    retried: list[Job] = []
    for index in failed_indexes:
        retried.append(create_task_retry(originals[index], user=user, at=now))
    fill_slots(array.pk, at=now)
    audit.record(
        "array.retry",
        obj=array,
        tenant=array.tenant,
        user=user,
        after={"tasks": failed_indexes, "jobs": [job.pk for job in retried]},
    )
    fresh = Job.objects.filter(pk__in=[job.pk for job in retried])
    for job in fresh:
        broadcast(job, "job.created")
    request_tick()
    return list(fresh.order_by("array_index"))


def array_counts(arrays: Iterable[JobArray]) -> dict[int, dict[str, int]]:
    """Per array, how many tasks (latest attempts) are in each state, in one query."""
    ids = [array.pk for array in arrays]
    rows = Job.objects.filter(array_id__in=ids).values_list(
        "array_id", "array_index", "pk", "state"
    )
    latest = current_tasks(rows)
    return {array: dict(Counter(latest.get(array, {}).values())) for array in ids}


def array_tasks(array: JobArray) -> list[dict[str, Any]]:
    """Each TASK_ID's latest attempt: ``task_id``, ``job``, ``state``, ``wait_reason``."""
    latest: dict[int, dict[str, Any]] = {}
    rows = (
        Job.objects.filter(array=array)
        .order_by("pk")
        .values("pk", "array_index", "state", "wait_reason")
    )
    for row in rows:  # ordered by pk: a retry overwrites its earlier attempts
        latest[row["array_index"]] = {
            "task_id": row["array_index"],
            "job": row["pk"],
            "state": row["state"],
            "wait_reason": row["wait_reason"],
        }
    return [latest[index] for index in sorted(latest)]


__all__ = [
    "MAX_ARRAY_SIZE",
    "TASK_ENV",
    "ArraySpec",
    "array_counts",
    "array_tasks",
    "check_array_spec",
    "do_cancel_array",
    "do_retry_array",
    "do_submit_array",
]
