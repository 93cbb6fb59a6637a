"""Job services: ``check_*`` functions validate, ``do_*`` functions change state.

What people and tokens do to jobs (submit, cancel, change priority or range)
goes through here; views, API viewsets, Celery tasks and consumers call it and
never save models themselves.  State changes, events and live updates go
through ``jobs.lifecycle``, placements through ``jobs.holdings``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from audit import services as audit
from audit.context import current_actor
from fabric.allocator import clos_shapes
from inventory.services import current_spec
from jobs.artifacts import copy_newest_checkpoint, has_checkpoint
from jobs.choices import TERMINAL_STATES, EventKind, JobState, RecoveryMode
from jobs.dependencies import (
    After,
    attach,
    check_after,
    check_no_cycle,
    replace_dependencies,
    settle,
)
from jobs.errors import JobConflictError, JobError, JobPermissionError, JobValidationError
from jobs.holdings import release
from jobs.lifecycle import broadcast, record, request_tick, transition
from jobs.models import Job, JobArray, Trial
from jobs.outbox import Outbox
from jobs.program_spec import PROGRAM_FIELDS, ProgramSpec, check_program, wants_program
from jobs.resource_requests import (
    REQUEST_FIELDS,
    ResourceRequest,
    check_request,
    check_satisfiable,
)
from jobs.stats import JctStats, jct_stats
from scheduler.quota import QuotaBook
from tenancy.models import Tenant
from tenancy.services import can_write
from utilities.bounded_json import JsonRefused, loads
from workers.catalog import WORKLOADS, WorkloadArgumentError, validate_args

MAX_GPUS_PER_JOB = 4096
MAX_BATCH_SIZE = 1 << 20
MAX_ARGS_BYTES = 4096
NAME_MAX = 100
MAX_RESTARTS = 100
MAX_RUNTIME_S = 366 * 24 * 3600  # a year: anything longer is a typo, not a limit
PROGRAM_BATCH_SIZE = 256  # a program's default global batch (edl: the runtime's batch)
JOB_FIELDS = (
    "name",
    "workload",
    "args",
    "gpus",
    "min_gpus",
    "max_gpus",
    "batch_size",
    "priority",
    "recovery",
    "checkpoint_interval",
    "max_restarts",
    "max_runtime_s",
    *REQUEST_FIELDS,
    *PROGRAM_FIELDS,
)
SUBMIT_AUDIT_FIELDS = (
    "name",
    "workload",
    "args",
    "code_id",
    "entrypoint",
    "launcher",
    "environment",
    "gpus",
    "min_gpus",
    "max_gpus",
    "batch_size",
    "priority",
    "recovery",
    "checkpoint_interval",
    "max_restarts",
    "max_runtime_s",
    *REQUEST_FIELDS,
    "resumed_from_id",
)
"""What the audit log keeps of a submission (``env`` by its names only: values may be secrets)."""
SPEC_EXTRAS = ("tenant", "after", "resume_from")
"""Keys of a submission besides the job's own fields: where it goes, what it waits for, whose
checkpoint it starts from."""
UPDATE_AUDIT_FIELDS = ("priority", "min_gpus", "max_gpus", "max_restarts", "max_runtime_s")
"""What ``do_update_job`` may change: the audit row holds the ones that did."""


@dataclass(frozen=True)
class JobSpec:
    """A validated job submission."""

    name: str
    workload: str
    args: dict[str, int | float]
    gpus: int
    min_gpus: int
    max_gpus: int
    batch_size: int
    priority: int
    recovery: str
    checkpoint_interval: int
    program: ProgramSpec | None = None
    max_restarts: int = 0
    max_runtime_s: int | None = None
    after: tuple[After, ...] = ()
    """What the job waits for before it is queued (``jobs.dependencies``)."""
    resume_from: int | None = None
    """A job of the same tenant whose newest checkpoint is copied into this one's store."""
    request: ResourceRequest = dataclasses.field(default_factory=ResourceRequest)
    """The GPU types, node selector, CPU and memory per GPU it asks for (``jobs.resource_requests``)."""


