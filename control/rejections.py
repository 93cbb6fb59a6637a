"""An agent refused to start a job's workers: the job goes back to the queue, the slot's owner is found.

Before, a ``rejected`` report was logged and nothing else: the job stayed
``running`` on GPUs with no process, reconcile requeued it after a minute,
the tick placed it on the same free-looking GPU, and the agent refused
again, for ever.  Now::

    rejected start of J on node N (command start_workers / migrate)
      J running, holds GPUs on N ─▶ J requeued with the agent's reason
                                   (its other workers stopped; bounded: requeues.py)
      the slot was busy with worker wG of job H (the agent's process table) ─▶
          GPU G kept out of placement for SLOT_BUSY_SECONDS (a suspect mark naming H),
          so it is never both busy and free;
          H not running (ended, queued, unknown) ─▶ H's leftover processes on N stopped
          H running without holding G (its row was freed, its process trains on)
                                      ─▶ H's history says so

A refusal of a job that is ``scaling`` (a joiner's start) leaves the job to
the switch watchdog; the busy slot is still marked.  A refusal from a node
that does not host the job is not believed.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from control.report_time import report_time
from control.requeues import requeue_or_fail
from control.resume import rewind_to_checkpoint, stored_checkpoints
from inventory.services import do_mark_gpu_suspect
from jobs import agent_trust, holdings
from jobs.agent_commands import gpu_of_worker, job_id_from_name
from jobs.choices import ACTIVE_STATES, EventKind, JobState
from jobs.lifecycle import record, request_tick
from jobs.models import Job
from jobs.outbox import Outbox
from workers.protocol import Rejected

log = logging.getLogger(__name__)

STARTS = frozenset({"start_workers", "migrate"})
"""The commands whose refusal leaves a job placed with no process."""

SLOT_BUSY_SECONDS = 120.0
"""How long a GPU whose slot another process holds is kept out of placement."""

MARKED_BY = "control plane (slot busy)"


def on_rejected(report: Rejected, *, signed_by: str | None) -> str:
    """Apply an agent's refusal of a command; a short outcome for logs and tests."""
    log.warning("agent %s rejected a command: %s", report.node, report.error)
    if report.job is None or report.command_type not in STARTS:
        return "rejected"
    job_id = job_id_from_name(report.job)
    if job_id is None:
        return "rejected"
    if signed_by is not None and not agent_trust.hosts(report.node, job_id, report.job):
        return "refused: not hosted"
    now = report_time(report)
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return "rejected"
        here = _held_on(job, report.node)
        if report.busy_slot is not None and report.busy_job and report.busy_worker:
            _busy_slot(report, job, here, now)
        if job.state != JobState.RUNNING or not here:
            return "rejected"  # stale, or a switch's joiner: the watchdog's to undo
        resume = rewind_to_checkpoint(job, stored_checkpoints(job))
        why = f"{report.node} refused to start it: {report.error}"
        outcome = requeue_or_fail(job, why, resume, now, stop=True, spare=set(here.values()))
    request_tick()
    return outcome


def _held_on(job: Job, node: str) -> dict[int, int]:
    """The GPUs ``job`` holds on ``node``, by their local slot."""
    homes = holdings.gpu_homes(holdings.held_gpus(job))
    return {home.local: gpu for gpu, home in homes.items() if home.node == node}


def _busy_slot(report: Rejected, job: Job, here: dict[int, int], now: datetime) -> None:
    """Keep the busy GPU out of placement, and deal with the process that holds it."""
    assert report.busy_slot is not None and report.busy_job and report.busy_worker
    owner_gpu = gpu_of_worker(report.busy_worker)
    gpu = here.get(report.busy_slot, owner_gpu)
    if gpu is not None and gpu not in here.values():
        # A node speaks only of its own GPUs: one named elsewhere is not marked or stopped.
        home = holdings.gpu_homes([gpu]).get(gpu)
        if home is None or home.node != report.node or home.local != report.busy_slot:
            gpu = None
    owner_name = f"worker {report.busy_worker} of {report.busy_job}"
    if gpu is not None:
        do_mark_gpu_suspect(
            gpu=gpu,
            at=now,
            seconds=SLOT_BUSY_SECONDS,
            reason=f"slot {report.busy_slot} of {report.node} is busy with {owner_name}",
            job_id=None,
            by=MARKED_BY,
        )
    owner_id = job_id_from_name(report.busy_job)
    owner = None
    if owner_id is not None and owner_id != job.pk:
        owner = Job.objects.select_for_update().filter(pk=owner_id).first()
    if owner is None:
        return
    if owner.state not in ACTIVE_STATES:
        # Nothing of it should run: its leftover on that node is stopped.
        outbox = Outbox()
        if gpu is not None:
            outbox.stop_workers(owner, [gpu], reason=f"{owner.state}: leftover process")
            outbox.send_on_commit()
        record(
            owner,
            EventKind.NOTE,
            now,
            reason=f"its {owner_name} still ran on {report.node} while it was {owner.state}: "
            "stopped",
        )
    elif owner_gpu is not None and owner_gpu not in holdings.held_gpus(owner):
        record(
            owner,
            EventKind.NOTE,
            now,
            reason=f"its worker {report.busy_worker} still runs on {report.node} although its "
            f"GPU was released; GPU {owner_gpu} kept out of placement",
        )
