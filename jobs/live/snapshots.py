"""Snapshots that live pages load on open and after every reconnect (their resync).

Events over the socket are small diffs; these functions give the whole view of
one tenant's jobs or of one job, built with a fixed number of queries.  Each
snapshot carries the ``seq`` of its group's last batch, read before its queries:
a page applies only the batches after it (``static/js/live.js``).
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Count, QuerySet, Sum

from jobs.choices import ACTIVE_STATES, ArtifactKind, JobState
from jobs.lifecycle import FORECAST_STATES, estimate_fields
from jobs.live.patches import history_row, live_workers, profile_curve
from jobs.live.summary import queue_ranks
from jobs.models import Job
from jobs.services import tenant_jct_stats
from tenancy.models import Tenant
from utilities.realtime import current_seq, job_group, tenant_group

ROW_LIMIT = 200
ROW_FIELDS = (
    "id",
    "name",
    "workload",
    "code",
    "launcher",
    "entrypoint",
    "state",
    "submitted_at",
    "gpus",
    "min_gpus",
    "max_gpus",
    "parallelism",
    "attained_gpu_seconds",
    "step",
    "samples_per_s",
    "queue_position",
    "estimated_start",
    "estimated_finish",
    "estimate_reason",
)
"""What a dashboard row shows (``job_row``): not the logs, arguments and allocations."""
METRIC_LIMIT = 2000
LOG_LINES = 40


def queue_positions() -> dict[int, int]:
    """Position (1-based) of every queued job in the policy's order, as the forecast stored it.

    Cluster-wide ranks (``control.forecast``) with the jobs that left the queue since
    taken out (``jobs.live.summary.queue_ranks``, the numbers events carry too); a
    job queued since the last refresh has none yet (at most ``FORECAST_SECONDS``).
    """
    return {pk: rank for pk, (rank, _) in queue_ranks().items()}


def estimates(job: Job) -> dict[str, Any]:
    """The job's predicted start and finish (ISO times or None) and why one is missing.

    Only a queued or running job has estimates; a job that ended since the
    last forecast shows none.
    """
    if job.state not in FORECAST_STATES:
        return {"estimated_start": None, "estimated_finish": None, "estimate_reason": ""}
    fields = estimate_fields(job)
    fields.pop("queue_position")
    return fields


def job_row(job: Job, positions: dict[int, int]) -> dict[str, Any]:
    """One row of the live jobs table."""
    return {
        "id": job.pk,
        "name": job.name,
        "workload": job.runs,
        "state": job.state,
        "gpus": job.gpus,
        "min_gpus": job.min_gpus,
        "max_gpus": job.max_gpus,
        "parallelism": job.parallelism,
        "attained_gpu_seconds": round(job.attained_gpu_seconds, 1),
        "queue_position": positions.get(job.pk),
        **estimates(job),
        "step": job.step,
        "throughput": job.samples_per_s,
        "submitted_at": job.submitted_at.isoformat(),
        "url": f"/jobs/{job.pk}/",
    }


def tenant_snapshot(tenant: Tenant, jobs: QuerySet[Job]) -> dict[str, Any]:
    """The dashboard's view of ``tenant``: its newest jobs, state counts, quota use, JCT."""
    seq = current_seq(tenant_group(tenant.pk))
    newest = jobs.filter(tenant=tenant).order_by("-submitted_at", "-id").only(*ROW_FIELDS)
    rows = list(newest[:ROW_LIMIT])
    positions = queue_positions()
    counts = dict.fromkeys(JobState.values, 0)
    in_use = 0
    # Counted by the database: a tenant of a 10,000-job cluster has thousands of jobs.
    by_state = (
        jobs.filter(tenant=tenant).values("state").annotate(n=Count("id"), gpus=Sum("parallelism"))
    )
    for row in by_state.order_by():
        counts[row["state"]] += row["n"]
        if row["state"] in ACTIVE_STATES:
            in_use += int(row["gpus"] or 0)
    return {
        "type": "tenant.snapshot",
        "tenant": tenant.pk,
        "seq": seq,
        "quota": tenant.gpu_quota,
        "in_use": in_use,
        "counts": counts,
        "jct": tenant_jct_stats(tenant).as_dict(),
        "jobs": [job_row(job, positions) for job in rows],
    }


def parallelism_series(job: Job) -> dict[str, list[Any]]:
    """The job's GPUs over time, as a step series from its events (ISO times, counts)."""
    times: list[str] = [job.submitted_at.isoformat()]
    values: list[int] = [0]
    for at, to_parallelism in job.events.exclude(to_parallelism=None).values_list(
        "at", "to_parallelism"
    ):
        times.append(at.isoformat())
        values.append(int(to_parallelism or 0))
    end = job.finished_at.isoformat() if job.finished_at else None
    if end and times[-1] != end:
        times.append(end)
        values.append(values[-1])
    return {"t": times, "gpus": values}


def throughput_series(job: Job) -> dict[str, list[Any]]:
    """The job's reported samples/s over time (its newest ``METRIC_LIMIT`` samples)."""
    rows = list(
        job.metrics.order_by("-at", "-id").values_list(
            "at", "samples_per_s", "parallelism", "step"
        )[:METRIC_LIMIT]
    )
    rows.reverse()
    return {
        "t": [at.isoformat() for at, *_ in rows],
        "samples_per_second": [round(v, 2) for _, v, _, _ in rows],
        "parallelism": [p for _, _, p, _ in rows],
        "step": [s for *_, s in rows],
    }


def final_step(job: Job) -> int:
    """The furthest step the job is known to have reached.

    Progress reports stop a little before the end; the final checkpoint is
    stored at the step training ended, so an ended job's progress ends there.
    """
    stored = job.artifacts.filter(kind=ArtifactKind.FINAL).order_by("-step").first()
    last = stored.step if stored is not None and stored.step is not None else 0
    return max(job.step, int(last))


def job_snapshot(job: Job) -> dict[str, Any]:
    """The job page's view: state, counters, settings that change, history, series."""
    seq = current_seq(job_group(job.pk))
    events = [history_row(e) for e in job.events.all()]
    return {
        "type": "job.snapshot",
        "job": job.pk,
        "seq": seq,
        "state": job.state,
        "parallelism": job.parallelism,
        "gpus": job.gpus,
        "min_gpus": job.min_gpus,
        "max_gpus": job.max_gpus,
        "submitted_at": job.submitted_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "restarts": job.restarts,
        "max_restarts": job.max_restarts,
        "args_json": json.dumps(job.args, indent=None, sort_keys=True) if job.args else "{}",
        "attained_gpu_seconds": round(job.attained_gpu_seconds, 1),
        "jct_seconds": job.jct_seconds,
        "wait_reason": job.wait_reason,
        "queue_position": queue_positions().get(job.pk),
        **estimates(job),
        "events": events,
        "parallelism_series": parallelism_series(job),
        "throughput_series": throughput_series(job),
        "profile": profile_curve(job),
        "step": final_step(job) if job.state == JobState.COMPLETED else job.step,
        "throughput": job.samples_per_s,
        "loss": job.loss,
        "log": job.log_tail.splitlines()[-LOG_LINES:],
        "workers": live_workers(job),
    }