class FieldErrors:
    """Collects field errors so a form or API can show all of them at once."""

    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.fields.setdefault(field, []).append(message)

    def raise_if_any(self) -> None:
        if self.fields:
            first = next(iter(self.fields.items()))
            raise JobValidationError(f"{first[0]}: {first[1][0]}", self.fields)


def _int_field(
    data: Mapping[str, Any], errors: FieldErrors, key: str, lo: int, hi: int, default: int | None
) -> int | None:
    raw = data.get(key)
    if raw is None or raw == "":
        if default is None:
            errors.add(key, "This field is required.")
        return default
    if isinstance(raw, bool):
        errors.add(key, "Must be a whole number.")
        return None
    try:
        value = int(raw)
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError
    except (TypeError, ValueError):
        errors.add(key, "Must be a whole number.")
        return None
    if not lo <= value <= hi:
        errors.add(key, f"Must be between {lo} and {hi}.")
        return None
    return value


def placement_problem(gpus: int) -> str | None:
    """Why ``gpus`` GPUs can never be placed on this cluster's fabric (None if they can)."""
    spec = current_spec()
    if spec is None or gpus <= spec.gpus_per_leaf or clos_shapes(spec, gpus):
        return None
    return (
        f"{gpus} GPUs cannot form an isolated m x n block on this fabric ({spec.leaves} leaves "
        f"of {spec.gpus_per_leaf} GPUs): ask for at most {spec.gpus_per_leaf}, or a size "
        "that splits evenly over an allowed number of leaves"
    )


def _check_workload(
    data: Mapping[str, Any], errors: FieldErrors
) -> tuple[str, dict[str, int | float]]:
    """A built-in workload and its arguments (empty when refused)."""
    if data.get("env"):
        errors.add("env", "Only a program (code) takes environment variables.")
    if data.get("environment"):
        errors.add(
            "environment",
            "Only a program (code) takes its own requirements: built-in workloads run on the "
            "node's base layer.",
        )
    if data.get("launcher") not in (None, "", "edl"):
        errors.add("launcher", "Built-in workloads run on the edl launcher.")
    workload = data.get("workload")
    args: dict[str, int | float] = {}
    if not isinstance(workload, str) or workload not in WORKLOADS:
        errors.add("workload", f"Unknown workload; choose one of: {', '.join(sorted(WORKLOADS))}.")
        return "", args
    raw_args = data.get("args")
    if isinstance(raw_args, str):
        try:  # bounded: json.loads recursed into a RecursionError on deep nesting
            raw_args = loads(raw_args) if raw_args.strip() else {}
        except JsonRefused as exc:
            errors.add("args", f"Must be a JSON object: {exc.message}")
            raw_args = {}
    if len(json.dumps(raw_args, default=str)) > MAX_ARGS_BYTES:
        errors.add("args", f"At most {MAX_ARGS_BYTES} bytes of JSON.")
    else:
        try:
            args = validate_args(workload, raw_args)
        except WorkloadArgumentError as exc:
            errors.add("args", str(exc))
    return workload, args


def default_limits(tenant: Tenant) -> tuple[int, int | None]:
    """The restarts and run-time limit a job of ``tenant`` gets when its submission names none.

    The tenant's defaults; with no default run-time limit but a ceiling, the
    ceiling (a job of a tenant with a ceiling never runs without a limit).
    """
    runtime = tenant.default_max_runtime_s or tenant.max_runtime_ceiling_s
    return tenant.default_max_restarts, runtime


def _check_ceilings(
    tenant: Tenant, max_restarts: int | None, max_runtime_s: int | None, errors: FieldErrors
) -> None:
    """Refuse limits above the tenant's ceilings (``None``: not asked for, nothing to check)."""
    ceiling = tenant.max_restarts_ceiling
    if max_restarts is not None and ceiling is not None and max_restarts > ceiling:
        errors.add(
            "max_restarts",
            f"Tenant {tenant.slug} allows at most {ceiling} restarts per job, not {max_restarts}.",
        )
    longest = tenant.max_runtime_ceiling_s
    if max_runtime_s is not None and longest is not None and max_runtime_s > longest:
        errors.add(
            "max_runtime_s",
            f"Tenant {tenant.slug} allows a run-time limit of at most {longest} s, "
            f"not {max_runtime_s} s.",
        )


