"""The retention run: delete what expired (``jobs.retention``'s rules), in bounded batches.

::

    expire_outputs(now)                                 the jobs.tasks.expire_outputs beat task
        ├── policies       one per tenant: its overrides, else the cluster's days
        ├── artifacts      up to RETENTION_BATCH expired objects, oldest jobs first:
        │                  the object (and a checkpoint's manifest) from the store, then
        │                  its row; a store error keeps the row for the next run
        ├── logs           stored lines of jobs whose log expired (a few jobs per run)
        ├── history        one event per job: "expired N artifacts (X bytes)",
        │                  "expired the log"
        └── coordination   finished jobs' Redis keys (JobControl.cleanup), a few
                           minutes after they ended, once (coordination_cleaned_at)

Running and queued jobs, and jobs that ended less than their days ago, are
never touched.  The clock is a parameter, so a test can move it.  A job's
prefix was tenant-written: the store deletes there without following a link
(a link is removed as a link; a path through one deletes nothing), so a pass
never reaches outside the prefix it was given.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.artifacts import artifact_store, forget_artifact, manifest_path, prefix_of
from jobs.choices import TERMINAL_STATES, ArtifactKind, EventKind
from jobs.coordination import forget_coordination
from jobs.lifecycle import record, save_fields
from jobs.logs.store import drop_output
from jobs.models import Artifact, Job, LogChunk
from jobs.retention import (
    RetentionPolicy,
    StoredOutput,
    coordination_due,
    policy_for,
    select_expired,
)
from tenancy.models import Tenant
from workers.artifacts import ArtifactStore
from workers.beneath import LinkRefused

log = logging.getLogger(__name__)

COORDINATION_DELAY = timedelta(minutes=5)
"""How long after a job ended its Redis keys are removed (its last events are read first)."""

LOG_JOBS_PER_RUN = 20
"""Jobs whose stored lines one run deletes at most (each may hold many chunks)."""


@dataclass
class ExpiryResult:
    """What one retention run did (for the task's log and for tests)."""

    artifacts: int = 0
    bytes: int = 0
    logs: int = 0
    coordination: int = 0
    errors: int = 0
    full: bool = False
    """A batch was full: more may have expired than this run deleted."""
    jobs: list[int] = field(default_factory=list)


def cluster_policy() -> RetentionPolicy:
    """The cluster's days (``ARTIFACT_RETENTION_DAYS``, ``LOG_RETENTION_DAYS``)."""
    return RetentionPolicy(
        artifact_days=int(settings.ARTIFACT_RETENTION_DAYS),
        log_days=int(settings.LOG_RETENTION_DAYS),
    )


def tenant_policies(default: RetentionPolicy) -> dict[int, RetentionPolicy]:
    """Every tenant's policy, by tenant id."""
    rows = Tenant.objects.values_list("pk", "artifact_retention_days", "log_retention_days")
    return {
        pk: policy_for(
            artifact,
            logs,
            artifact_default=default.artifact_days,
            log_default=default.log_days,
        )
        for pk, artifact, logs in rows
    }


def _expired_rows(
    policies: dict[int, RetentionPolicy], now: datetime, limit: int
) -> list[StoredOutput]:
    """Candidate rows, filtered per tenant in the database, then by the pure rule."""
    found: list[StoredOutput] = []
    for tenant_id, policy in policies.items():
        past = Q(kind=ArtifactKind.LOG, job__finished_at__lt=policy.log_cutoff(now)) | (
            ~Q(kind=ArtifactKind.LOG) & Q(job__finished_at__lt=policy.artifact_cutoff(now))
        )
        rows = (
            Artifact.objects.filter(past, job__tenant_id=tenant_id, job__state__in=TERMINAL_STATES)
            .order_by("job__finished_at", "id")
            .values_list("id", "job_id", "kind", "size", "job__finished_at")[:limit]
        )
        found += [
            StoredOutput(
                id=pk, tenant_id=tenant_id, job_id=job, kind=kind, size=size, job_ended_at=ended
            )
            for pk, job, kind, size, ended in rows
        ]
    default = cluster_policy()
    return select_expired(found, policies, default, now, limit)


def _delete_objects(store: ArtifactStore, artifact: Artifact) -> bool:
    """Remove the artifact's object (and a checkpoint's manifest); False on a store error.

    A path that meets a link (the job's program replaced one of its folders)
    names nothing in the store any more: nothing is followed or deleted, the
    row goes, and the link itself goes with the job's folders
    (:func:`_sweep_leftovers`).
    """
    try:
        store.delete(artifact.path)
        manifest = manifest_path(artifact.path)
        if manifest and artifact.kind in (ArtifactKind.CHECKPOINT, ArtifactKind.FINAL):
            store.delete(manifest)
    except LinkRefused as exc:
        log.warning("retention: %s meets a link (%s): not followed", artifact.path, exc)
    except Exception:
        log.exception("retention: could not delete %s; kept for the next run", artifact.path)
        return False
    return True


def expire_outputs(
    *,
    now: datetime | None = None,
    batch: int | None = None,
    store: ArtifactStore | None = None,
    redis_url: str | None = None,
) -> ExpiryResult:
    """Delete what expired by ``now`` (default: the current time); at most ``batch`` objects."""
    now = now or timezone.now()
    limit = int(settings.RETENTION_BATCH if batch is None else batch)
    store = store or artifact_store()
    default = cluster_policy()
    policies = tenant_policies(default)
    result = ExpiryResult()
    gone: dict[int, list[tuple[str, int]]] = defaultdict(list)

    expired = _expired_rows(policies, now, limit)
    result.full = len(expired) >= limit
    artifacts = Artifact.objects.in_bulk([o.id for o in expired])
    for output in expired:
        artifact = artifacts.get(output.id)
        if artifact is None:
            continue
        if not _delete_objects(store, artifact):
            result.errors += 1
            continue
        forget_artifact(artifact)
        gone[output.job_id].append((output.kind, output.size))
        result.artifacts += 1
        result.bytes += output.size

    logs_gone = _expire_logs(policies, default, now)
    result.logs = len(logs_gone)
    for job in Job.objects.select_related("tenant").filter(pk__in=set(gone) | set(logs_gone)):
        leftovers = _sweep_leftovers(store, job) if job.pk in gone else 0
        _record_expiry(job, gone.get(job.pk, []), job.pk in logs_gone, now, leftovers)
        result.jobs.append(job.pk)

    result.coordination = _clean_coordination(now, limit, redis_url or str(settings.REDIS_URL))
    return result


def _expire_logs(
    policies: dict[int, RetentionPolicy], default: RetentionPolicy, now: datetime
) -> set[int]:
    """Delete the stored lines of jobs whose log expired; returns their ids."""
    has_lines = Exists(LogChunk.objects.filter(job=OuterRef("pk")))
    done: set[int] = set()
    for tenant_id, policy in policies.items():
        if len(done) >= LOG_JOBS_PER_RUN:
            break
        jobs = Job.objects.filter(
            has_lines,
            tenant_id=tenant_id,
            state__in=TERMINAL_STATES,
            finished_at__lt=policy.log_cutoff(now),
        ).order_by("finished_at", "id")[: LOG_JOBS_PER_RUN - len(done)]
        for job in jobs:
            with transaction.atomic():
                drop_output(job)
                job.log_tail = ""
                save_fields(job, "log_tail")
            done.add(job.pk)
    return done


def _sweep_leftovers(store: ArtifactStore, job: Job) -> int:
    """Once no checkpoint or artifact of ``job`` is recorded, remove what else its folders hold.

    A torchrun program writes its own checkpoints into the shared
    ``checkpoints`` folder, which no row records; they expire with the
    job's last recorded one.  Returns how many objects went.
    """
    if Artifact.objects.filter(job=job).exclude(kind=ArtifactKind.LOG).exists():
        return 0
    removed = 0
    for folder in ("checkpoints", "artifacts"):
        try:
            removed += len(store.delete_prefix(f"{prefix_of(job)}/{folder}"))
        except Exception:
            log.exception("retention: could not sweep %s of job %s", folder, job.pk)
    return removed


def _record_expiry(
    job: Job, gone: list[tuple[str, int]], lines_gone: bool, now: datetime, leftovers: int = 0
) -> None:
    """One history event for what this run deleted of ``job``, and a log line."""
    parts = []
    others = [(kind, size) for kind, size in gone if kind != ArtifactKind.LOG]
    if others:
        total = sum(size for _, size in others)
        parts.append(f"expired {len(others)} artifacts ({total} bytes)")
    if leftovers:
        parts.append(f"removed {leftovers} other files of the job")
    if lines_gone or len(others) < len(gone):
        parts.append("expired the log")
    reason = "; ".join(parts) + " (retention)"
    record(
        job,
        EventKind.EXPIRED,
        now,
        reason=reason,
        data={
            "artifacts": len(others),
            "bytes": sum(size for _, size in others),
            "log": lines_gone or len(others) < len(gone),
            "other_files": leftovers,
        },
    )
    log.info("job %s: %s", job.pk, reason)


def _clean_coordination(now: datetime, limit: int, redis_url: str) -> int:
    """Remove finished jobs' coordination keys from Redis, once each; returns how many jobs."""
    due = Job.objects.filter(
        state__in=TERMINAL_STATES,
        coordination_cleaned_at__isnull=True,
        finished_at__lte=now - COORDINATION_DELAY,
    ).order_by("finished_at", "id")[:limit]
    cleaned = 0
    for job in due:
        if not coordination_due(job.finished_at, now, COORDINATION_DELAY):
            continue
        if not forget_coordination(job.pk, redis_url):
            continue
        job.coordination_cleaned_at = now
        save_fields(job, "coordination_cleaned_at")
        cleaned += 1
    return cleaned
