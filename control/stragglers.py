"""What the control plane does with a straggler report: mark the GPU, then shrink or move.

::

    straggler report (worker wG, ratio)
        ─▶ the job holds G: mark GPU G suspect until at + STRAGGLER_COOLDOWN_SECONDS
           (no new placement or scale-out lands there; the mark lapses by itself),
           unless another GPU is suspect on this job's word: the report comes from
           the tenant's program, so one job holds at most one GPU suspect at a time
        ─▶ record it in the job's history (always): detected, then removed / moved / kept, why
        ─▶ not running / not held ─▶ keep (say why)
        ─▶ a torchrun program ─▶ keep: a restart would cost more than the straggler
        ─▶ above min_gpus ─▶ SCALING, ScaleIn(wG) to the runtime (sent on commit);
                             its scale_done (``reports._scale_done``) frees GPU G
        ─▶ at min_gpus ─▶ one free, non-suspect GPU G' keeping the job's vClos shape
                          (``straggler_moves``)? ─▶ SCALING, Migrate(wG → wG'), GPU G
                          freed now, as the tick's drain path migrates (``apply_bound``)
                        ─▶ none: keep, and say why

The runtime flags a straggler with its noise-robust rule
(``workers/elastic/straggler.py``) and, under the agent, does not remove it
itself (``--drop-stragglers`` is off): the control plane decides, since it
knows the job's elastic range, the free GPUs and who else waits for them.

A move writes GPU rows outside the tick.  It takes the tick's database lock
when it is free (a tick then skips, and the next one sees the move); when a
tick holds it, the move still goes ahead inside a savepoint, and the database's
uniqueness of a GPU's holder settles a race: whichever of the two takes GPU G'
second fails (a move that fails is kept, and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from control.apply import apply_bound
from control.state import load_allocator, read_cluster
from control.straggler_moves import one_worker_move
from control.tick import ADVISORY_LOCK_ID
from fabric.topology import FabricSpec
from inventory.models import Gpu
from inventory.services import do_mark_gpu_suspect
from jobs import holdings
from jobs.agent_commands import gpu_of_worker, membership_commands, runtime_job_name
from jobs.choices import EventKind, JobState
from jobs.lifecycle import broadcast, record, transition
from jobs.models import Job
from jobs.outbox import Outbox, launch_of
from scheduler.binding import Bound

MARKED_BY = "control plane (straggler report)"
"""Who a straggler's suspect mark names (``Gpu.suspect_by``)."""


@dataclass(frozen=True)
class Verdict:
    """What to do with a straggler: ``remove``, ``move`` or ``keep``, and why."""

    action: str
    why: str


def verdict(job: Job, gpu: int | None, held: tuple[int, ...]) -> Verdict:
    """Remove the straggler on ``gpu``, try to move it, or keep it (pure, on the job's row)."""
    if job.state != JobState.RUNNING:
        return Verdict("keep", f"the job is {job.state}")
    if gpu is None or gpu not in held:
        return Verdict("keep", "the job does not hold that worker's GPU")
    if job.restarts_to_resize:
        return Verdict(
            "keep",
            "a torchrun program restarts to shrink or move, which costs more than a straggler",
        )
    if len(held) - 1 < job.min_gpus:
        return Verdict("move", f"the job is at its minimum of {job.min_gpus} GPUs")
    return Verdict("remove", f"{len(held)}→{len(held) - 1} GPUs, its minimum is {job.min_gpus}")


def why_kept(job: Job, gpu: int | None, held: tuple[int, ...]) -> str | None:
    """Why the straggler on ``gpu`` cannot be removed from ``job`` (None: it can)."""
    found = verdict(job, gpu, held)
    return None if found.action == "remove" else found.why


def _take_tick_lock() -> bool:
    """The tick's transaction-level lock, if no tick holds it now (never waits: no deadlock).

    The report already holds the job's row lock, which a running tick may be
    waiting for; waiting here for the tick's lock could deadlock.
    """
    if connection.vendor != "postgresql":
        return True  # SQLite's write transactions already run one at a time
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_ID])
        row = cursor.fetchone()
    return bool(row and row[0])


def _plan_move(job: Job, gpu: int) -> tuple[Bound, FabricSpec] | str:
    """The one-worker migration off ``gpu`` (a free GPU of an allowed shape), or why none."""
    cluster = read_cluster()
    if cluster is None:
        return "no topology is loaded"
    allocator = load_allocator(cluster)  # suspect GPUs (this one too, once marked) blocked
    name = runtime_job_name(job.pk)
    current = allocator.allocations().get(name)
    if current is None:
        return "the job's allocation is not recorded"
    found = one_worker_move(cluster.spec, allocator, current, gpu)
    if isinstance(found, str):
        return found
    return Bound(name, current.gpus, found), cluster.spec


def _apply_move(job: Job, bound: Bound, spec: FabricSpec, reason: str, at: datetime) -> None:
    """Write the move as the tick writes a migration; the Migrate goes out on commit."""
    homes = holdings.gpu_homes(set(bound.old_gpus) | set(bound.new_gpus))
    outbox = Outbox()
    apply_bound(spec, [bound], {bound.job: job.pk}, homes, at, outbox,
                reason_override={bound.job: reason})  # fmt: skip
    outbox.send_on_commit()


