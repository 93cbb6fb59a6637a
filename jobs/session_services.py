"""Session services: ``check_session_spec`` validates a start, ``do_start_session`` and
``do_stop_session`` change state, ``stop_session`` ends one for the system (culling).

A session is a job (``jobs.sessions``): it is created, queued, placed, accounted, audited
and cancelled through the same writers as every job (``jobs.services``, ``jobs.lifecycle``,
``jobs.holdings``); this module only adds what a session asks for and the rules of its
limits: an idle timeout and a maximum lifetime (the job's ``max_runtime_s``), each with the
tenant's default and refused above the tenant's ceiling, naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from audit import services as audit
from bundles.models import CodeBundle
from inventory.services import current_spec
from jobs.choices import TERMINAL_STATES, JobKind, JobState, LabAccess, Launcher, RecoveryMode
from jobs.errors import JobConflictError, JobPermissionError, JobValidationError
from jobs.lifecycle import broadcast, request_tick, save_fields, transition
from jobs.models import Job
from jobs.program_spec import ProgramSpec
from jobs.resource_requests import REQUEST_FIELDS, ResourceRequest, check_request, check_satisfiable
from jobs.services import (
    MAX_GPUS_PER_JOB,
    NAME_MAX,
    SUBMIT_AUDIT_FIELDS,
    FieldErrors,
    JobSpec,
    cancel_locked,
    check_queue_room,
    create_job,
    placement_problem,
    type_quota_admits,
)
from jobs.session_bundle import empty_bundle
from jobs.sessions import may_open
from scheduler.priority import CLASS_PRIORITY
from tenancy.models import Role, Tenant
from tenancy.services import can_write
from workers.environment import EnvironmentSpec, check_environment
from workers.program import ProgramError, check_code_id

SESSION_ENTRYPOINT = ("lab",)
"""A session's entrypoint: the agent ignores it and starts the Jupyter server itself."""
SESSION_FIELDS = (
    "name",
    "gpus",
    "priority",
    "idle_timeout_s",
    "max_lifetime_s",
    "lab_access",
    "code",
    "environment",
    *REQUEST_FIELDS,
)
"""What a start may name besides ``tenant``."""
SESSION_AUDIT_FIELDS = (*SUBMIT_AUDIT_FIELDS, "kind", "idle_timeout_s", "lab_access")
DEFAULT_NAME = "session"
MAX_SECONDS = 366 * 24 * 3600


@dataclass(frozen=True)
class SessionSpec:
    """A checked session start: the job it is (``job``, its program settled at start) and
    what only a session has."""

    job: JobSpec
    idle_timeout_s: int
    lab_access: str
    bundle: CodeBundle | None
    """The tenant's own code, or None for the portal's empty bundle."""
    environment: EnvironmentSpec


def _whole(
    data: Mapping[str, Any],
    key: str,
    lo: int,
    hi: int,
    default: int | None,
    add: Callable[[str, str], None],
) -> int | None:
    """A whole number from ``lo`` to ``hi`` (``default`` when left out or empty)."""
    raw = data.get(key)
    if raw is None or raw == "":
        if default is None:
            add(key, "This field is required.")
        return default
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        add(key, "Must be a whole number.")
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        add(key, "Must be a whole number.")
        return None
    if not lo <= value <= hi:
        add(key, f"Must be between {lo} and {hi}.")
        return None
    return value


def _priority(raw: Any, add: Callable[[str, str], None]) -> int:
    """A priority 0-100, or a class name (``high``, ``normal``, ``low``) for its priority."""
    if isinstance(raw, str) and raw.strip().lower() in CLASS_PRIORITY:
        return CLASS_PRIORITY[raw.strip().lower()]
    value = _whole({"priority": raw}, "priority", 0, 100, 50, add)
    return 50 if value is None else value


def _ceilinged(
    data: Mapping[str, Any],
    key: str,
    default: int,
    ceiling: int,
    what: str,
    slug: str,
    add: Callable[[str, str], None],
) -> int:
    """``key`` in seconds: the tenant's ``default`` when left out; above ``ceiling``: refused."""
    value = _whole(data, key, 1, MAX_SECONDS, default, add)
    if value is not None and value > ceiling:
        add(key, f"Tenant {slug} allows a session {what} of at most {ceiling} s, not {value} s.")
    return default if value is None else value


def _code(tenant: Tenant, raw: Any, add: Callable[[str, str], None]) -> CodeBundle | None:
    if raw is None or raw == "":
        return None
    try:
        check_code_id(raw)
    except ProgramError as exc:
        add("code", exc.message[:1].upper() + exc.message[1:] + ".")
        return None
    bundle = CodeBundle.objects.filter(tenant=tenant, sha256=raw).first()
    if bundle is None:
        add("code", f"No code bundle {raw[:12]}… in tenant {tenant.slug}.")
    return bundle


