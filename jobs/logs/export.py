"""A finished job's whole log, written once into the artifact store as ``logs/job.log``.

::

    transition(job, completed | failed | cancelled)      jobs.lifecycle
        └── on commit: enqueue jobs.tasks.export_job_log(job id), a little later
                       (the agents' last lines may still be on their way)
    export_log(job_id)
        ├── every stored line, in order, "[worker] text"  (jobs.logs.store.all_lines)
        ├── streamed into the store at <job prefix>/logs/job.log (atomic, hashed as written)
        └── the Artifact(kind=log) row, created or updated

Idempotent: a second run writes the same object again (with any lines that
arrived late) and updates the same row.  A job with no stored output (never
ran, or its log already expired) exports nothing.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from jobs.artifacts import LOG_PATH, artifact_store, prefix_of, record_artifact
from jobs.choices import TERMINAL_STATES, ArtifactKind
from jobs.logs.store import all_lines
from jobs.models import Artifact, Job

log = logging.getLogger(__name__)


def export_log(job_id: int) -> Artifact | None:
    """Write job ``job_id``'s whole log to the store and record it; None if there is nothing."""
    job = Job.objects.select_related("tenant").filter(pk=job_id).first()
    if job is None or job.state not in TERMINAL_STATES:
        return None
    if not job.log_chunks.exists():
        return None
    lines = (
        (f"[{line.worker}] " if line.worker else "").encode() + (line.text + "\n").encode()
        for line in all_lines(job)
    )
    stored = artifact_store().put_stream(f"{prefix_of(job)}/{LOG_PATH}", lines)
    if not stored.size:
        artifact_store().delete(stored.path)
        return None
    artifact = record_artifact(
        job=job,
        kind=ArtifactKind.LOG,
        job_path=LOG_PATH,
        size=stored.size,
        sha256=stored.sha256,
        at=timezone.now(),
        name="job.log",
    )
    log.info("job %s: log exported (%d bytes)", job.pk, stored.size)
    return artifact
