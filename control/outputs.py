"""What a job produced, as its runtime reports it: stored objects, skipped checkpoints, metrics.

::

    artifact_stored     a row for <job prefix>/<path>   (re-reported: size and sha256 updated)
        ├── pruned      rows of the checkpoints the runtime deleted go too
        └── keep rule   checkpoint rows beyond the newest CHECKPOINT_KEEP go too
    checkpoint_skipped  a warning in the job's history: which step, why, what was used
    metrics             TrainingMetric rows, capped per job (jobs.training_metrics)

Called by ``control.reports.handle_report`` with the job row locked and
the report already deduplicated (its ``event_id``).  A report is untrusted:
its path is only ever appended to the prefix of the job it names, and only a
path under the folder its kind belongs to is recorded.
"""

from __future__ import annotations

import logging

from django.conf import settings

from control.report_time import report_time
from jobs.artifacts import FOLDER_OF_KIND, forget_old_checkpoints, forget_paths, record_artifact
from jobs.choices import ArtifactKind, EventKind
from jobs.lifecycle import record
from jobs.models import Job
from jobs.training_metrics import add_points
from workers.protocol import ArtifactStored, CheckpointSkipped, Metrics

log = logging.getLogger(__name__)


def artifact_stored(job: Job, report: ArtifactStored) -> str:
    """Record the stored object and forget the checkpoints pruned with it."""
    folder = FOLDER_OF_KIND[report.kind]
    if not report.path.startswith(folder + "/"):
        log.warning(
            "job %s: %s object reported outside %s/: %r", job.pk, report.kind, folder, report.path
        )
        return f"invalid: a {report.kind} object must lie in {folder}/"
    record_artifact(
        job=job,
        kind=report.kind,
        job_path=report.path,
        size=report.size,
        sha256=report.sha256,
        at=report_time(report),
        step=report.step,
        name=report.name,
    )
    forget_paths(job, report.pruned)
    if report.kind in (ArtifactKind.CHECKPOINT, ArtifactKind.FINAL):
        forget_old_checkpoints(job, int(settings.CHECKPOINT_KEEP))
    return "artifact"


def checkpoint_skipped(job: Job, report: CheckpointSkipped) -> str:
    """Say in the job's history that a corrupt checkpoint was passed over."""
    record(
        job,
        EventKind.WARNING,
        report_time(report),
        reason=f"checkpoint at step {report.step} failed its checksum ({report.reason}): "
        "skipped, resumed from the previous one",
        data={"step": report.step},
    )
    return "checkpoint skipped"


def metrics(job: Job, report: Metrics) -> str:
    """Store the logged metrics (up to the job's cap)."""
    stored = add_points(job, report.points, report_time(report))
    return "metrics" if stored else "metrics dropped"
