"""The scheduler tick: one pass of the control plane over the whole cluster.

    lock (Redis, non-blocking: a tick already running means this one is skipped)
    └─ one transaction
        1. servers whose agents went silent → down; their jobs lose those GPUs
           (survivors keep training: the runtime recovers in place) or requeue
        1b. reconcile: running jobs that no heartbeat of their live servers has listed
           for RECONCILE_SECONDS have no process → requeued (resume from their latest
           checkpoint) or, with a final checkpoint stored, completed (control.reconcile)
        1c. jobs past their run-time limit → stopped after a final checkpoint, failed
           (control.limits)
        2. jobs on draining servers → migrate (same size, other GPUs, one switch)
        3. snapshot → one scheduling pass (scheduler.pipeline: hold-back, the policy,
           quota check, preemption within a tenant's quota, bind on the vClos
           allocator of fabric/) → GPU/cable rows, states, events; on a typed
           snapshot (GPU types, node selectors: scheduler.gpu_types) every job's GPUs
           are of one type it accepts, on servers its selector matches
    └─ on commit: agent commands to ``agent.<node>``, live updates to browsers
    then, every AGENT_USERS_SYNC_SECONDS: the agents' and jobs' Redis users
    (control.agent_users: rules, restores, deletions, the memory guard)

The cluster, the allocator and the snapshot come from a ``ClusterSource``
(``control.incremental``): by default the state kept in this process
between ticks, brought up to date with the rows that changed since the last
tick and compared with a full rebuild every ``TICK_VERIFY_EVERY`` ticks (both
read in one snapshot, in a read-only transaction before the tick's own);
with ``TICK_INCREMENTAL=0``, a full rebuild from the database every tick.

It is idempotent: everything is derived from the database, so a tick killed
half-way (its transaction rolls back, the kept state is dropped) is repaired
by the next one, which reads everything again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from redis.lock import Lock

from control.apply import apply_bound, note_waiting
from control.forecast import maybe_refresh
from control.incremental import ClusterSource, forget, source_for_tick
from control.limits import stop_jobs_at_limit
from control.packing import drain_packing
from control.reconcile import reconcile
from control.state import AssembledHoldBack, ClusterState, down_gpus
from control.suspect_notes import suspect_notes
from control.switch_watchdog import stop_stuck_switches
from control.tick_stats import queue_tick_stats
from fabric.allocator import Allocation
from inventory.services import do_mark_silent_servers_down, read_beats
from jobs import command_sender, holdings
from jobs.agent_commands import job_id_from_name, runtime_job_name
from jobs.choices import EventKind, JobState
from jobs.coordination import forget_coordination
from jobs.lifecycle import TICK_TASK, Batch, broadcast, record, save_fields, transition
from jobs.models import Job
from jobs.outbox import Outbox
from scheduler.binding import Refused
from scheduler.gpu_types import is_typed
from scheduler.pipeline import AllocatorBind, PolicyDecide, snapshot_pass
from scheduler.placement import CountPlacement
from scheduler.types import Decision, Migrate
from utilities.realtime import finishers_held
from utilities.redis_clients import shared_redis
from workers.protocol import Profile

__all__ = ["TICK_TASK", "TickResult", "run_tick"]

log = logging.getLogger(__name__)
LOCK_KEY = "portal:scheduler-tick"
ADVISORY_LOCK_ID = 0x7469636B  # "tick": the PostgreSQL advisory lock of the scheduler tick


@dataclass(frozen=True)
class TickResult:
    """What one tick did."""

    ran: bool
    duration_s: float = 0.0
    changed_jobs: tuple[int, ...] = ()
    refused: tuple[Refused, ...] = ()
    down_nodes: tuple[str, ...] = ()
    decisions: int = 0
    notes: list[str] = field(default_factory=list)


def _redis() -> redis.Redis:
    return shared_redis()


def _database_lock() -> bool:
    """Take the tick's lock in the database for this transaction; False if another tick has it.

    On PostgreSQL a transaction-level advisory lock: it is released at commit or
    rollback, and by the server when a killed worker's connection drops, so a
    tick killed mid-way never blocks the next one. SQLite's write transactions
    (``IMMEDIATE``) already run one at a time.
    """
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_ID])
        row = cursor.fetchone()
    return bool(row and row[0])


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a tick runs, and back as it was afterwards.

    A tick makes an object or two per job and GPU (views, records, heap
    entries: some 100,000 at 10,000 jobs), nearly all freed by reference
    counting as soon as the tick is done with them.  Meanwhile their number
    triggers the cycle collector, and its full passes walk every long-lived
    object of the process (Django's, the kept state's: hundreds of thousands)
    to find next to nothing: tens of milliseconds, more than half of such a
    tick.  Paused, nothing is lost: a cycle made during the tick is collected
    by the first collection after it, in the worker's idle time between ticks.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_tick(
    *,
    policy: str | None = None,
    now: datetime | None = None,
    lock_timeout_s: float | None = None,
) -> TickResult:
    """Run one tick under the cluster-wide lock; skipped if another tick holds it.

    Two locks: the Redis one, which expires after ``TICK_LOCK_SECONDS`` (a few
    ticks: a worker killed mid-tick never releases it), keeps ticks from even
    starting a transaction while another runs; the database one makes sure two
    ticks never overlap even when a slow tick outlived the Redis lock.  The Redis
    lock is redis-py's (``Lock``: ``SET NX PX`` of a token, released by a script
    only while the key holds that token), made by hand so that a tick's release
    and its duration (``tick_stats``) go to Redis in one round trip.
    """
    lock_timeout_s = lock_timeout_s or settings.TICK_LOCK_SECONDS
    client, token = _redis(), uuid.uuid4().hex
    if not client.set(LOCK_KEY, token, nx=True, px=int(lock_timeout_s * 1000)):
        return TickResult(ran=False)
    # What the commit hands to background threads (the agent commands, the live pages'
    # summaries) starts once the lock is back (``held``): woken at commit, they took the
    # interpreter from the tick's last steps.
    background = settings.AGENT_SEND_IN_BACKGROUND
    with (
        command_sender.sender().held() if background else contextlib.nullcontext(),
        finishers_held(),
    ):
        return _locked_tick(client, token, lock_timeout_s, policy, now)


def _locked_tick(
    client: redis.Redis,
    token: str,
    lock_timeout_s: float,
    policy: str | None,
    now: datetime | None,
) -> TickResult:
    """:func:`run_tick` once its Redis lock is taken: the tick, then the lock released."""
    started = time.perf_counter()
    now = now or timezone.now()
    result: TickResult | None = None
    try:
        source = source_for_tick()
        with _collector_paused():
            source.verify_if_due(now)
            with transaction.atomic():
                if _database_lock():
                    result = _tick(source, policy or settings.SCHEDULER_POLICY, now)
    except BaseException:
        forget()  # it may describe writes that rolled back: the next tick reads everything
        _release(client, token, lock_timeout_s)
        raise
    if result is None:  # another tick holds the database's lock
        _release(client, token, lock_timeout_s)
        return TickResult(ran=False)
    duration = time.perf_counter() - started
    _release(client, token, lock_timeout_s, duration)
    # The tick's time up to its lock's release, as before (the recorded one cannot include
    # the round trip it travels in).
    return dataclasses.replace(result, duration_s=time.perf_counter() - started)


def _release(
    client: redis.Redis, token: str, timeout_s: float, duration_s: float | None = None
) -> None:
    """Give the tick's Redis lock back, if it still holds ``token``, and record a tick that
    ran (``duration_s``) in the same round trip.

    The release is redis-py's ``Lock.release`` (its script, which deletes the key only
    while it holds this token); its errors are raised, as that release's were, but the
    record's are not (metrics must never break a tick).
    """
    pipe = client.pipeline(transaction=False)
    pipe.eval(Lock.LUA_RELEASE_SCRIPT, 1, LOCK_KEY, token)
    if duration_s is not None:
        queue_tick_stats(pipe, duration_s)
    released, *_ = pipe.execute(raise_on_error=False)
    if isinstance(released, Exception):
        raise released
    if not released:
        log.warning("the tick outlived its lock (%.0f s)", timeout_s)


def _tick(source: ClusterSource, policy_name: str, now: datetime) -> TickResult:
    outbox = Outbox()
    beats = read_beats()  # one aggregate for the silence check and reconcile
    down = tuple(
        do_mark_silent_servers_down(
            now=now, after_seconds=settings.AGENT_DOWN_AFTER_SECONDS, beats=beats
        )
    )
    cluster = source.cluster()
    if cluster is None:
        return TickResult(ran=True, notes=["no topology loaded"])
    outbox.homes = cluster.homes  # the same every call while the servers do not change
    changed = _recover_lost_gpus(cluster, now)
    if changed:
        cluster = source.cluster() or cluster
    orphaned = reconcile(cluster, now, beats=beats)
    if orphaned:
        changed += orphaned
        cluster = source.cluster() or cluster
    overdue = stop_jobs_at_limit(now, outbox, cluster.deadlines)
    if overdue:
        changed += overdue
        cluster = source.cluster() or cluster
    drain_refused: list[Refused] = []
    drains = _drain_decisions(cluster)
    if drains:
        jobs = {d.job: job_id_from_name(d.job) or 0 for d in drains}
        allocator = source.allocator(cluster)
        typed = cluster.gpu_types if cluster.mixed else None  # a job moves within its type
        packing = drain_packing(cluster.spec, cluster.server_capacity)  # CPU and memory
        migrated, _ = AllocatorBind(cluster.spec, allocator, typed, packing).bind(None, drains)
        drain_refused = migrated.refused
        source.touched(jobs.values())  # the allocator holds their bound state, not the rows'
        reasons = {b.job: "migrated off a draining server" for b in migrated.bound}
        changed += apply_bound(
            cluster.spec,
            migrated.bound,
            jobs,
            cluster.homes,
            now,
            outbox,
            reason_override=reasons,
        )
        cluster = source.cluster() or cluster
    prepared = source.prepared(cluster, now)
    cluster, view = prepared.cluster, prepared.view
    snapshot, ids = view.snapshot, view.ids
    policy = source.policy(policy_name)
    scheduled = snapshot_pass(
        AssembledHoldBack(),
        PolicyDecide(policy, CountPlacement(), source.speed_tables()),
        # A typed snapshot (several types, or a job asking for one or for labels) binds type
        # by type, a selecting job on its servers only; otherwise today's binding.
        AllocatorBind(
            cluster.spec, prepared.allocator, cluster.gpu_types if is_typed(snapshot) else None
        ),
    ).run(view)
    decisions = scheduled.decisions
    bound, refused = scheduled.bound[0].bound, scheduled.bound[0].refused
    source.touched(ids[b.job] for b in bound if b.job in ids)
    changed += apply_bound(
        cluster.spec,
        bound,
        ids,
        cluster.homes,
        now,
        outbox,
        reason_override=scheduled.stopped,
        gpu_types=cluster.gpu_types,
    )
    changed += _request_profiles(cluster, view.profile_candidates, now, outbox)
    stuck = stop_stuck_switches(view.switching, now, outbox)
    if stuck:
        source.touched(stuck)  # their GPUs are free again: the kept allocator reads them anew
        changed += stuck
    waiting = suspect_notes(cluster, snapshot, ids, bound)  # the least specific reason
    waiting.update(_by_id(scheduled.waits, ids))  # held back, over quota, refused
    note_waiting(waiting, now)
    outbox.send_on_commit()
    maybe_refresh(now)  # estimates and queue positions, in the background when due
    return TickResult(
        ran=True,
        changed_jobs=tuple(dict.fromkeys(changed)),
        refused=tuple(drain_refused + refused),
        down_nodes=down,
        decisions=len(decisions) + len(drains),
    )


def _by_id(waits: Mapping[str, str], ids: Mapping[str, int]) -> dict[int, str]:
    """The pass's waits by database id (a held-back job is in the waits, not in ``ids``)."""
    by_id: dict[int, str] = {}
    for name, reason in waits.items():
        job_id = ids.get(name) or job_id_from_name(name)
        if job_id is not None:
            by_id[job_id] = reason
    return by_id


