"""Reconcile what the database believes with what the agents report: no GPU held by the dead.

After the stack (or one agent) dies and comes back, a job may stay ``running``
with no process anywhere, holding its GPUs for ever.  Agents list every
process they run in each heartbeat (``workers.protocol.Heartbeat.workers``);
``inventory.services.do_heartbeat`` keeps, per server, when a heartbeat last
listed each job (``Server.agent_info["jobs_seen"]``: job name → time).  This
tick step compares the two::

    running job J, holding GPUs on servers S1..Sk (all up or draining, all heartbeating)
      since = max(J's last event (placement, resize, migration...), last progress report)
      for every Si:  listed by Si since `since`?  gap_i = Si's latest beat - that listing,
                                                 limit RECONCILE_SECONDS (it vanished)
                     not listed since:           gap_i = Si's latest beat - since,
                                                 limit RECONCILE_START_SECONDS (never started)
      every gap_i ≥ its limit ─▶ J has no process:
          final checkpoint in J's store ─▶ completed
          requeued RECONCILE_MAX_REQUEUES times already at the step it would
          resume from (no progress in between) ─▶ failed, saying so (requeues.py)
          otherwise                     ─▶ queued (GPUs released, coordination forgotten),
                                            resumes from its latest checkpoint

What keeps it from misfiring:

* heartbeats must span the limit after the job's last placement or command,
  so a job just placed is never reaped, and neither is one whose agent went
  silent (that is the server-down path of the tick); a job not yet listed
  since its placement gets the longer start limit, because an agent holds a
  start back while the slots' previous workers finish (up to 60 s);
* times are the heartbeats' own (when the agent sent them, never later than
  their arrival): a backlog of reports on the control plane's queue does not
  make a late heartbeat look like a long silence;
* only ``running`` jobs: a ``scaling`` job (stop-free resize, migration,
  torchrun's stop-and-restart) has processes coming and going by design;
* a progress report counts as a sign of life too (``last_service_at``);
* a job still listed by any one of its servers is alive: losing some of its
  workers is the runtime's to recover from.

``find_orphans`` is the pure core (plain dataclasses in, out); ``reconcile``
reads the database into it and applies what it finds.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q

from control.endings import complete_job
from control.requeues import requeue_or_fail
from control.resume import rewind_to_checkpoint, stored_checkpoints
from control.state import ClusterState
from inventory.models import Server, ServerState
from inventory.services import Beats, beat_at, jobs_seen, read_beats
from jobs.agent_commands import runtime_job_name
from jobs.choices import EventKind, JobState
from jobs.coordination import forget_coordination
from jobs.models import Job

log = logging.getLogger(__name__)

LIVE_STATES = frozenset({ServerState.UP, ServerState.DRAINING})

SINCE_KINDS = (
    EventKind.STATE,
    EventKind.SCALED,
    EventKind.MIGRATED,
    EventKind.RECOVERED,
    EventKind.PROFILED,
    EventKind.STRAGGLER,
    EventKind.NOTE,
)
"""Events that come with a command to the agents or from a live run: absence counts from them.
(Not a submission, a priority or range change: those start or stop no process.)"""


@dataclass(frozen=True)
class ServerBeats:
    """What one server's heartbeats say: is it live, when it last beat, which jobs it listed."""

    node: str
    live: bool
    last_heartbeat: datetime | None
    seen: Mapping[str, datetime]
    """Job name → time of the latest heartbeat that listed one of its workers."""


@dataclass(frozen=True)
class HeldJob:
    """A running job that holds GPUs, and since when its processes should be there."""

    job_id: int
    name: str
    nodes: tuple[str, ...]
    since: datetime
    """Its last placement, command or progress report: absence is measured from here on."""


@dataclass(frozen=True)
class Orphan:
    """A job that none of its servers runs: how long the shortest silence lasted."""

    job_id: int
    nodes: tuple[str, ...]
    silent_s: float
    ever_listed: bool
    """Whether some server listed it after its last placement or command (then it vanished)."""


@dataclass(frozen=True)
class Limits:
    """How long heartbeats may go without listing a job before it counts as having no process."""

    vanished_s: float
    """Listed since its last placement or command, then no more (``RECONCILE_SECONDS``)."""
    never_started_s: float
    """Never listed since its last placement or command (``RECONCILE_START_SECONDS``):
    longer, because an agent may hold a start back while the slots' previous workers
    finish their last mini-batch (the agent's slot wait, 60 s by default)."""


def find_orphans(
    jobs: Iterable[HeldJob], servers: Mapping[str, ServerBeats], limits: Limits
) -> list[Orphan]:
    """The jobs that no (live) server of theirs has listed for long enough (``Limits``).

    A job on a server that is unknown, not live or has never beaten is left
    alone: it cannot be judged from heartbeats (a down server is the tick's
    server-down path).
    """
    orphans: list[Orphan] = []
    for job in jobs:
        gaps: list[float] = []
        listed = False
        for node in job.nodes:
            server = servers.get(node)
            if server is None or not server.live or server.last_heartbeat is None:
                break
            last_listed = server.seen.get(job.name)
            if last_listed is not None and last_listed >= job.since:
                reference, limit = last_listed, limits.vanished_s
                listed = True
            else:
                reference, limit = job.since, limits.never_started_s
            gap = (server.last_heartbeat - reference).total_seconds()
            if gap < limit:
                break
            gaps.append(gap)
        else:
            if gaps:
                orphans.append(Orphan(job.job_id, job.nodes, min(gaps), listed))
    return orphans


