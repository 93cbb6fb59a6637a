"""Applying bound decisions to the database, and sending agent commands after commit.

Runs inside the tick's transaction: GPU and cable rows, job state, parallelism
and events change together or not at all; the agents hear about it only once
the transaction has committed (``Outbox.send_on_commit``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from fabric.allocator import Allocation
from fabric.topology import FabricSpec
from inventory.models import Gpu
from jobs.agent_commands import GpuHome, JobLaunch, membership_commands
from jobs.choices import EventKind, JobState
from jobs.control.binding import Bound
from jobs.models import Job, JobCable, JobGpu
from jobs.services import _apply_transition, _broadcast, _record
from workers.protocol import Command

log = logging.getLogger(__name__)


@dataclass
class Outbox:
    """Agent commands collected during a transaction, sent once it commits."""

    commands: list[tuple[str, Command]] = field(default_factory=list)

    def extend(self, commands: Iterable[tuple[str, Command]]) -> None:
        self.commands.extend(commands)

    def send_on_commit(self) -> None:
        """Register the sending with the current transaction."""
        pending = list(self.commands)
        self.commands.clear()
        if pending:
            transaction.on_commit(lambda: send_commands(pending))


def send_commands(commands: Sequence[tuple[str, Command]]) -> None:
    """Put each command on its node's queue (``agent.<node>``), over one broker connection."""
    from portal.celery import agent_queue, app
    from workers.protocol import AGENT_COMMAND_TASK

    try:
        with app.producer_or_acquire() as producer:
            for node, command in commands:
                app.send_task(
                    AGENT_COMMAND_TASK,
                    args=[command.to_dict()],
                    queue=agent_queue(node),
                    producer=producer,
                    ignore_result=True,
                )
    except Exception:  # the next tick re-derives state; lost commands are logged
        log.exception("could not send %d agent commands", len(commands))


def release_job(job: Job, outbox: Outbox | None, *, reason: str) -> tuple[int, ...]:
    """Free everything ``job`` holds; with an outbox, tell its agents to stop its workers."""
    held = tuple(
        JobGpu.objects.filter(job=job).order_by("rank").values_list("gpu__index", flat=True)
    )
    if not held:
        return held
    homes = {
        index: GpuHome(node=node, local=local)
        for index, node, local in Gpu.objects.filter(index__in=held).values_list(
            "index", "server__node", "local"
        )
    }
    store_allocation(job, None, None)
    job.save(update_fields=["allocation"])
    if outbox is not None:
        outbox.extend(membership_commands(launch_of(job), held, (), homes, reason=reason))
    return held


def note_waiting(job_ids: Mapping[int, str], now: datetime) -> None:
    """Record why queued jobs wait (an event only when the reason changes)."""
    for job in Job.objects.filter(pk__in=job_ids, state=JobState.QUEUED):
        reason = job_ids[job.pk][:300]
        if job.wait_reason != reason:
            job.wait_reason = reason
            job.save(update_fields=["wait_reason"])
            _record(job, EventKind.NOTE, now, reason=f"waiting: {reason}")
            _broadcast(job, "job.updated")


def launch_of(job: Job) -> JobLaunch:
    """The fixed part of a job's StartWorkers commands."""
    return JobLaunch(
        job_id=job.pk,
        workload=job.workload,
        args=job.args,
        batch_size=job.batch_size,
        recovery=job.recovery,
        checkpoint_every=job.checkpoint_interval,
    )


def store_allocation(
    job: Job,
    allocation: Allocation | None,
    spec: FabricSpec | None,
) -> None:
    """Replace the job's GPU and cable rows (the DB's uniqueness forbids double booking).

    The caller saves ``job`` (its ``allocation`` field changes here).
    """
    if job.allocation or job.parallelism:  # a job that holds nothing has no rows
        JobGpu.objects.filter(job=job).delete()
        JobCable.objects.filter(job=job).delete()
    job.allocation = allocation.to_dict() if allocation is not None else {}
    if allocation is None or spec is None:
        return
    gpu_rows = dict(Gpu.objects.filter(index__in=allocation.gpus).values_list("index", "id"))
    JobGpu.objects.bulk_create(
        JobGpu(job=job, gpu_id=gpu_rows[g], rank=rank) for rank, g in enumerate(allocation.gpus)
    )
    JobCable.objects.bulk_create(
        JobCable(job=job, leaf=leaf, port=port, spine=spec.spine_of_uplink(port))
        for leaf, port in allocation.cables()
    )


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
        store_allocation(job, item.allocation, spec)
        # Each transition saves the whole job, allocation included.
        if not new:
            _apply_transition(job, JobState.QUEUED, reason=reason, at=now)
        elif not old:
            job.last_service_at = now
            job.wait_reason = ""
            _apply_transition(job, JobState.RUNNING, reason=reason, at=now, parallelism=len(new))
        else:
            _apply_transition(job, JobState.SCALING, reason=reason, at=now)
            _record(
                job,
                EventKind.MIGRATED if len(old) == len(new) else EventKind.NOTE,
                now,
                reason=f"switching {len(old)}→{len(new)} GPUs without stopping",
                data={"from": list(old), "to": list(new)},
            )
        outbox.extend(membership_commands(launch_of(job), old, new, homes, reason=reason))
        _broadcast(job, "job.updated")
        changed.append(job.pk)
    return changed