def _recover_lost_gpus(cluster: ClusterState, now: datetime) -> list[int]:
    """Jobs holding GPUs of servers that are down lose them (their workers died with them)."""
    lost_by_job: dict[int, set[int]] = {}
    holders = cluster.holders
    # The down GPUs (usually none; the kept state makes them when the servers change).
    for gpu in sorted(g for g in down_gpus(cluster) if g in holders):
        lost_by_job.setdefault(holders[gpu], set()).add(gpu)
    changed: list[int] = []
    for job_id, lost in lost_by_job.items():
        job = Job.objects.select_for_update().get(pk=job_id)
        allocation = Allocation.from_dict(job.allocation) if job.allocation else None
        held = allocation.gpus if allocation else ()
        survivors = tuple(g for g in held if g not in lost)
        if survivors and allocation is not None:
            # A subset of a vClos keeps its reserved cables: still contention-free.
            holdings.store(job, dataclasses.replace(allocation, gpus=survivors), cluster.spec)
            previous = job.parallelism
            job.parallelism = len(survivors)
            save_fields(job, "allocation", "parallelism")
            record(
                job,
                EventKind.RECOVERED,
                now,
                reason=f"lost GPUs {sorted(lost)} (server down): {job.recovery} recovery on "
                f"{len(survivors)} survivors",
                from_parallelism=previous,
                to_parallelism=len(survivors),
            )
        else:
            holdings.release(job)  # its workers died with their servers: nothing to stop
            if job.state in (JobState.RUNNING, JobState.SCALING):
                transition(
                    job,
                    JobState.QUEUED,
                    at=now,
                    reason="every server of the job went down: requeued, it "
                    "resumes from its latest checkpoint",
                )
                # The dead run's coordination keys (leader, generation, members)
                # would make the next first generation wait for a dead leader.
                transaction.on_commit(functools.partial(forget_coordination, job.pk))
        broadcast(job, "job.updated")
        changed.append(job_id)
    return changed


