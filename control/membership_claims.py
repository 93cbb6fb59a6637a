"""A job's membership claims, believed only where its agents see the same.

The runtime's ``recovered`` and ``scale_done`` events come from the tenant's
own program (``workers.job_events``): a forged one named workers "gone"
while their processes kept training, their GPUs freed and unbilled.  What a
job's agents see is the check: each agent reports every exit of a process it
ran (``worker_exited``) and lists the processes it runs in its heartbeats
(its process table)::

    runtime says worker w left (recovered.dead, or not in scale_done's members)
      w's exit was reported by its agent          ─▶ believed: GPU freed
      w's node beat after the event without it   ─▶ believed: GPU freed
      otherwise (it still runs, or no such beat)   ─▶ kept held, and billed; the
                                                      history says so
    worker_exited(w) later, w kept so             ─▶ GPU freed then

A GPU is so never both free in the database and busy on its node with a
process of the job that claimed it gone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime

from django.core.cache import cache

from control.endings import accrue_service
from inventory.models import Server
from inventory.services import beat_at
from jobs import holdings
from jobs.agent_commands import gpu_of_worker, runtime_job_name, worker_id
from jobs.choices import EventKind, JobState
from jobs.lifecycle import record, request_tick, save_fields
from jobs.models import Job
from jobs.services import do_set_parallelism
from workers.protocol import JobEventReport, WorkerExited

KEPT_KEY = "left_but_running"
"""Data key of the note naming the workers kept although the runtime said they left."""

EXIT_MEMORY_SECONDS = 24 * 3600
"""How long an agent's report of a worker's exit is remembered (the cache)."""


def _exit_key(job: Job, worker: str) -> str:
    # The submission time tells apart two jobs of one id (a database made again).
    return f"jobs:exited:{job.pk}:{job.submitted_at.timestamp():.6f}:{worker}"


def remember_exit(job: Job, report: WorkerExited, at: datetime) -> None:
    """An agent saw this worker of ``job`` exit at ``at``: a later claim that it left is true."""
    cache.set(_exit_key(job, report.worker_id), at.isoformat(), timeout=EXIT_MEMORY_SECONDS)


def _exited(job: Job, worker: str, since: datetime | None) -> bool:
    """Whether the worker's exit was reported since the job last changed its membership.

    A worker id names a GPU (``w<index>``): an exit from before the job was
    last placed or resized may have been another process of the same name.
    """
    seen = cache.get(_exit_key(job, worker))
    if not isinstance(seen, str):
        return False
    try:
        at = datetime.fromisoformat(seen)
    except ValueError:
        return False
    return since is None or at >= since


def _membership_since(job: Job) -> datetime | None:
    """When the job last entered ``running`` or ``scaling`` (placed, or a switch began)."""
    return (
        job.events.filter(to_state__in=(JobState.RUNNING, JobState.SCALING))
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )


def event_time(report: JobEventReport) -> datetime | None:
    """When the runtime wrote the event (its stream id's milliseconds), if the id says."""
    head = report.event_id.split("-", 1)[0]
    if not head.isdigit():
        return None
    try:
        return datetime.fromtimestamp(int(head) / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def still_running(job: Job, workers: Iterable[str], since: datetime | None) -> dict[str, str]:
    """Of ``workers``, those no agent vouches are gone, with the node each runs on.

    A worker is gone when its agent reported its exit, or when its node's
    newest heartbeat, sent at or after ``since``, does not list it.
    """
    name = runtime_job_name(job.pk)
    changed = _membership_since(job)
    wanted = [w for w in workers if not _exited(job, w, changed)]
    gpus = {w: gpu for w in wanted if (gpu := gpu_of_worker(w)) is not None}
    homes = holdings.gpu_homes(gpus.values())
    nodes = {home.node for home in homes.values()}
    beats = dict(Server.objects.filter(node__in=nodes).values_list("node", "agent_info"))
    running: dict[str, str] = {}
    for worker, gpu in gpus.items():
        home = homes.get(gpu)
        if home is None:
            continue
        info = beats.get(home.node)
        sent = beat_at(info)
        if (
            sent is not None
            and since is not None
            and sent >= since
            and not _lists(info, name, worker)
        ):
            continue
        running[worker] = home.node
    return running


def _lists(info: object, job: str, worker: str) -> bool:
    listed = info.get("workers") if isinstance(info, dict) else None
    return isinstance(listed, list) and any(
        isinstance(item, dict) and item.get("job") == job and item.get("worker_id") == worker
        for item in listed
    )


def believed_leavers(
    job: Job, leavers: Collection[str], report: JobEventReport, at: datetime
) -> tuple[str, ...]:
    """The ``leavers`` (workers ``job`` holds) whose leaving its agents confirm.

    The others stay held, and a note in the job's history says why.
    """
    held = {worker_id(g) for g in holdings.held_gpus(job)}
    claimed = [w for w in leavers if w in held]
    running = still_running(job, claimed, event_time(report))
    if running:
        where = ", ".join(f"{w} on {node}" for w, node in sorted(running.items()))
        record(
            job,
            EventKind.NOTE,
            at,
            reason=f"the runtime's {report.TYPE} says {', '.join(sorted(running))} left, but "
            f"their agents still run them ({where}): their GPUs stay held, and billed, "
            "until they exit",
            data={KEPT_KEY: sorted(running)},
        )
    return tuple(w for w in claimed if w not in running)


def on_exit(job: Job, report: WorkerExited, at: datetime) -> str | None:
    """A worker the runtime had said left has exited: free its GPU now (None: not such a one)."""
    if job.state != JobState.RUNNING or job.restarts_to_resize:
        return None
    note = (
        job.events.filter(kind=EventKind.NOTE, data__has_key=KEPT_KEY)
        .order_by("-id")
        .values_list("data", flat=True)
        .first()
    )
    kept = note.get(KEPT_KEY) if isinstance(note, dict) else None
    if not isinstance(kept, list) or report.worker_id not in kept:
        return None
    why = f"runtime: {report.worker_id} left earlier and has now exited, GPU freed"
    freed = free_leavers(job, [report.worker_id], at, lambda _freed: why)
    return "freed" if freed else None


def free_leavers(
    job: Job, workers: Collection[str], at: datetime, why: Callable[[tuple[str, ...]], str]
) -> tuple[str, ...]:
    """Free the GPUs of ``workers`` that left ``job``: its service is charged up to ``at``
    at the old parallelism first, then its parallelism becomes what it still holds (the
    reason ``why(freed)``) and a tick is asked for; the workers freed (none: nothing
    changes but the service)."""
    accrue_service(job, at)
    save_fields(job, "attained_gpu_seconds", "last_service_at")
    freed = holdings.drop_workers(job, workers)
    if freed:
        # do_set_parallelism reads the job again (and broadcasts).
        do_set_parallelism(
            job_id=job.pk, parallelism=len(holdings.held_gpus(job)), reason=why(freed), at=at
        )
        request_tick()
    return freed