def _environment(
    raw: Any, bundle: CodeBundle | None, add: Callable[[str, str], None]
) -> EnvironmentSpec:
    try:
        spec = check_environment(raw)
        if spec.indexes and not settings.ENVIRONMENT_ALLOW_JOB_INDEX:
            raise ProgramError(
                "environment.indexes",
                "this portal does not let a job name its own package index",
            )
        if bundle is not None:  # the agent installs the bundle's first: both within the count
            spec.with_bundle(bundle.requirements)
        return spec
    except ProgramError as exc:
        add(exc.field, exc.message[:1].upper() + exc.message[1:] + ".")
        return EnvironmentSpec()


def check_session_spec(*, tenant: Tenant, data: Mapping[str, Any]) -> SessionSpec:
    """Validate a session start for ``tenant``; every refusal names its field (400).

    ``gpus`` 1 up to the tenant's quota, placeable on the fabric and on some server (types,
    selector, CPU and memory as for jobs); ``priority`` 0-100 or a class name;
    ``idle_timeout_s`` and ``max_lifetime_s`` within the tenant's session ceilings, its
    defaults when left out; ``lab_access`` ``creator`` (default) or ``tenant``; ``code``
    one of the tenant's bundles (optional); ``environment`` as for a program.
    """
    errors = FieldErrors()
    add = errors.add
    unknown = sorted(str(key) for key in data if key not in SESSION_FIELDS)
    if unknown:
        add("non_field_errors", f"Unknown field(s): {', '.join(unknown)}.")
    name = data.get("name") or DEFAULT_NAME
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        add("name", "A name of printable characters.")
        name = DEFAULT_NAME
    elif len(name) > NAME_MAX:
        add("name", f"At most {NAME_MAX} characters.")
    gpus = _whole(data, "gpus", 1, MAX_GPUS_PER_JOB, 1, add)
    priority = _priority(data.get("priority"), add)
    slug = tenant.slug
    idle = _ceilinged(
        data,
        "idle_timeout_s",
        tenant.default_session_idle_s,
        tenant.session_idle_ceiling_s,
        "idle timeout",
        slug,
        add,
    )
    lifetime = _ceilinged(
        data,
        "max_lifetime_s",
        tenant.default_session_lifetime_s,
        tenant.session_lifetime_ceiling_s,
        "lifetime",
        slug,
        add,
    )
    access = data.get("lab_access") or LabAccess.CREATOR
    if access not in LabAccess.values:
        add("lab_access", f"Choose one of: {', '.join(LabAccess.values)}.")
    bundle = _code(tenant, data.get("code"), add)
    environment = _environment(data.get("environment"), bundle, add)
    request = check_request(
        data,
        default_cpus=tenant.default_cpus_per_gpu,
        default_mem_mib=tenant.default_mem_per_gpu_mib,
        add_error=add,
    )
    if gpus is not None:
        _check_size(tenant, gpus, request, add)
    if not errors.fields and gpus is not None:
        check_satisfiable(current_spec(), request, gpus, add)
    errors.raise_if_any()
    assert gpus is not None
    job = JobSpec(
        name=name.strip(),
        workload="",
        args={},
        gpus=gpus,
        min_gpus=gpus,
        max_gpus=gpus,
        batch_size=gpus,
        priority=priority,
        recovery=RecoveryMode.CONSISTENT,
        checkpoint_interval=50,
        program=None,  # the bundle is settled at start (the empty one is stored then)
        max_restarts=0,
        max_runtime_s=lifetime,
        request=request,
    )
    return SessionSpec(
        job=job,
        idle_timeout_s=idle,
        lab_access=str(access),
        bundle=bundle,
        environment=environment,
    )


def _check_size(
    tenant: Tenant, gpus: int, request: ResourceRequest, add: Callable[[str, str], None]
) -> None:
    if gpus > tenant.gpu_quota:
        add(
            "gpus",
            f"Asks for {gpus} GPUs but tenant {tenant.slug} has a quota of {tenant.gpu_quota}.",
        )
    elif not type_quota_admits(tenant, gpus, request.gpu_types):
        add(
            "gpus",
            f"Asks for {gpus} GPUs but tenant {tenant.slug}'s quota of every type it "
            f"accepts is smaller: {tenant.gpu_type_quota}.",
        )
    elif problem := placement_problem(gpus):
        add("gpus", problem)


def _program(spec: SessionSpec, bundle: CodeBundle) -> ProgramSpec:
    return ProgramSpec(
        bundle=bundle,
        entrypoint=SESSION_ENTRYPOINT,
        launcher=Launcher.SESSION,
        env={},
        environment=spec.environment,
    )