def _request_profiles(
    cluster: ClusterState, candidates: Sequence[int], now: datetime, outbox: Outbox
) -> list[int]:
    """EDL's profile(min, max) for jobs that reached their maximum and have no curve yet.

    The runtime measures samples/s from max down to min, one worker at a time;
    its scale-ins come back as ``scale_done`` reports (GPUs released) and the
    curve as ``profile_done``.  The policy leaves a profiling job alone.
    """
    if not candidates:
        return []
    jobs = Job.objects.select_for_update().filter(
        pk__in=candidates,  # from the snapshot; re-checked here, the tick may have moved them
        state=JobState.RUNNING,
        profile_state="",
        tenant__profile_jobs=True,
        min_gpus__lt=F("max_gpus"),
        parallelism=F("max_gpus"),
    )
    requested: list[int] = []
    batch = Batch()
    for job in jobs.order_by("pk"):
        # Jobs this tick changed are no longer running at their maximum (filtered out
        # above), so the holdings read at the start of the tick are still theirs.
        held = cluster.holdings.get(job.pk)
        if not held:
            continue
        first = held[0]
        job.profile_state = "requested"
        batch.save_fields(job, "profile_state")
        batch.record(
            job,
            EventKind.PROFILED,
            now,
            reason=f"profiling throughput from {job.max_gpus} down to "
            f"{job.min_gpus} GPUs, {settings.PROFILE_BATCHES} mini-batches each",
        )
        outbox.extend(
            [
                (
                    cluster.homes[first].node,
                    Profile(
                        job=runtime_job_name(job.pk),
                        command_id=f"profile-{job.pk}",
                        min_workers=job.min_gpus,
                        max_workers=job.max_gpus,
                        batches_per_level=settings.PROFILE_BATCHES,
                    ),
                )
            ]
        )
        requested.append(job.pk)
    batch.flush()
    return requested


def _drain_decisions(cluster: ClusterState) -> list[Decision]:
    draining_jobs = {cluster.holders[g] for g in cluster.draining if g in cluster.holders}
    if not draining_jobs:
        return []
    decisions: list[Decision] = []
    for job in Job.objects.filter(pk__in=draining_jobs, state=JobState.RUNNING):
        decisions.append(Migrate(runtime_job_name(job.pk), tuple(range(job.parallelism))))
    return decisions
