"""``/metrics``: Prometheus text exposition of the cluster's state.

Gauges are computed from the database at scrape time, each by one aggregate
query whatever the number of jobs (the JCT histogram too: its buckets are
counted by the database, never by reading every finished job).  The held
GPU-seconds per tenant (``portal_gpu_seconds_total``) are summed from the jobs'
parallelism history (``jobs.usage``), also by one aggregate query.  The tick
duration is counted where it happens and kept in Redis so that every process
(web, Celery) contributes to one value.

Who may read it: a scraper with ``Authorization: Bearer <METRICS_TOKEN>``, or a
signed-in cluster admin.  With ``METRICS_TOKEN`` unset only admins may.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, FloatField, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Now
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from control.incremental import MISMATCH_FIELD
from control.tick_stats import read_tick_stats
from inventory.hardware import gpu_health_rows
from inventory.models import Gpu, Server, ServerState
from jobs.choices import ACTIVE_STATES, EventKind, JobState
from jobs.models import Job, JobEvent
from jobs.usage import gpu_seconds_by_tenant

JCT_BUCKETS = (30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
"""Upper bounds (seconds) of the JCT histogram's buckets; ``+Inf`` follows."""


def jct_histogram() -> HistogramMetricFamily:
    """Completed jobs' JCTs as a Prometheus histogram, counted in one aggregate query."""
    jct = ExpressionWrapper(F("finished_at") - F("submitted_at"), output_field=DurationField())
    bounds = {f"le_{i}": bound for i, bound in enumerate(JCT_BUCKETS)}
    row = (
        Job.objects.filter(state=JobState.COMPLETED, finished_at__isnull=False)
        .annotate(jct=jct)
        .aggregate(
            count=Count("id"),
            total=Sum("jct"),
            **{
                key: Count("id", filter=Q(jct__lte=timedelta(seconds=bound)))
                for key, bound in bounds.items()
            },
        )
    )
    buckets = [(str(float(bound)), float(row[key])) for key, bound in bounds.items()]
    buckets.append(("+Inf", float(row["count"])))
    total = row["total"]
    return HistogramMetricFamily(
        "portal_jct_seconds",
        "Job completion times.",
        buckets=buckets,
        sum_value=total.total_seconds() if total is not None else 0.0,
    )


class _JctCollector:
    """Adds the JCT histogram to a registry (prometheus_client's custom-collector protocol)."""

    def collect(self) -> Iterator[HistogramMetricFamily]:
        yield jct_histogram()


def gpu_seconds_counter(tenants: Iterable[str]) -> CounterMetricFamily:
    """Every GPU-second held per tenant, from the jobs' parallelism history (``jobs.usage``).

    A counter: the total up to the scrape only grows (unless jobs are deleted).
    Each of ``tenants`` (those with jobs) has a sample, 0 before its first job ran.
    """
    totals = gpu_seconds_by_tenant(now=timezone.now())
    family = CounterMetricFamily(
        "portal_gpu_seconds", "GPU-seconds held by the tenant's jobs.", labels=["tenant"]
    )
    for slug in sorted(set(tenants) | set(totals)):
        family.add_metric([slug], round(totals.get(slug, 0.0), 3))
    return family


class _UsageCollector:
    """Adds the GPU-seconds counter to a registry."""

    def __init__(self, tenants: Iterable[str]) -> None:
        self.tenants = tuple(tenants)

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield gpu_seconds_counter(self.tenants)


class _MismatchCollector:
    """The incremental tick's kept state found different from a full rebuild (a counter)."""

    def __init__(self, count: float) -> None:
        self.count = count

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "portal_tick_state_mismatches",
            "Verify passes that found the tick's kept state different from the database.",
            value=self.count,
        )


def environment_counters() -> Iterator[CounterMetricFamily]:
    """Tenants' environments at their workers' starts (``Started.environment``, kept in the
    job's history): starts by cache hit or build, and the seconds spent building, counted by
    the database in one aggregate query."""
    notes = JobEvent.objects.filter(kind=EventKind.NOTE, data__has_key="environment")
    built = Q(data__hit=False)
    row = notes.aggregate(
        hits=Count("id", filter=Q(data__hit=True)),
        builds=Count("id", filter=built),
        seconds=Sum(Cast(KeyTextTransform("build_s", "data"), FloatField()), filter=built),
    )
    starts = CounterMetricFamily(
        "portal_environment_starts",
        "Starts of workers in a job's own environment, by whether the node's cache had it.",
        labels=["result"],
    )
    starts.add_metric(["hit"], float(row["hits"]))
    starts.add_metric(["built"], float(row["builds"]))
    yield starts
    seconds = float(row["seconds"] or 0.0)
    yield CounterMetricFamily(
        "portal_environment_build_seconds",
        "Seconds nodes spent building jobs' environments.",
        value=round(seconds, 3),
    )