def _check_limits(
    tenant: Tenant, data: Mapping[str, Any], errors: FieldErrors
) -> tuple[int | None, int | None]:
    """A submission's ``max_restarts`` and ``max_runtime_s``: given, or the tenant's defaults.

    Either may be left out (or empty/null) for the tenant's default; a value
    above the tenant's ceiling is refused.
    """
    restarts_default, runtime_default = default_limits(tenant)
    restarts = _int_field(data, errors, "max_restarts", 0, MAX_RESTARTS, restarts_default)
    runtime = runtime_default
    if data.get("max_runtime_s") not in (None, ""):
        runtime = _int_field(data, errors, "max_runtime_s", 1, MAX_RUNTIME_S, None)
    _check_ceilings(tenant, restarts, runtime, errors)
    return restarts, runtime


def _check_resume_from(tenant: Tenant, raw: Any, errors: FieldErrors) -> int | None:
    """``resume_from``: a job of ``tenant`` with a checkpoint to copy (None: not asked).

    A job of another tenant gets the answer a missing one gets: nothing leaks.
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        errors.add("resume_from", "A job id (a whole number).")
        return None
    source = Job.objects.filter(tenant=tenant, pk=raw).first()
    if source is None:
        errors.add("resume_from", f"No job {raw} in tenant {tenant.slug}.")
        return None
    if not has_checkpoint(source):
        errors.add("resume_from", f"Job {raw} has no complete checkpoint to resume from.")
        return None
    return raw


def check_job_spec(*, tenant: Tenant, data: Mapping[str, Any]) -> JobSpec:
    """Validate a submission for ``tenant`` and return it normalized.

    Rules: known fields only; name 1-100 printable characters; a known workload
    with valid arguments (at most 4 KiB of JSON), or a program: one of the
    tenant's code bundles, an entrypoint in it, a launcher and the user's
    variables (``jobs.program_spec``); ``1 <= min_gpus <= gpus <=
    max_gpus``; requested GPUs within the tenant's quota; a global batch of at
    least one sample per GPU at ``max_gpus``; priority 0-100; a recovery mode;
    restarts (0-100) and a run-time limit (seconds) within the tenant's
    ceilings, the tenant's defaults when left out (``default_limits``); ``after``:
    dependencies on the tenant's own jobs or arrays (``jobs.dependencies.check_after``);
    ``resume_from``: a job of the tenant with a checkpoint (``_check_resume_from``).
    """
    errors = FieldErrors()
    unknown = sorted(str(key) for key in data if key not in JOB_FIELDS and key not in SPEC_EXTRAS)
    if unknown:
        errors.add("non_field_errors", f"Unknown field(s): {', '.join(unknown)}.")

    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        errors.add("name", "A name is required.")
        name = ""
    elif len(name) > NAME_MAX:
        errors.add("name", f"At most {NAME_MAX} characters.")
    elif not name.isprintable():
        errors.add("name", "Only printable characters.")

    program = None
    workload: str = ""
    args: dict[str, int | float] = {}
    runs_program = wants_program(data)
    if runs_program:
        program = check_program(tenant, data, errors.add)
    else:
        workload, args = _check_workload(data, errors)

    gpus = _int_field(data, errors, "gpus", 1, MAX_GPUS_PER_JOB, None)
    min_gpus = _int_field(data, errors, "min_gpus", 1, MAX_GPUS_PER_JOB, gpus)
    max_gpus = _int_field(data, errors, "max_gpus", 1, MAX_GPUS_PER_JOB, gpus)
    default_batch = (
        WORKLOADS[workload].default_batch_size
        if workload
        else PROGRAM_BATCH_SIZE
        if runs_program
        else None
    )
    batch_size = _int_field(data, errors, "batch_size", 1, MAX_BATCH_SIZE, default_batch)
    priority = _int_field(data, errors, "priority", 0, 100, 50)
    interval = _int_field(data, errors, "checkpoint_interval", 1, 1_000_000, 50)
    max_restarts, max_runtime_s = _check_limits(tenant, data, errors)
    request = check_request(
        data,
        default_cpus=tenant.default_cpus_per_gpu,
        default_mem_mib=tenant.default_mem_per_gpu_mib,
        add_error=errors.add,
    )

    after = check_after(tenant=tenant, raw=data.get("after"), add_error=errors.add)
    resume_from = _check_resume_from(tenant, data.get("resume_from"), errors)

    recovery = data.get("recovery") or RecoveryMode.CONSISTENT
    if recovery not in RecoveryMode.values:
        errors.add("recovery", f"Choose one of: {', '.join(RecoveryMode.values)}.")

    if gpus is not None and min_gpus is not None and max_gpus is not None:
        if min_gpus > max_gpus:
            errors.add("min_gpus", "min_gpus cannot exceed max_gpus.")
        elif not min_gpus <= gpus <= max_gpus:
            errors.add("gpus", "Requested GPUs must lie between min_gpus and max_gpus.")
        if gpus > tenant.gpu_quota:
            errors.add(
                "gpus",
                f"Requests {gpus} GPUs but tenant {tenant.slug} has a quota of {tenant.gpu_quota}.",
            )
        elif not type_quota_admits(tenant, gpus, request.gpu_types):
            errors.add(
                "gpus",
                f"Requests {gpus} GPUs but tenant {tenant.slug}'s quota of every type it "
                f"accepts is smaller: {tenant.gpu_type_quota}.",
            )
        if batch_size is not None and batch_size < max_gpus:
            errors.add("batch_size", "The global batch needs at least one sample per GPU.")
        for field, size in (("gpus", gpus), ("min_gpus", min_gpus)):
            problem = placement_problem(size)
            if problem:
                errors.add(field, problem)
                break
        if not errors.fields:  # a request no server could ever hold: refused, not queued forever
            check_satisfiable(current_spec(), request, min_gpus, errors.add)
    errors.raise_if_any()
    assert gpus is not None and min_gpus is not None and max_gpus is not None
    assert batch_size is not None and priority is not None and interval is not None
    assert max_restarts is not None
    return JobSpec(
        name=name.strip(),
        workload=workload,
        args=args,
        gpus=gpus,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        batch_size=batch_size,
        priority=priority,
        recovery=str(recovery),
        checkpoint_interval=interval,
        program=program,
        max_restarts=max_restarts,
        max_runtime_s=max_runtime_s,
        after=after,
        resume_from=resume_from,
        request=request,
    )


def type_quota_admits(tenant: Tenant, gpus: int, gpu_types: tuple[str, ...]) -> bool:
    """Whether ``gpus`` GPUs of one of ``gpu_types`` (empty: any) fit some type's quota of
    ``tenant`` (``scheduler.quota.QuotaBook.admits``; a type without a quota fits)."""
    if not tenant.gpu_type_quota:
        return True
    book = QuotaBook(type_quota={tenant.slug: dict(tenant.gpu_type_quota)})
    return book.admits(tenant.slug, gpus, gpu_types)


def _program_fields(program: ProgramSpec | None) -> dict[str, Any]:
    if program is None:
        return {}
    return {
        "code": program.bundle,
        "entrypoint": program.entrypoint_text,
        "launcher": program.launcher,
        "env": program.env,
        "environment": program.environment_field,
    }


WAITING_STATES = (JobState.PENDING, JobState.QUEUED)


def check_queue_room(*, tenant_id: int, adding: int = 1) -> None:
    """Refuse (409) a submission of ``adding`` jobs that would put the tenant over its cap on
    waiting jobs.

    Call inside the submitting transaction: the tenant row stays locked until it
    commits, so concurrent submissions are counted one after the other.
    """
    slug, cap = (
        Tenant.objects.select_for_update()
        .filter(pk=tenant_id)
        .values_list("slug", "max_queued_jobs")
        .get()
    )
    waiting = Job.objects.filter(tenant_id=tenant_id, state__in=WAITING_STATES).count()
    if waiting + adding > cap:
        message = (
            f"Tenant {slug} already has {waiting} jobs waiting, its limit of {cap}: "
            "wait for some to start or cancel some, then submit again."
        )
        raise JobConflictError(message, {"tenant": [message]})


def create_job(
    *,
    user: AbstractBaseUser | AnonymousUser,
    tenant: Tenant,
    spec: JobSpec,
    at: datetime,
    array: JobArray | None = None,
    index: int | None = None,
    env: dict[str, str] | None = None,
    trial: Trial | None = None,
    sched_weight: float = 1.0,
) -> Job:
    """Create one pending job of ``spec`` with its dependencies and its submission event, in
    the caller's transaction (``do_submit_job``, ``jobs.arrays``); the caller queues it.

    ``array``/``index``: the task it is; ``env``: its variables instead of the spec's;
    ``trial``/``sched_weight``: the sweep trial it trains and its weight (``jobs.sweeps``).
    """
    program = _program_fields(spec.program)
    if env is not None:
        program["env"] = env
    job = Job.objects.create(
        tenant=tenant,
        submitter_id=cast(int, user.pk),  # the caller's can_write refused anonymous users
        name=spec.name,
        workload=spec.workload,
        args=spec.args,
        gpus=spec.gpus,
        min_gpus=spec.min_gpus,
        max_gpus=spec.max_gpus,
        batch_size=spec.batch_size,
        priority=spec.priority,
        recovery=spec.recovery,
        checkpoint_interval=spec.checkpoint_interval,
        max_restarts=spec.max_restarts,
        max_runtime_s=spec.max_runtime_s,
        submitted_at=at,
        array=array,
        array_index=index,
        trial=trial,
        sched_weight=sched_weight,
        **spec.request.as_fields(),
        **program,
    )
    record(
        job,
        EventKind.SUBMITTED,
        at,
        f"submitted by {user.get_username()}",
        to_state=JobState.PENDING,
    )
    attach(job, spec.after)
    if spec.resume_from is not None:
        resume(job, Job.objects.select_related("tenant").get(pk=spec.resume_from), at)
    return job


def resume(job: Job, source: Job, at: datetime) -> None:
    """Copy ``source``'s newest checkpoint into the new ``job``'s store (before it is queued)
    and say so in its history; its step starts at the checkpoint's."""
    copied = copy_newest_checkpoint(source, job, at)
    job.resumed_from = source
    if copied is None:
        reason = f"job {source.pk} had no checkpoint left to copy: starts from step 0"
    elif copied.step is None:
        reason = f"resumes from job {source.pk}'s own checkpoint files ({copied.files})"
    else:
        job.step = copied.step
        reason = f"resumes from job {source.pk}'s checkpoint at step {copied.step}"
    job.save(update_fields=["resumed_from", "step", "updated_at"])
    record(job, EventKind.NOTE, at, reason, data={"resumed_from": source.pk})