def _shrink(job: Job, held: tuple[int, ...], gpu: int, reason: str, at: datetime) -> None:
    """ScaleIn of the worker on ``gpu``; its GPU is freed when the runtime's scale_done comes."""
    new = [g for g in held if g != gpu]
    outbox = Outbox()
    outbox.extend(
        membership_commands(launch_of(job), held, new, holdings.gpu_homes(held), reason=reason)
    )
    transition(
        job, JobState.SCALING, reason=f"switching {len(held)}→{len(new)} GPUs: {reason}", at=at
    )
    outbox.send_on_commit()
    broadcast(job, "job.updated")


@dataclass
class _Note:
    """The straggler event being written: what was seen, and the suspect mark."""

    job: Job
    at: datetime
    detected: str
    suspect: str
    data: dict[str, object]

    def write(self, action: str, summary: str, **data: object) -> None:
        """Record the event: ``action`` (removed/moved/kept) and ``summary`` saying why."""
        self.data.update(action=action, removed=action == "removed", **data)
        record(
            self.job,
            EventKind.STRAGGLER,
            self.at,
            reason=f"{self.detected}; {summary}{self.suspect}",
            data=self.data,
        )


def _marked_elsewhere(job: Job, gpu: int, at: datetime) -> int | None:
    """Another GPU this job's straggler reports hold suspect now, if any.

    The report is the tenant program's word (the runtime runs inside it, and
    the agent has no timing of its own to check it against): believed about
    the job itself, it may cost other tenants at most one GPU at a time.
    """
    return (
        Gpu.objects.filter(suspect_job=job.pk, suspect_by=MARKED_BY, suspect_until__gt=at)
        .exclude(index=gpu)
        .values_list("index", flat=True)
        .first()
    )


def _mark(job: Job, worker: str, gpu: int, ratio: float, at: datetime) -> datetime | None:
    """Mark the straggler's GPU suspect for the cool-down; until when (None: not marked).

    Not while another GPU is suspect on this job's word (``_marked_elsewhere``).
    """
    if _marked_elsewhere(job, gpu, at) is not None:
        return None
    mark = do_mark_gpu_suspect(
        gpu=gpu,
        at=at,
        seconds=settings.STRAGGLER_COOLDOWN_SECONDS,
        reason=f"straggler: worker {worker} of job {job.pk} was {ratio:.2f}x slower",
        job_id=job.pk,
        by=MARKED_BY,
    )
    return mark.suspect_until if mark is not None else None


def shrink_around_straggler(job: Job, worker: str, ratio: float, at: datetime) -> str:
    """Act on the straggler ``worker`` of ``job``: mark its GPU, then remove, move or keep it.

    Called inside the report's transaction with ``job`` locked; commands go
    out on commit.  Returns ``"straggler removed"``, ``"straggler moved"`` or
    ``"straggler"`` (kept).
    """
    held = holdings.held_gpus(job)
    gpu = gpu_of_worker(worker)
    found = verdict(job, gpu, held)
    note = _Note(
        job, at, f"straggler detected: worker {worker} is {ratio:.2f}x slower than its peers", "",
        {"worker": worker, "ratio": ratio},
    )  # fmt: skip
    if gpu is None or gpu not in held:
        note.write("kept", f"kept: {found.why}", why=found.why)
        return "straggler"
    note.detected = f"straggler detected: worker {worker} on GPU {gpu} is {ratio:.2f}x slower"
    note.data["gpu"] = gpu
    until = _mark(job, worker, gpu, ratio, at)
    if until is not None:
        note.data["suspect_until"] = until.isoformat()
        note.suspect = f"; GPU {gpu} suspect until {until.isoformat(timespec='seconds')}"
    if found.action == "remove":
        note.write("removed", f"removing it: scale-in {found.why}; GPU {gpu} freed once it left")
        _shrink(job, held, gpu, f"straggler {worker} ({ratio:.2f}x) removed", at)
        return "straggler removed"
    if found.action == "keep":
        note.write("kept", f"kept: {found.why}", why=found.why)
        broadcast(job, "job.updated")
        return "straggler"
    locked = _take_tick_lock()
    plan = _plan_move(job, gpu)
    if isinstance(plan, str):
        why = f"{found.why}, and {plan}"
        note.write("kept", f"kept: {why}", why=why)
        broadcast(job, "job.updated")
        return "straggler"
    bound, spec = plan
    (target,) = set(bound.new_gpus) - set(held)
    try:
        with transaction.atomic():  # a savepoint: a lost race undoes the move and its event
            note.write(
                "moved",
                f"moved to GPU {target} (one switch, no stop; GPU {gpu} freed): {found.why}",
                to_gpu=target,
            )
            _apply_move(
                job, bound, spec, f"straggler {worker} ({ratio:.2f}x) moved off GPU {gpu}", at
            )
    except IntegrityError:
        if locked:
            raise  # no tick could have taken the GPU: a real error
        why = f"{found.why}, and the scheduler tick took GPU {target} at the same moment"
        note.data = {k: v for k, v in note.data.items() if k != "to_gpu"}
        note.write("kept", f"kept: {why}", why=why)
        broadcast(job, "job.updated")
        return "straggler"
    return "straggler moved"
