"""Interactive sessions: who may open one, when it was last used, where its home lives.

A session is a :class:`~jobs.models.Job` of ``kind="session"`` (``jobs.choices.JobKind``):
a fixed-size job whose agent runs a Jupyter server instead of a program. The lab proxy
(HTTP and WebSocket) asks :func:`lab_job` on every request and connection, and reports
activity through :func:`note_activity`; the idle culling reads ``last_activity_at``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.http import Http404

from jobs.choices import JobKind, LabAccess
from jobs.lifecycle import save_fields
from jobs.models import Job
from tenancy.models import WRITE_ROLES, Membership

HOMES_ROOT = "homes"
"""Artifact-store folder of the per-user persistent session homes."""


def _not_found(job_id: int) -> Http404:
    return Http404(f"No session {job_id}.")


def may_open(user: Any, job: Job) -> bool:
    """Whether ``user`` may open session ``job``'s lab (the rule of :func:`lab_job`).

    A member of the session's tenant who may submit jobs there (owner or member: a lab runs
    code, which a viewer may not), and, while ``lab_access`` is ``creator``, only the user
    who started it. Cluster admins follow the same rule: being staff opens no one's lab.
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if not job.is_session:
        return False
    if job.lab_access != LabAccess.TENANT and job.submitter_id != user.pk:
        return False
    return Membership.objects.filter(
        user_id=user.pk, tenant_id=job.tenant_id, role__in=WRITE_ROLES
    ).exists()


def lab_job(user: Any, job_id: int) -> Job:
    """The session ``job_id`` (running or not) whose lab ``user`` may open.

    Raises ``Http404`` when there is no such job, it is not a session, or ``user`` may not
    open it (:func:`may_open`): the answer is the same, so nothing tells a stranger that
    the session exists.
    """
    job: Job | None = (
        Job.objects.select_related("tenant")
        .filter(pk=job_id, kind=JobKind.SESSION)
        .only(
            "pk",
            "kind",
            "state",
            "tenant__slug",
            "tenant_id",
            "submitter_id",
            "lab_access",
            "gpus",
            "started_at",
            "last_activity_at",
            "idle_timeout_s",
            "max_runtime_s",
        )
        .first()
    )
    if job is None or not may_open(user, job):
        raise _not_found(job_id)
    return job


def note_activity(job_id: int, when: datetime) -> None:
    """Record activity on session ``job_id`` at ``when``: ``last_activity_at`` becomes the
    later of its value and ``when``, in one ``UPDATE`` (two reports racing keep the later,
    never the one that wrote last). A job that no longer exists is ignored."""
    if not Job.objects.filter(pk=job_id, kind=JobKind.SESSION).exists():
        return
    row = Job(pk=job_id)
    row.last_activity_at = Greatest(Coalesce(F("last_activity_at"), Value(when)), Value(when))
    try:
        save_fields(row, "last_activity_at")
    except DatabaseError:  # Django's "did not affect any rows": deleted since the check
        if Job.objects.filter(pk=job_id).exists():
            raise


def home_prefix(job: Job) -> str:
    """The artifact-store prefix of the persistent home of ``job``'s submitter in its tenant:
    ``homes/<tenant slug>/<user id>/`` (the agent restores from and syncs to it)."""
    return f"{HOMES_ROOT}/{job.tenant.slug}/{job.submitter_id}/"