def create_task_retry(old: Job, *, user: AbstractBaseUser | AnonymousUser, at: datetime) -> Job:
    """A new pending attempt of array task ``old`` (``jobs.arrays.do_retry_array``): the same
    program, settings and ``TASK_ID``, no history; in the caller's transaction."""
    job = Job.objects.create(
        tenant_id=old.tenant_id,
        submitter_id=cast(int, user.pk),
        name=old.name,
        workload=old.workload,
        args=old.args,
        code_id=old.code_id,
        entrypoint=old.entrypoint,
        launcher=old.launcher,
        env=old.env,
        environment=old.environment,
        gpus=old.gpus,
        min_gpus=old.min_gpus,
        max_gpus=old.max_gpus,
        batch_size=old.batch_size,
        priority=old.priority,
        recovery=old.recovery,
        checkpoint_interval=old.checkpoint_interval,
        max_restarts=old.max_restarts,
        max_runtime_s=old.max_runtime_s,
        gpu_types=old.gpu_types,
        node_selector=old.node_selector,
        cpus_per_gpu=old.cpus_per_gpu,
        mem_per_gpu_mib=old.mem_per_gpu_mib,
        submitted_at=at,
        array_id=old.array_id,
        array_index=old.array_index,
    )
    record(
        job,
        EventKind.SUBMITTED,
        at,
        f"task {old.array_index} retried by {user.get_username()} (job {old.pk} failed)",
        to_state=JobState.PENDING,
    )
    return job


