"""``/metrics``: Prometheus text exposition of the cluster's state.

Gauges are computed from the database at scrape time (a few aggregate
queries); the tick duration and scale events are counted where they happen
and kept in Redis so that every process (web, Celery) contributes to one value.
"""

from __future__ import annotations

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from inventory.models import Gpu, ServerState
from jobs.choices import ACTIVE_STATES, EventKind, JobState
from jobs.control.tick_stats import read_tick_stats
from jobs.models import Job, JobEvent, JobGpu
from jobs.stats import completed_jcts

JCT_BUCKETS = (30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400, float("inf"))


def build_registry() -> CollectorRegistry:
    """A fresh registry filled from the database."""
    registry = CollectorRegistry()
    queue = Gauge("portal_queue_length", "Jobs waiting for GPUs.", registry=registry)
    queue.set(Job.objects.filter(state__in=(JobState.PENDING, JobState.QUEUED)).count())

    gpus = Gauge("portal_gpus", "GPUs by state.", ["state"], registry=registry)
    total = Gpu.objects.count()
    down = Gpu.objects.exclude(server__state=ServerState.UP).count()
    busy = JobGpu.objects.count()
    gpus.labels("busy").set(busy)
    gpus.labels("down").set(down)
    gpus.labels("idle").set(max(0, total - busy - down))

    by_state = Gauge("portal_jobs", "Jobs by state.", ["state"], registry=registry)
    counts = dict(
        Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
    )
    for state in JobState.values:
        by_state.labels(state).set(counts.get(state, 0))

    running_parallelism = Gauge(
        "portal_running_gpus_held", "GPUs held by running jobs.", registry=registry
    )
    running_parallelism.set(
        sum(Job.objects.filter(state__in=ACTIVE_STATES).values_list("parallelism", flat=True))
    )

    scale = Gauge(
        "portal_scale_events_total",
        "Scale, migration and preemption events.",
        ["kind"],
        registry=registry,
    )
    kinds = (EventKind.SCALED, EventKind.MIGRATED, EventKind.PREEMPTED, EventKind.RECOVERED)
    event_counts = dict(
        JobEvent.objects.filter(kind__in=kinds)
        .values_list("kind")
        .annotate(n=Count("id"))
        .values_list("kind", "n")
    )
    for kind in kinds:
        scale.labels(kind).set(event_counts.get(kind, 0))

    tick = read_tick_stats()
    Gauge(
        "portal_tick_seconds_last", "Duration of the last scheduler tick.", registry=registry
    ).set(tick.get("last", 0.0))
    Gauge("portal_tick_count", "Scheduler ticks run.", registry=registry).set(tick.get("count", 0))
    Gauge("portal_tick_seconds_sum", "Total time spent in ticks.", registry=registry).set(
        tick.get("sum", 0.0)
    )

    jct = Histogram(
        "portal_jct_seconds", "Job completion times.", buckets=JCT_BUCKETS, registry=registry
    )
    for value in completed_jcts(Job.objects.all()):
        jct.observe(value)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the metrics in Prometheus' text format."""
    return HttpResponse(generate_latest(build_registry()), content_type=CONTENT_TYPE_LATEST)
