"""Applying bound decisions to the database; agent commands go out after commit.

Runs inside the tick's transaction: holdings (``jobs.holdings``), job state,
parallelism and events (``jobs.lifecycle``) change together or not at all; the
agents hear about it only once the transaction has committed
(``Outbox.send_on_commit``), after their Redis users know the jobs they start
(``control.agent_users``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from django.conf import settings

from control import agent_users
from control.locked_jobs import locked_jobs
from fabric.allocator import Allocation
from fabric.topology import FabricSpec
from jobs import holdings
from jobs.agent_commands import GpuHome, membership_commands
from jobs.choices import EventKind, JobState
from jobs.lifecycle import Batch, broadcast
from jobs.models import Job
from jobs.outbox import Outbox, launch_of
from scheduler.binding import Bound
from workers.protocol import Command


def note_waiting(job_ids: Mapping[int, str], now: datetime) -> None:
    """Record why queued jobs wait (an event only when the reason changes).

    The reasons are compared on two short columns first; only the jobs whose
    reason changed are locked, saved (one ``UPDATE``) and given an event (one
    ``INSERT``), so a queue that waits for the same reasons costs one query.
    """
    if not job_ids:
        return
    reasons = {pk: reason[:300] for pk, reason in job_ids.items()}
    stale = [
        pk
        for pk, current in Job.objects.filter(pk__in=list(reasons), state=JobState.QUEUED)
        .order_by("pk")
        .values_list("pk", "wait_reason")
        if current != reasons[pk]
    ]
    if not stale:
        return
    batch = Batch()
    for job in Job.objects.select_for_update().filter(pk__in=stale, state=JobState.QUEUED):
        reason = reasons[job.pk]
        if job.wait_reason == reason:
            continue
        job.wait_reason = reason
        batch.save_fields(job, "wait_reason")
        batch.record(job, EventKind.NOTE, now, reason=f"waiting: {reason}")
        broadcast(job, "job.updated")
    batch.flush()


def _describe(old: int, new: int, allocation: Allocation | None, planned: int = 0) -> str:
    if allocation is None:
        return f"preempted: gave back {old} GPUs to higher-priority jobs"
    where = f"leaves {list(allocation.leaves)}"
    if allocation.spines:
        where += f", spines {list(allocation.spines)} reserved"
    if old == 0:
        placed = f"placed on {new} GPUs ({where})"
        if planned > new:  # a start on its base: its extras found no shape
            placed += f"; no vClos shape for the planned {planned}: it scales out later"
        return placed
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
    gpu_types: Mapping[int, str] | None = None,
) -> list[int]:
    """Write every bound decision; return the ids of the jobs that changed.

    A decision that leaves a job on the GPUs it has is no change and costs
    nothing.  The others are written together: one ``SELECT ... FOR UPDATE``
    of their jobs (with tenant and code, which the agent commands need:
    :func:`control.locked_jobs.locked_jobs`), their
    holdings in one delete and one insert per table (``holdings.store_many``),
    the jobs in one ``UPDATE`` and their events in one ``INSERT``
    (``lifecycle.Batch``).  ``gpu_types`` (each GPU's type): a start records the type
    its job runs on (``Job.ran_on_type``, for usage and fair share by type).
    """
    moves = {jobs[item.job]: item for item in bound if tuple(item.old_gpus) != tuple(item.new_gpus)}
    if not moves:
        return []
    locked = locked_jobs(list(moves))  # the jobs' rows, in id order, tenant and code with
    # Cancelled or finished since the snapshot: left alone.
    live = {job.pk: job for job in locked if job.state in (JobState.QUEUED, JobState.RUNNING)}
    order = [pk for pk in moves if pk in live]  # the binding's order, as before
    holdings.store_many([(live[pk], moves[pk].allocation) for pk in order], spec)
    batch = Batch()
    commands: list[tuple[str, Command]] = []
    for pk in order:
        job, item = live[pk], moves[pk]
        reason = (reason_override or {}).get(item.job) or _describe(
            len(item.old_gpus), len(item.new_gpus), item.allocation, item.planned
        )
        if not item.old_gpus and item.new_gpus and gpu_types:
            job.ran_on_type = gpu_types.get(item.new_gpus[0], "")
        _record_move(batch, job, item, reason, now)
        commands += membership_commands(
            launch_of(job), item.old_gpus, item.new_gpus, homes, reason=reason
        )
        broadcast(job, "job.updated")
    batch.flush()
    # Starts carry their jobs' Redis passwords; on commit, before the outbox sends them,
    # the jobs' users are made and the nodes' agent users given their keys (agent_users).
    commands = agent_users.with_job_passwords(commands)
    agent_users.dispatched_on_commit(commands)
    outbox.extend(commands)
    return order


def _record_move(batch: Batch, job: Job, item: Bound, reason: str, now: datetime) -> None:
    """Add one job's move to the batch: its new state, and the event that says how it moves.

    A start makes the job running, a move to no GPUs queues it, anything else is a
    switch (``scaling``): without stopping for the elastic runtime, or by stopping
    and restarting its workers as a new run for a torchrun program.
    """
    old, new = item.old_gpus, item.new_gpus
    kept: tuple[str, ...] = ("allocation",)
    restarts = job.restarts_to_resize
    if restarts and new:
        job.generation += 1  # each start of a torchrun program is a new run
        job.finished_workers = []
        kept += ("generation", "finished_workers")
    if not new:
        batch.transition(job, JobState.QUEUED, reason=reason, at=now, fields=kept)
        return
    if not old:
        job.last_service_at = now
        job.wait_reason = ""
        fields = (*kept, "last_service_at", "wait_reason", "ran_on_type")
        batch.transition(
            job, JobState.RUNNING, reason=reason, at=now, parallelism=len(new), fields=fields
        )
        return
    batch.transition(job, JobState.SCALING, reason=reason, at=now, fields=kept)
    if restarts:
        batch.record(
            job,
            EventKind.NOTE,
            now,
            reason=f"torchrun: stopping {len(old)} workers (SIGTERM, grace "
            f"{settings.TORCHRUN_GRACE_SECONDS:g} s), restarting at {len(new)} as run "
            f"{job.generation}; the program resumes from its CHECKPOINT_DIR",
            data={"from": list(old), "to": list(new), "generation": job.generation},
        )
        return
    batch.record(
        job,
        EventKind.MIGRATED if len(old) == len(new) else EventKind.NOTE,
        now,
        reason=f"switching {len(old)}→{len(new)} GPUs without stopping",
        data={"from": list(old), "to": list(new)},
    )