def after_field(after: tuple[After, ...]) -> list[dict[str, Any]]:
    """Dependencies as the API and the audit log show them."""
    return [
        {"kind": a.kind, "job": a.job_id}
        if a.job_id is not None
        else {"kind": a.kind, "array": a.array_id}
        for a in after
    ]


@transaction.atomic
def do_submit_job(
    *,
    user: AbstractBaseUser | AnonymousUser,
    tenant: Tenant,
    spec: JobSpec,
    at: datetime | None = None,
    trial: Trial | None = None,
    sched_weight: float = 1.0,
) -> Job:
    """Create a job for ``tenant`` and put it in the queue, or, while its dependencies are
    not met, keep it pending with the reason (``jobs.dependencies``); ``trial``: the sweep
    trial it trains, with its scheduling weight (``jobs.sweeps``)."""
    if not can_write(user, tenant):
        raise JobPermissionError(f"you cannot submit jobs to tenant {tenant.slug!r}")
    check_queue_room(tenant_id=tenant.pk)
    now = at or timezone.now()
    job = create_job(
        user=user, tenant=tenant, spec=spec, at=now, trial=trial, sched_weight=sched_weight
    )
    if spec.after:
        settle(job, at=now)
    else:
        transition(job, JobState.QUEUED, reason="accepted: waiting for GPUs", at=now)
    audit.record(
        "job.submit",
        obj=job,
        tenant=tenant,
        user=user,
        after={
            **audit.snapshot(job, SUBMIT_AUDIT_FIELDS),
            "env_names": sorted(job.env),
            "state": job.state,
            **({"after": after_field(spec.after)} if spec.after else {}),
        },
    )
    broadcast(job, "job.created")
    request_tick()
    return job