class _EnvironmentCollector:
    """Adds the environments' counters to a registry."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield from environment_counters()


HEALTH_GAUGES = (
    ("temperature_c", "portal_gpu_temperature_celsius", "GPU temperature, as NVML reports it."),
    ("utilization_pct", "portal_gpu_utilization_percent", "GPU utilization, as NVML reports it."),
    ("memory_used_mib", "portal_gpu_memory_used_mib", "GPU memory in use, as NVML reports it."),
    ("ecc_uncorrected", "portal_gpu_ecc_uncorrected", "Uncorrectable ECC errors (volatile)."),
    ("ecc_corrected", "portal_gpu_ecc_corrected", "Corrected ECC errors (volatile)."),
    ("xid", "portal_gpu_last_xid", "The last XID event NVML raised on the GPU."),
)
"""Health figure → metric name and help.  A GPU whose agent has no NVML has no sample:
a series is never invented."""


def gpu_health_families() -> Iterator[GaugeMetricFamily]:
    """Each GPU's reported health (one query: the servers' last hardware reports)."""
    families = {
        key: GaugeMetricFamily(name, text, labels=["node", "gpu", "gpu_type"])
        for key, name, text in HEALTH_GAUGES
    }
    rows = Server.objects.order_by("node").values_list(
        "node", "gpu_type", "gpu_count", "agent_info__hardware"
    )
    for node, gpu_type, count, hardware in rows:
        for local, health in enumerate(gpu_health_rows(hardware, count)):
            for key, family in families.items():
                value = health.get(key) if health is not None else None
                if isinstance(value, int | float) and not isinstance(value, bool):
                    family.add_metric([node, str(local), gpu_type], float(value))
    yield from families.values()


GPU_COUNTS = ("total", "down", "suspect", "held")


def gpu_counts_by_type() -> dict[str, dict[str, int]]:
    """Per GPU type: its GPUs, those down or draining, suspect, held by a job (one query)."""
    rows = Gpu.objects.values("server__gpu_type").annotate(
        total=Count("id"),
        down=Count("id", filter=~Q(server__state=ServerState.UP)),
        suspect=Count("id", filter=Q(suspect_until__gt=Now())),  # as suspect_in_effect()
        held=Count("id", filter=Q(assignment__isnull=False)),
    )
    return {row["server__gpu_type"]: {key: row[key] for key in GPU_COUNTS} for row in rows}


class _HealthCollector:
    """Adds each GPU's reported health to a registry."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from gpu_health_families()


def build_registry() -> CollectorRegistry:
    """A fresh registry filled from the database."""
    registry = CollectorRegistry()
    queue = Gauge("portal_queue_length", "Jobs waiting for GPUs.", registry=registry)
    queue.set(Job.objects.filter(state__in=(JobState.PENDING, JobState.QUEUED)).count())

    gpus = Gauge("portal_gpus", "GPUs by state.", ["state"], registry=registry)
    by_type = gpu_counts_by_type()
    by_type_gauge = Gauge(
        "portal_gpus_by_type",
        "GPUs by type and whether a job holds them.",
        ["gpu_type", "held"],
        registry=registry,
    )
    for gpu_type, numbers in by_type.items():
        by_type_gauge.labels(gpu_type, "yes").set(numbers["held"])
        by_type_gauge.labels(gpu_type, "no").set(numbers["total"] - numbers["held"])
    counts = {key: sum(one[key] for one in by_type.values()) for key in GPU_COUNTS}
    total, down, busy = counts["total"], counts["down"], counts["held"]
    gpus.labels("busy").set(busy)
    gpus.labels("down").set(down)
    gpus.labels("idle").set(max(0, total - busy - down))
    Gauge(
        "portal_suspect_gpus",
        "GPUs in a straggler's cool-down: no new placement lands on them.",
        registry=registry,
    ).set(counts["suspect"])

    by_state = Gauge("portal_jobs", "Jobs by state.", ["state"], registry=registry)
    counts = dict(
        Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
    )
    for state in JobState.values:
        by_state.labels(state).set(counts.get(state, 0))

    per_tenant = Gauge(
        "portal_tenant_jobs", "Jobs by tenant and state.", ["tenant", "state"], registry=registry
    )
    tenants: set[str] = set()
    for row in (
        Job.objects.values("tenant__slug", "state")
        .annotate(n=Count("id"))
        .values_list("tenant__slug", "state", "n", named=True)
    ):
        per_tenant.labels(row.tenant__slug, row.state).set(row.n)
        tenants.add(row.tenant__slug)

    running_parallelism = Gauge(
        "portal_running_gpus_held", "GPUs held by running jobs.", registry=registry
    )
    held = Job.objects.filter(state__in=ACTIVE_STATES).aggregate(n=Sum("parallelism"))["n"]
    running_parallelism.set(held or 0)

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

    registry.register(_MismatchCollector(tick.get(MISMATCH_FIELD, 0.0)))
    registry.register(_JctCollector())
    registry.register(_UsageCollector(tenants))
    registry.register(_EnvironmentCollector())
    registry.register(_HealthCollector())
    return registry


def bearer_token_matches(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (never for no token)."""
    scheme, _, presented = header.partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the metrics in Prometheus' text format, to the scraper's token or an admin."""
    header = request.headers.get("Authorization", "")
    if not bearer_token_matches(header, str(settings.METRICS_TOKEN or "")):
        if not request.user.is_authenticated:
            response = HttpResponse("Authentication required.\n", status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        if not request.user.is_staff:
            return HttpResponse("Cluster admins only.\n", status=403)
    return HttpResponse(generate_latest(build_registry()), content_type=CONTENT_TYPE_LATEST)
