"""The ``log_lines`` report: a training process's output, into the job's stored log.

Runs inside ``handle_report``'s transaction with the job row locked, so it
stays cheap: one stream row, the new chunk, the cap's sum (and, for a report
without a rank, one lookup of the worker's GPU).
"""

from __future__ import annotations

from jobs.logs.store import LogTags, append_output
from jobs.models import Job, JobGpu
from workers.protocol import LogLines


def worker_rank(job: Job, worker_id: str) -> int | None:
    """The rank the job's GPU of ``worker_id`` holds now (``w<gpu index>``), or None."""
    digits = worker_id.removeprefix("w")
    if not digits.isdigit():
        return None
    return (
        JobGpu.objects.filter(job=job, gpu__index=int(digits))
        .values_list("rank", flat=True)
        .first()
    )


def tags_of(job: Job, report: LogLines) -> LogTags:
    """Worker, rank and generation of the output: the report's, else the portal's knowledge.

    The jobs app knows each held GPU's rank (``JobGpu``), not the runtime's
    generation: without the report's, the generation stays unknown.
    """
    rank = report.rank if report.rank is not None else worker_rank(job, report.worker_id)
    return LogTags(worker_id=report.worker_id, rank=rank, generation=report.generation)


def log_lines(job: Job, report: LogLines) -> str:
    """Store the report's output once; ``log`` or ``duplicate`` (nothing new in it)."""
    chunks = append_output(
        job=job,
        node=report.node,
        log_id=report.log_id,
        offset=report.offset,
        text=report.text,
        size=report.byte_size,
        tags=tags_of(job, report),
    )
    return "log" if chunks else "duplicate"