@transaction.atomic
def do_set_parallelism(
    *, job_id: int, parallelism: int, reason: str, at: datetime | None = None
) -> Job:
    """Record that a running job now holds ``parallelism`` GPUs.

    The control plane calls this when the runtime reports a new world size: that
    is the system, not a person, and leaves no audit row.  A person's or a
    token's call (a request being served, ``acting_as`` a user) is audited as
    ``job.scale``.
    """
    job: Job = Job.objects.select_for_update().select_related("tenant").get(pk=job_id)
    if job.state not in (JobState.RUNNING, JobState.SCALING):
        raise JobConflictError(f"a {job.state} job has no parallelism to change")
    if parallelism < 1:
        raise JobValidationError("a running job holds at least one GPU")
    if parallelism != job.parallelism:
        previous = job.parallelism
        job.parallelism = parallelism
        job.save(update_fields=["parallelism", "updated_at"])
        record(
            job,
            EventKind.SCALED,
            at or timezone.now(),
            reason,
            from_parallelism=previous,
            to_parallelism=parallelism,
        )
        if current_actor().user_id is not None:  # a person, not the control plane
            audit.record(
                "job.scale",
                obj=job,
                tenant=job.tenant,
                before={"parallelism": previous},
                after={"parallelism": parallelism, "reason": reason},
            )
        broadcast(job, "job.updated")
    return job


def _check_writable(user: AbstractBaseUser | AnonymousUser, job: Job) -> None:
    if not can_write(user, job.tenant):
        raise JobPermissionError("your role in this tenant is read-only")


