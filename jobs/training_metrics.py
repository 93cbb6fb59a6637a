"""The metrics a program logs (``ctx.log_metrics``): stored capped, read back as series.

::

    add_points(job, points, at)      (job row locked by the report handler)
        ├── room        METRICS_MAX_POINTS minus what the job already has
        ├── store       one TrainingMetric per (step, name, value), in one bulk insert
        └── over cap    the rest is dropped, and the job's history says so once

    metric_series(job, since_step)   {name: [[step, value], ...]}, step order, bounded
    progress_series(job, since_step) the control plane's progress samples (JobMetric), with loss

The only writer of :class:`~jobs.models.TrainingMetric`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings

from jobs.choices import EventKind
from jobs.lifecycle import record
from jobs.models import Job, JobMetric, TrainingMetric
from jobs.sweeps import on_trial_metrics
from workers.protocol import MetricPoint

CAP_NOTE_KEY = "metrics_capped"
"""The ``data`` key of the one history event that says logged metrics were dropped."""

MAX_SERIES_POINTS = 20_000
"""The most (step, value) pairs one read returns, over all names."""

MAX_PROGRESS_POINTS = 5_000
"""The most progress samples one read returns (the newest)."""


def add_points(job: Job, points: Sequence[MetricPoint], at: datetime) -> int:
    """Store the points of one ``metrics`` report; returns how many values were stored.

    Values beyond the job's ``METRICS_MAX_POINTS`` are dropped; the first
    time that happens an event in the job's history says so.
    """
    cap = int(settings.METRICS_MAX_POINTS)
    values = [(point.step, name, value) for point in points for name, value in point.values.items()]
    room = max(cap - TrainingMetric.objects.filter(job=job).count(), 0)
    kept = values[:room]
    TrainingMetric.objects.bulk_create(
        TrainingMetric(job=job, step=step, name=name, value=value, at=at)
        for step, name, value in kept
    )
    dropped = len(values) - len(kept)
    if dropped and not job.events.filter(kind=EventKind.NOTE, data__has_key=CAP_NOTE_KEY).exists():
        record(
            job,
            EventKind.NOTE,
            at,
            reason=f"logged metrics reached METRICS_MAX_POINTS ({cap} values): "
            "later values are dropped",
            data={CAP_NOTE_KEY: cap},
        )
    if kept:
        on_trial_metrics(job=job, at=at)  # a sweep trial's result may be what came
    return len(kept)


def metric_series(job: Job, since_step: int | None = None) -> dict[str, list[list[Any]]]:
    """The job's logged metrics by name, each ``[[step, value], ...]`` in step order.

    At most ``MAX_SERIES_POINTS`` pairs in all (the lowest steps after
    ``since_step``; a client polls on from the last step it has).
    """
    rows = TrainingMetric.objects.filter(job=job)
    if since_step is not None:
        rows = rows.filter(step__gt=since_step)
    series: dict[str, list[list[Any]]] = {}
    ordered = rows.order_by("step", "id").values_list("name", "step", "value")
    for name, step, value in ordered[:MAX_SERIES_POINTS]:
        series.setdefault(name, []).append([step, value])
    return series


def progress_series(job: Job, since_step: int | None = None) -> list[dict[str, Any]]:
    """The job's progress samples (step, time, samples/s, GPUs, loss), oldest first.

    The newest ``MAX_PROGRESS_POINTS`` of them (after ``since_step``).
    """
    rows = JobMetric.objects.filter(job=job)
    if since_step is not None:
        rows = rows.filter(step__gt=since_step)
    newest = rows.order_by("-at", "-id").values_list(
        "step", "at", "samples_per_s", "parallelism", "loss"
    )[:MAX_PROGRESS_POINTS]
    return [
        {
            "step": step,
            "at": at.isoformat(),
            "samples_per_s": samples_per_s,
            "parallelism": parallelism,
            "loss": loss,
        }
        for step, at, samples_per_s, parallelism, loss in reversed(list(newest))
    ]