@transaction.atomic
def do_start_session(
    *,
    user: AbstractBaseUser | AnonymousUser,
    tenant: Tenant,
    spec: SessionSpec,
    at: datetime | None = None,
) -> Job:
    """Start a session for ``user`` in ``tenant``: a job of kind ``session`` that is queued
    at once and placed, accounted and audited (``job.submit``) like any job."""
    if not can_write(user, tenant):
        raise JobPermissionError(f"you cannot start sessions in tenant {tenant.slug!r}")
    check_queue_room(tenant_id=tenant.pk)
    now = at or timezone.now()
    bundle = spec.bundle or empty_bundle(user=user, tenant=tenant)
    job_spec = dataclasses.replace(spec.job, program=_program(spec, bundle))
    job = create_job(user=user, tenant=tenant, spec=job_spec, at=now)
    job.kind = JobKind.SESSION
    job.idle_timeout_s = spec.idle_timeout_s
    job.lab_access = spec.lab_access
    save_fields(job, "kind", "idle_timeout_s", "lab_access", "updated_at")
    transition(job, JobState.QUEUED, reason="accepted: a session waiting for GPUs", at=now)
    audit.record(
        "job.submit",
        obj=job,
        tenant=tenant,
        user=user,
        after={**audit.snapshot(job, SESSION_AUDIT_FIELDS), "state": job.state},
    )
    broadcast(job, "job.created")
    request_tick()
    return job


def may_stop(user: AbstractBaseUser | AnonymousUser, job: Job) -> bool:
    """Whether ``user`` may stop session ``job``: who may open it, an owner of its tenant,
    or a cluster admin (who may close any session without seeing into it)."""
    if not user.is_authenticated:
        return False
    if getattr(user, "is_staff", False) or may_open(user, job):
        return True
    return job.tenant.memberships.filter(user_id=user.pk, role=Role.OWNER).exists()


@transaction.atomic
def do_stop_session(
    *, user: AbstractBaseUser | AnonymousUser, job_id: int, reason: str = ""
) -> Job:
    """Stop session ``job_id`` for ``user`` (audited ``job.cancel``): it ends cancelled, its
    GPUs are released and its agent syncs the home and stops the server.

    A fellow member who may not open it gets 403; an ended session 409.
    """
    job = Job.objects.select_related("tenant").get(pk=job_id, kind=JobKind.SESSION)
    if not may_stop(user, job):
        raise JobPermissionError(
            "only its creator, an owner of its tenant or an admin may stop this session"
        )
    why = reason or f"session stopped by {user.get_username()}"
    return stop_session(job.pk, reason=why, user=user)


def stop_session(
    job_id: int,
    *,
    reason: str,
    user: AbstractBaseUser | AnonymousUser | None = None,
    at: datetime | None = None,
) -> Job:
    """End session ``job_id`` cancelled with ``reason`` (a final event), in the caller's
    transaction: its workers are stopped (gracefully, after commit), its GPUs released.
    ``user`` None: the system (idle culling), audited without a person."""
    job: Job = Job.objects.select_for_update().select_related("tenant").get(pk=job_id)
    if job.state in TERMINAL_STATES:
        raise JobConflictError(f"session {job.pk} is already {job.state}")
    before = cancel_locked(job, reason=reason, at=at or timezone.now())
    audit.record(
        "job.cancel",
        obj=job,
        tenant=job.tenant,
        user=user,
        before={"state": before},
        after={"state": job.state, "reason": reason},
    )
    return job


def check_session_update(job: Job, fields: Mapping[str, Any]) -> None:
    """Refuse (400, naming the field) a change to session ``job`` that a session may not
    have: another GPU range (a session is fixed-size), restarts, or a lifetime
    (``max_runtime_s``) above its tenant's session ceiling. Batch jobs pass."""
    if job.kind != JobKind.SESSION:
        return
    errors = FieldErrors()
    for key in ("min_gpus", "max_gpus"):
        if fields.get(key) not in (None, job.gpus):
            errors.add(key, f"A session is fixed-size: it keeps its {job.gpus} GPUs.")
    if fields.get("max_restarts") not in (None, 0):
        errors.add("max_restarts", "A session is not restarted.")
    lifetime = fields.get("max_runtime_s")
    ceiling = job.tenant.session_lifetime_ceiling_s
    if isinstance(lifetime, int) and lifetime > ceiling:
        errors.add(
            "max_runtime_s",
            f"Tenant {job.tenant.slug} allows a session lifetime of at most {ceiling} s, "
            f"not {lifetime} s.",
        )
    errors.raise_if_any()


def check_not_session_launcher(data: Mapping[str, Any]) -> None:
    """Refuse a batch submission that names launcher ``session`` (400): sessions start at
    ``/api/v1/sessions/``, with an idle timeout and a fixed size."""
    if data.get("launcher") == Launcher.SESSION:
        raise JobValidationError(
            "launcher: start sessions at /api/v1/sessions/",
            {"launcher": ["A session is started at /api/v1/sessions/, not submitted as a job."]},
        )
