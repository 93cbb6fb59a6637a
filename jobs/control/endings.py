"""How a running job ends, whoever noticed: completed or failed.

Shared by the runtime's reports (``finished``/``failed`` events) and by the
exits of a torchrun program's processes (``jobs.control.program_exits``), so a
job ends one way: service accounted, GPUs released (and workers stopped when
some may still run), state and reason recorded, the next tick asked for.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from jobs import holdings
from jobs.choices import JobState
from jobs.lifecycle import broadcast, request_tick, transition
from jobs.models import Job
from jobs.outbox import Outbox

MAX_SERVICE_GAP = timedelta(seconds=60)  # longer silences are not counted as service


def accrue_service(job: Job, now: datetime) -> None:
    """Add GPU-seconds for the time since the last accounting at the current parallelism."""
    if job.last_service_at is not None and job.parallelism:
        gap = min(max(now - job.last_service_at, timedelta(0)), MAX_SERVICE_GAP)
        job.attained_gpu_seconds += job.parallelism * gap.total_seconds()
    job.last_service_at = now


def complete_job(job: Job, reason: str, now: datetime) -> None:
    """The job's training finished and its workers have exited."""
    accrue_service(job, now)  # saved with the transition below
    holdings.release(job)  # its workers have exited: nothing to stop
    transition(job, JobState.COMPLETED, reason=reason, at=now)
    broadcast(job, "job.updated")
    request_tick()


def fail_job(job: Job, error: str, now: datetime) -> None:
    """The job cannot go on: stop what may still run of it and say why."""
    outbox = Outbox()
    outbox.stop_workers(job, holdings.release(job), reason="failed")
    job.failure_reason = error[:500]
    transition(job, JobState.FAILED, reason=f"failed: {error}"[:500], at=now)
    outbox.send_on_commit()
    broadcast(job, "job.updated")
    request_tick()
