"""Applying bound decisions to the database; agent commands go out after commit.

Runs inside the tick's transaction: holdings (``jobs.holdings``), job state,
parallelism and events (``jobs.lifecycle``) change together or not at all; the
agents hear about it only once the transaction has committed
(``Outbox.send_on_commit``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from django.conf import settings

from fabric.allocator import Allocation
from fabric.topology import FabricSpec
from jobs import holdings
from jobs.agent_commands import GpuHome, membership_commands
from jobs.choices import EventKind, JobState
from jobs.lifecycle import broadcast, record, save_fields, transition
from jobs.models import Job
from jobs.outbox import Outbox, launch_of
from scheduler.binding import Bound


def note_waiting(job_ids: Mapping[int, str], now: datetime) -> None:
    """Record why queued jobs wait (an event only when the reason changes)."""
    for job in Job.objects.filter(pk__in=job_ids, state=JobState.QUEUED):
        reason = job_ids[job.pk][:300]
        if job.wait_reason != reason:
            job.wait_reason = reason
            save_fields(job, "wait_reason")
            record(job, EventKind.NOTE, now, reason=f"waiting: {reason}")
            broadcast(job, "job.updated")


def _describe(old: int, new: int, allocation: Allocation | None) -> str:
    if allocation is None:
        return f"preempted: gave back {old} GPUs to higher-priority jobs"
    where = f"leaves {list(allocation.leaves)}"
    if allocation.spines:
        where += f", spines {list(allocation.spines)} reserved"
    if old == 0:
        return f"placed on {new} GPUs ({where})"
    if new > old:
        return f"scale out {old}→{new}: idle GPUs and throughput still rising ({where})"
    if new < old:
        return f"scale in {old}→{new}: GPUs needed by waiting jobs ({where})"
    return f"migrated to other GPUs ({where})"


def apply_bound(
    spec: FabricSpec,
    bound: Sequence[Bound],
    jobs: Mapping[str, int],
    homes: Mapping[int, GpuHome],
    now: datetime,
    outbox: Outbox,
    *,
    reason_override: Mapping[str, str] | None = None,
) -> list[int]:
    """Write every bound decision; return the ids of the jobs that changed."""
    changed: list[int] = []
    for item in bound:
        job = Job.objects.select_for_update().get(pk=jobs[item.job])
        if job.state not in (JobState.QUEUED, JobState.RUNNING):
            continue  # cancelled or finished since the snapshot: leave it alone
        old, new = item.old_gpus, item.new_gpus
        if tuple(old) == tuple(new):
            continue
        reason = (reason_override or {}).get(item.job) or _describe(
            len(old), len(new), item.allocation
        )
        holdings.store(job, item.allocation, spec)  # saved with the transition below
        restarts = job.restarts_to_resize
        if restarts and new:
            job.generation += 1  # each start of a torchrun program is a new run
            job.finished_workers = []
        if not new:
            transition(job, JobState.QUEUED, reason=reason, at=now)
        elif not old:
            job.last_service_at = now
            job.wait_reason = ""
            transition(job, JobState.RUNNING, reason=reason, at=now, parallelism=len(new))
        elif restarts:
            transition(job, JobState.SCALING, reason=reason, at=now)
            record(
                job,
                EventKind.NOTE,
                now,
                reason=f"torchrun: stopping {len(old)} workers (SIGTERM, grace "
                f"{settings.TORCHRUN_GRACE_SECONDS:g} s), restarting at {len(new)} as run "
                f"{job.generation}; the program resumes from its CHECKPOINT_DIR",
                data={"from": list(old), "to": list(new), "generation": job.generation},
            )
        else:
            transition(job, JobState.SCALING, reason=reason, at=now)
            record(
                job,
                EventKind.MIGRATED if len(old) == len(new) else EventKind.NOTE,
                now,
                reason=f"switching {len(old)}→{len(new)} GPUs without stopping",
                data={"from": list(old), "to": list(new)},
            )
        outbox.extend(membership_commands(launch_of(job), old, new, homes, reason=reason))
        broadcast(job, "job.updated")
        changed.append(job.pk)
    return changed
