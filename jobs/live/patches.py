"""What a job's page and the cluster view patch themselves from, carried by the job's events.

The services broadcast one small payload per changed job (``lifecycle.job_payload``:
state, parallelism, GPU-time, progress).  The job's page and the cluster view show
more than a dashboard row, and patch it from the events instead of reloading::

    job-<id> group   job.updated/…  + page_fields: started, finished, size range,
                                      restarts, JCT, the profiled curve, its workers
                     job.event      one history row (every new JobEvent: post_save,
                                    which bulk writers send too)
                     job.sample     one progress sample (lifecycle.record_metric)
    cluster group    job.updated/…  + cluster_fields: the GPUs and cables it holds now,
                                      its name, thr(n)/thr(1), per-GPU efficiency, JCT

Everything here is read from the job in memory: no query, so a tick that changes
1,000 jobs pays for none.  History rows are the snapshot's rows (``jobs.live.snapshots``).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from jobs.agent_commands import worker_id
from jobs.choices import ACTIVE_STATES, EventKind, JobState
from jobs.models import Job, JobEvent
from scheduler.curves import gpu_efficiency, speedup
from utilities.realtime import Message, job_group, messages_on_commit

STATE_LABELS = {
    JobState.PENDING: "Pending",
    JobState.QUEUED: "Queued",
    JobState.RUNNING: "Running",
    JobState.SCALING: "Scaling",
    JobState.COMPLETED: "Completed",
    JobState.FAILED: "Failed",
    JobState.CANCELLED: "Cancelled",
}
"""What a state change is called in a job's history: the state it reached."""


def event_label(event: JobEvent) -> str:
    """What happened, in the words of a job's history.

    One kind can record two moments: a profile is requested ("profiling
    throughput from ...") and later measured ("throughput profiled at ...");
    a state change is named for the state it reached ("Queued", "Completed").
    """
    if event.kind == EventKind.PROFILED:
        return (
            "Profiling started" if event.reason.startswith("profiling") else "Throughput profiled"
        )
    if event.kind == EventKind.STATE and event.to_state in STATE_LABELS:
        return STATE_LABELS[JobState(event.to_state)]
    return str(EventKind(event.kind).label) if event.kind in EventKind.values else event.kind


def history_row(event: JobEvent) -> dict[str, Any]:
    """One row of a job's history, as its page shows it (snapshot and ``job.event`` alike)."""
    return {
        "at": event.at.isoformat(),
        "kind": event.kind,
        "label": event_label(event),
        "from_state": event.from_state,
        "to_state": event.to_state,
        "from_parallelism": event.from_parallelism,
        "to_parallelism": event.to_parallelism,
        "reason": event.reason,
    }


def history_saved(
    sender: type[JobEvent], instance: JobEvent, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    """``post_save`` receiver: the job's page gets the new history row after commit.

    A signal rather than a call in ``lifecycle.record``, so that events written in
    bulk (which send ``post_save`` themselves) reach the page too.
    """
    if not created or raw:
        return
    messages_on_commit(functools.partial(_history_message, instance))  # built after commit


def _history_message(event: JobEvent) -> list[Message]:
    """The job page's patch for one new history row."""
    row = {
        "type": "job.event",
        "job": event.job_id,
        "tenant": event.job.tenant_id,
        "event": history_row(event),
    }
    return [Message((job_group(event.job_id),), row)]


def profile_curve(job: Job) -> dict[str, list[Any]]:
    """The profiled throughput-vs-GPUs curve (EDL profile()), sorted by GPU count."""
    points = sorted((int(k), float(v)) for k, v in (job.throughput_curve or {}).items())
    return {"gpus": [n for n, _ in points], "samples_per_second": [v for _, v in points]}


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def page_fields(job: Job) -> dict[str, Any]:
    """What the job's page shows besides the dashboard row's fields.

    ``workers`` are the ids its terminal offers (``static/js/terminal.js``), in rank
    order: the allocation's GPUs, which ``jobs.holdings`` keeps equal to the ``JobGpu``
    rows a shell is opened on (``shells.services.worker_nodes``); none unless it runs.
    """
    return {
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "gpus": job.gpus,
        "min_gpus": job.min_gpus,
        "max_gpus": job.max_gpus,
        "restarts": job.restarts,
        "max_restarts": job.max_restarts,
        "jct_seconds": job.jct_seconds,
        "profile": profile_curve(job),
        "wait_reason": job.wait_reason,
        "workers": live_workers(job),
    }


def live_workers(job: Job) -> list[str]:
    """The ids of ``job``'s workers now, in rank order (its allocation's GPUs): what its
    page's terminal offers; none unless it runs."""
    gpus, _ = held(job)
    return [worker_id(gpu) for gpu in gpus]


def held(job: Job) -> tuple[list[int], list[list[int]]]:
    """The GPU indices and ``[leaf, uplink port]`` cables the job holds now (its allocation)."""
    allocation = job.allocation or {}
    if job.state not in ACTIVE_STATES or not allocation:
        return [], []
    leaves, uplinks = allocation.get("leaves", []), allocation.get("uplinks", [])
    return list(allocation.get("gpus", [])), [[leaf, u] for leaf in leaves for u in uplinks]


def cluster_fields(job: Job) -> dict[str, Any]:
    """What the cluster view shows of the job: where it is, how well it uses its GPUs."""
    gpus, cables = held(job)
    width = job.parallelism if job.state in ACTIVE_STATES else 0
    return {
        "name": job.name,
        "gpus": gpus,
        "cables": cables,
        "speedup": round(speedup(job.throughput_curve, width), 4) if width else 0.0,
        "gpu_efficiency": gpu_efficiency(job.throughput_curve, width, job.samples_per_s),
        "jct_seconds": job.jct_seconds if job.state == JobState.COMPLETED else None,
    }


def sample_row(
    *, at: datetime, step: int, parallelism: int, samples_per_s: float, loss: float | None
) -> dict[str, Any]:
    """One progress sample, as the throughput chart plots it."""
    return {
        "at": at.isoformat(),
        "step": step,
        "parallelism": parallelism,
        "samples_per_s": round(samples_per_s, 2),
        "loss": loss,
    }
