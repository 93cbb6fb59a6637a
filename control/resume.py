"""Where a job that goes back to the queue resumes: its latest checkpoint in the artifact store.

Shared by every path that requeues a job whose processes are gone without
being asked to stop (reconcile found no process, a failed program is
retried): the job's step goes back to the checkpoint its next run restores,
and its history says which.  The runtime restores the newest complete
checkpoint under the job's store prefix by itself; a torchrun program keeps
its own in its ``CHECKPOINT_DIR``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from jobs.artifacts import checkpoint_manifests
from jobs.models import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredCheckpoints:
    """What the job's store holds: its newest complete checkpoint and whether one is final."""

    latest_step: int | None
    final_step: int | None


def stored_checkpoints(job: Job) -> StoredCheckpoints:
    """Read the manifests of ``job``'s checkpoints from the artifact store (no tensors loaded)."""
    try:
        manifests = checkpoint_manifests(job)
    except OSError as exc:
        log.warning("cannot read the checkpoints of job %s: %s", job.pk, exc)
        return StoredCheckpoints(None, None)
    finals = [m.step for m in manifests if m.final]
    return StoredCheckpoints(
        latest_step=manifests[0].step if manifests else None,
        final_step=max(finals) if finals else None,
    )


def rewind_to_checkpoint(job: Job, stored: StoredCheckpoints) -> str:
    """Set ``job.step`` to where its next run starts (saved by the caller); say where, in words."""
    if stored.latest_step is not None:
        job.step = stored.latest_step
        return f"resumes from step {stored.latest_step}"
    if job.restarts_to_resize:  # a torchrun program keeps its own checkpoints
        return "the program resumes from its CHECKPOINT_DIR"
    job.step = 0
    return "no checkpoint stored: restarts from step 0"
