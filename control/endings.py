"""How a running job ends, whoever noticed: completed, failed, or retried.

Shared by the runtime's reports (``finished``/``failed`` events) and by the
exits of a torchrun program's processes (``control.program_exits``), so a
job ends one way: service accounted, GPUs released (and workers stopped when
some may still run), state and reason recorded, the next tick asked for.

A program that fails is retried while the job has restarts left
(``Job.max_restarts``)::

    program failed ── restarts < max_restarts? ── yes ─▶ queued (event "retried",
                  │                                     attempt k+1 of max+1), resumes
                  │                                     from its latest checkpoint
                  └─ no ─▶ failed ("... after N restarts" when it had any)

Only a failure of the program counts: losing a server, reconcile's requeue
and preemption requeue a job without touching ``restarts``, and a job stopped
at its run-time limit (``control.limits``) fails without a retry.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from django.db import transaction

from control.resume import rewind_to_checkpoint, stored_checkpoints
from jobs import holdings
from jobs.agent_commands import GpuHome
from jobs.choices import ACTIVE_STATES, EventKind, JobState
from jobs.coordination import forget_coordination
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
    """The job's training finished: its members exit by themselves.

    A job that finishes in the middle of a switch also has newcomers, started
    for the switch on GPUs of their own, that never joined: nothing else would
    stop them (a newcomer stuck building the generation its leader abandoned
    held its slot for minutes, and every start on that slot was rejected).
    Their nodes are sent a stop; a node that also hosts a finishing member is
    left alone, so a member's last writes are never cut short.
    """
    accrue_service(job, now)  # saved with the transition below
    switching = job.state == JobState.SCALING
    held = holdings.release(job)
    transition(job, JobState.COMPLETED, reason=reason, at=now)
    if switching and held:
        _stop_newcomers(job, held)
    broadcast(job, "job.updated")
    request_tick()


def newcomer_gpus(
    held: Sequence[int], members: Collection[int], homes: Mapping[int, GpuHome]
) -> tuple[int, ...]:
    """The GPUs of ``held`` whose node hosts none of ``members``' GPUs (pure).

    ``held``: what a switching job holds (the switch's target); ``members``:
    the GPUs it ran on before the switch. A GPU whose home is unknown is left out.
    """
    member_nodes = {homes[g].node for g in members if g in homes}
    return tuple(
        g for g in held if g not in members and g in homes and homes[g].node not in member_nodes
    )


def _stop_newcomers(job: Job, held: Sequence[int]) -> None:
    switch = (
        job.events.filter(kind__in=(EventKind.NOTE, EventKind.MIGRATED), data__has_key="from")
        .order_by("-id")
        .values_list("data", flat=True)
        .first()
    )
    if not isinstance(switch, dict) or not isinstance(switch.get("from"), list):
        return
    members = {g for g in switch["from"] if isinstance(g, int)}
    homes = holdings.gpu_homes([*held, *members])
    newcomers = newcomer_gpus(held, members, homes)
    if newcomers:
        outbox = Outbox()
        outbox.stop_workers(job, newcomers, reason="the job finished before they joined")
        outbox.send_on_commit()


def fail_job(job: Job, error: str, now: datetime) -> None:
    """The job cannot go on: stop what may still run of it and say why."""
    outbox = Outbox()
    outbox.stop_workers(job, holdings.release(job), reason="failed")
    job.failure_reason = error[:500]
    transition(job, JobState.FAILED, reason=f"failed: {error}"[:500], at=now)
    outbox.send_on_commit()
    broadcast(job, "job.updated")
    request_tick()


def _restarts(n: int) -> str:
    return f"{n} restart" if n == 1 else f"{n} restarts"


def fail_or_retry(job: Job, error: str, now: datetime, *, retry: bool = True) -> str:
    """The job's program failed: requeue it while restarts remain, else fail it (at once
    when ``retry`` is False: no retry can help, e.g. an environment that does not build).

    Returns ``"retried"`` or ``"failed"``; a job that is not running (already
    requeued or ended: a late or repeated report of the same failure) is left
    alone (``"stale"``), so one failure never uses two restarts.
    """
    if job.state not in ACTIVE_STATES:
        return "stale"
    if not retry or job.restarts >= job.max_restarts:
        if job.restarts:
            error = f"{error} (after {_restarts(job.restarts)})"
        fail_job(job, error, now)
        return "failed"
    outbox = Outbox()
    accrue_service(job, now)  # saved with the transition below
    outbox.stop_workers(job, holdings.release(job), reason="program failed: restarting")
    job.restarts += 1
    resume = rewind_to_checkpoint(job, stored_checkpoints(job))
    attempt = f"attempt {job.restarts + 1} of {job.max_restarts + 1}"
    transition(
        job,
        JobState.QUEUED,
        at=now,
        kind=EventKind.RETRIED,
        reason=f"retried ({attempt}): requeued, {resume}; the program failed: {error}",
    )
    outbox.send_on_commit()
    # The failed run's coordination keys would make the next run wait for a dead leader.
    transaction.on_commit(functools.partial(forget_coordination, job.pk))
    broadcast(job, "job.updated")
    request_tick()
    return "retried"