@transaction.atomic
def do_cancel_job(*, user: AbstractBaseUser | AnonymousUser, job_id: int, reason: str = "") -> Job:
    """Cancel a job that has not finished; its GPUs are released."""
    job: Job = Job.objects.select_for_update().select_related("tenant").get(pk=job_id)
    _check_writable(user, job)
    if job.state in TERMINAL_STATES:
        raise JobConflictError(f"job {job.pk} is already {job.state}")
    why = reason or f"cancelled by {user.get_username()}"
    before = cancel_locked(job, reason=why, at=timezone.now())
    audit.record(
        "job.cancel",
        obj=job,
        tenant=job.tenant,
        user=user,
        before={"state": before},
        after={"state": job.state, "reason": why},
    )
    return job


def cancel_locked(job: Job, *, reason: str, at: datetime) -> str:
    """End ``job`` (its row locked by the caller, not terminal) cancelled with ``reason``:
    its workers are stopped gracefully after commit, its GPUs released, the change
    broadcast and a tick asked for.  The state it left, for the caller's audit row."""
    before = job.state
    outbox = Outbox()
    outbox.stop_workers(job, release(job), reason=reason)  # a graceful stop, GPUs freed
    transition(job, JobState.CANCELLED, reason=reason, at=at)
    outbox.send_on_commit()
    broadcast(job, "job.updated")
    request_tick()
    return before


@transaction.atomic
def do_update_job(
    *,
    user: AbstractBaseUser | AnonymousUser,
    job_id: int,
    priority: int | None = None,
    min_gpus: int | None = None,
    max_gpus: int | None = None,
    max_restarts: int | None = None,
    max_runtime_s: int | None = None,
    after: Any = None,
) -> Job:
    """Change a job's priority, elastic range, restarts, run-time limit or dependencies.

    The requested GPUs must stay inside the range; restarts and the run-time
    limit obey the same bounds and tenant ceilings as at submission.  A
    run-time limit the running job has already passed stops it at the next
    tick.  ``after`` replaces the dependencies of a job that still waits
    (pending) by the submission's rules, and may not close a cycle; met at
    once, the job is queued.  ``None`` leaves a setting as it is.
    """
    job: Job = Job.objects.select_for_update().select_related("tenant").get(pk=job_id)
    _check_writable(user, job)
    if job.state in TERMINAL_STATES:
        raise JobConflictError(f"job {job.pk} is {job.state}: nothing to change")
    errors = FieldErrors()
    if priority is not None and not 0 <= priority <= 100:
        errors.add("priority", "Must be between 0 and 100.")
    new_min = job.min_gpus if min_gpus is None else min_gpus
    new_max = job.max_gpus if max_gpus is None else max_gpus
    if new_min < 1:
        errors.add("min_gpus", "Must be at least 1.")
    if new_max > MAX_GPUS_PER_JOB:
        errors.add("max_gpus", f"Must be at most {MAX_GPUS_PER_JOB}.")
    if new_min > new_max:
        errors.add("min_gpus", "min_gpus cannot exceed max_gpus.")
    elif not new_min <= job.gpus <= new_max:
        errors.add("non_field_errors", f"The range must contain the {job.gpus} requested GPUs.")
    if new_max > job.batch_size:
        errors.add("max_gpus", "The global batch needs at least one sample per GPU.")
    if max_restarts is not None and not 0 <= max_restarts <= MAX_RESTARTS:
        errors.add("max_restarts", f"Must be between 0 and {MAX_RESTARTS}.")
    if max_runtime_s is not None and not 1 <= max_runtime_s <= MAX_RUNTIME_S:
        errors.add("max_runtime_s", f"Must be between 1 and {MAX_RUNTIME_S}.")
    _check_ceilings(job.tenant, max_restarts, max_runtime_s, errors)
    new_after = _check_new_after(job, after, errors)
    errors.raise_if_any()
    before = audit.snapshot(job, UPDATE_AUDIT_FIELDS)
    now = timezone.now()
    if priority is not None and priority != job.priority:
        record(
            job,
            EventKind.PRIORITY,
            now,
            f"priority {job.priority} → {priority}",
            data={"from": job.priority, "to": priority},
        )
        job.priority = priority
    if (new_min, new_max) != (job.min_gpus, job.max_gpus):
        record(
            job,
            EventKind.RANGE,
            now,
            f"elastic range {job.min_gpus}-{job.max_gpus} → {new_min}-{new_max}",
            data={"from": [job.min_gpus, job.max_gpus], "to": [new_min, new_max]},
        )
        job.min_gpus, job.max_gpus = new_min, new_max
    _update_limits(job, max_restarts, max_runtime_s, now)
    job.save()
    old, new = audit.changed(before, audit.snapshot(job, UPDATE_AUDIT_FIELDS))
    if new_after is not None:
        old["after"], new["after"] = replace_dependencies(job, new_after), after_field(new_after)
        record(job, EventKind.NOTE, now, "waits for: " + (", ".join(
            f"{a.kind} {a.target}" for a in new_after) or "nothing"))  # fmt: skip
        settle(job, at=now)
    if new:  # a request that changes nothing is no change
        audit.record("job.update", obj=job, tenant=job.tenant, user=user, before=old, after=new)
    broadcast(job, "job.updated")
    return job