# --------------------------------------------------------------------------- adapter


def reconcile(
    cluster: ClusterState,
    now: datetime,
    limits: Limits | None = None,
    *,
    beats: Beats | None = None,
) -> list[int]:
    """Requeue (or complete) every running job with no process; return their ids.

    Runs inside the tick's transaction, after the server-down step.  ``beats``:
    the servers' heartbeats as that step read them (``read_beats``; read here
    when not given): the server-down step changes states, not heartbeats.
    """
    limit = limits or Limits(settings.RECONCILE_SECONDS, settings.RECONCILE_START_SECONDS)
    if not cluster.holdings:
        return []
    held = _held_jobs(cluster, _possible_orphans(cluster, limit, beats or read_beats()))
    if not held:
        return []
    nodes = {node for job in held for node in job.nodes}
    orphans = find_orphans(held, _server_beats(nodes), limit)
    changed: list[int] = []
    for orphan in orphans:
        job = Job.objects.select_for_update().select_related("tenant").get(pk=orphan.job_id)
        if job.state != JobState.RUNNING:
            continue
        _requeue_or_complete(job, orphan, now)
        changed.append(job.pk)
    return changed


def _possible_orphans(cluster: ClusterState, limits: Limits, beats: Beats) -> list[int]:
    """The running jobs that can be orphans at all: a cheap bound, so few are judged in full.

    A job's every gap is at most the newest heartbeat of any server minus its
    ``since`` (a server's beat is never past the newest, a listing never
    before ``since``), and ``since`` is at least its start and its last
    progress report.  So a job started or heard from after the newest beat
    minus the shorter limit has a gap below its limit on every server: not an
    orphan, whatever its events say.  What is left (in a healthy cluster:
    nothing, progress reports keep ``last_service_at`` fresh) gets the exact
    test, events and heartbeat listings included.
    """
    # An upper bound of every server's beat (its ``beat_at``, else its last heartbeat).
    newest = beats.newest
    if newest is None:
        return []  # no server ever beat: none can be judged
    cutoff = newest - timedelta(seconds=min(limits.vanished_s, limits.never_started_s))
    if cluster.marks is not None:  # the kept state has every job's start and last report
        quiet: Iterable[int] = [
            pk for pk, mark in cluster.marks.items() if mark is None or mark <= cutoff
        ]
    else:
        quiet = Job.objects.filter(
            Q(started_at__isnull=True) | Q(started_at__lte=cutoff),
            Q(last_service_at__isnull=True) | Q(last_service_at__lte=cutoff),
            state=JobState.RUNNING,
        ).values_list("pk", flat=True)
    return [pk for pk in quiet if pk in cluster.holdings]


def _held_jobs(cluster: ClusterState, job_ids: list[int]) -> list[HeldJob]:
    if not job_ids:
        return []
    rows = (
        Job.objects.filter(pk__in=job_ids, state=JobState.RUNNING)
        .annotate(last_event=Max("events__at", filter=Q(events__kind__in=SINCE_KINDS)))
        .values_list("pk", "started_at", "last_service_at", "last_event")
    )
    held: list[HeldJob] = []
    for pk, started_at, last_service_at, last_event in rows:
        marks = [t for t in (started_at, last_service_at, last_event) if t is not None]
        if not marks:
            continue
        nodes = tuple(dict.fromkeys(cluster.homes[g].node for g in cluster.holdings[pk]))
        held.append(HeldJob(pk, runtime_job_name(pk), nodes, max(marks)))
    return held


def _server_beats(nodes: Iterable[str]) -> dict[str, ServerBeats]:
    beats: dict[str, ServerBeats] = {}
    rows = Server.objects.filter(node__in=list(nodes)).values_list(
        "node", "state", "last_heartbeat", "agent_info"
    )
    for node, state, last_heartbeat, agent_info in rows:
        beats[node] = ServerBeats(
            node=node,
            live=state in LIVE_STATES,
            last_heartbeat=beat_at(agent_info) or last_heartbeat,
            seen=jobs_seen(agent_info),
        )
    return beats


def _requeue_or_complete(job: Job, orphan: Orphan, now: datetime) -> None:
    where = ", ".join(orphan.nodes)
    silence = f"no process on {where} for {orphan.silent_s:.0f} s"
    if not orphan.ever_listed:
        silence += " since it was placed"
    stored = stored_checkpoints(job)
    if stored.final_step is not None:
        job.step = max(job.step, stored.final_step)  # saved with the transition
        why = (
            f"{silence}: its final checkpoint (step {stored.final_step}) is stored, so it finished"
        )
        complete_job(job, why, now)
    else:
        resume = rewind_to_checkpoint(job, stored)  # the step is saved with the transition
        requeue_or_fail(job, silence, resume, now, stop=False)  # nothing runs: nothing to stop
    # A dead run's coordination keys (leader, generation, members) would make the
    # next first generation wait for a dead leader.
    transaction.on_commit(functools.partial(forget_coordination, job.pk))
    log.warning("job %s: %s", job.pk, silence)
