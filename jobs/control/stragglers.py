"""What the control plane does with a straggler report: shrink the job around that worker.

::

    straggler report (worker wG, ratio)
        ─▶ record it in the job's history (always)
        ─▶ not running / not held / a torchrun program / at min_gpus ─▶ keep it (say why)
        ─▶ else: SCALING, ScaleIn(wG) to the runtime (sent on commit)
                 ─▶ the runtime's scale_done (``reports._scale_done``) frees GPU G
                    and returns the job to RUNNING at one GPU fewer

The runtime flags a straggler with its noise-robust rule
(``workers/elastic/straggler.py``) and, under the agent, does not remove it
itself (``--drop-stragglers`` is off): the control plane decides, since it
knows the job's elastic range and who else waits for GPUs.
"""

from __future__ import annotations

from datetime import datetime

from jobs import holdings
from jobs.agent_commands import gpu_of_worker, membership_commands
from jobs.choices import EventKind, JobState
from jobs.lifecycle import broadcast, record, transition
from jobs.models import Job
from jobs.outbox import Outbox, launch_of


def why_kept(job: Job, gpu: int | None, held: tuple[int, ...]) -> str | None:
    """Why the straggler on ``gpu`` stays in ``job`` (None: it can be removed)."""
    if job.state != JobState.RUNNING:
        return f"the job is {job.state}"
    if gpu is None or gpu not in held:
        return "the job does not hold that worker's GPU"
    if job.restarts_to_resize:
        return "a torchrun program cannot shrink without a restart"
    if len(held) - 1 < job.min_gpus:
        return f"the job is at its minimum of {job.min_gpus} GPUs"
    return None


def shrink_around_straggler(job: Job, worker: str, ratio: float, at: datetime) -> str:
    """Record the straggler ``worker`` of ``job`` and, if the job may shrink, remove it.

    Called inside the report's transaction with ``job`` locked; the ScaleIn
    goes out on commit. Returns ``"straggler removed"`` or ``"straggler"``.
    """
    held = holdings.held_gpus(job)
    gpu = gpu_of_worker(worker)
    kept = why_kept(job, gpu, held)
    what = f"worker {worker} is {ratio:.2f}x slower than its peers"
    record(
        job,
        EventKind.STRAGGLER,
        at,
        reason=f"{what}; kept: {kept}" if kept else f"{what}; removing it",
        data={"worker": worker, "ratio": ratio, "removed": kept is None},
    )
    if kept is not None or gpu is None:
        return "straggler"
    new = [g for g in held if g != gpu]
    reason = f"straggler {worker} ({ratio:.2f}x) removed"
    outbox = Outbox()
    outbox.extend(
        membership_commands(launch_of(job), held, new, holdings.gpu_homes(held), reason=reason)
    )
    transition(
        job, JobState.SCALING, reason=f"switching {len(held)}→{len(new)} GPUs: {reason}", at=at
    )
    outbox.send_on_commit()
    broadcast(job, "job.updated")
    return "straggler removed"