def _check_new_after(job: Job, after: Any, errors: FieldErrors) -> tuple[After, ...] | None:
    """The checked new dependencies of ``job`` (None: not asked to change them)."""
    if after is None:
        return None
    if job.state != JobState.PENDING or job.array_id is not None:
        errors.add("after", f"Only a waiting job's dependencies change; job {job.pk} is {job.state}"
                   + (" (an array task)." if job.array_id is not None else "."))  # fmt: skip
        return None
    checked = check_after(tenant=job.tenant, raw=after, add_error=errors.add)
    loop = check_no_cycle(job_id=job.pk, after=checked)
    if loop is not None:
        errors.add("after", loop)
    return checked


def _update_limits(
    job: Job, max_restarts: int | None, max_runtime_s: int | None, now: datetime
) -> None:
    """Set checked restarts and run-time limit on ``job`` (saved by the caller), with an event."""
    changes: list[str] = []
    data: dict[str, Any] = {}
    if max_restarts is not None and max_restarts != job.max_restarts:
        changes.append(f"restarts {job.max_restarts} → {max_restarts}")
        data["max_restarts"] = {"from": job.max_restarts, "to": max_restarts}
        job.max_restarts = max_restarts
    if max_runtime_s is not None and max_runtime_s != job.max_runtime_s:
        before = "none" if job.max_runtime_s is None else f"{job.max_runtime_s} s"
        changes.append(f"run-time limit {before} → {max_runtime_s} s")
        data["max_runtime_s"] = {"from": job.max_runtime_s, "to": max_runtime_s}
        job.max_runtime_s = max_runtime_s
    if changes:
        record(job, EventKind.LIMITS, now, ", ".join(changes), data=data)


def tenant_jct_stats(tenant: Tenant, since: datetime | None = None) -> JctStats:
    """JCT statistics of one tenant's completed jobs."""
    return jct_stats(Job.objects.filter(tenant=tenant), since)


def cluster_jct_stats(since: datetime | None = None) -> JctStats:
    """JCT statistics of every completed job in the cluster."""
    return jct_stats(Job.objects.all(), since)


__all__ = [
    "JOB_FIELDS",
    "JobConflictError",
    "JobError",
    "JobPermissionError",
    "JobSpec",
    "JobValidationError",
    "after_field",
    "check_job_spec",
    "check_queue_room",
    "cluster_jct_stats",
    "create_job",
    "create_task_retry",
    "default_limits",
    "do_cancel_job",
    "do_set_parallelism",
    "do_submit_job",
    "do_update_job",
    "placement_problem",
    "tenant_jct_stats",
]
