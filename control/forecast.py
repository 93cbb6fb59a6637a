"""Predicted start, finish and queue position of the live cluster's jobs.

    maybe_refresh(now)            the tick calls it; cheap: one Redis SET NX PX after commit,
                                  none while the key this process set lives
    └─ due (once every FORECAST_SECONDS) → FORECAST_TASK on the ``whatif`` queue
        refresh_forecast()        Redis lock: one refresh at a time, never inside a tick
        1. read_cluster + build_snapshot      the tick's own view of the cluster
        2. + the jobs the tick leaves out now (held back by quota, scaling, profiling)
           + the jobs that wait, pending, for others or for a slot of their array, with
             what each waits for (jobs.dependencies.forecast_waits)
        3. remaining work per job             total steps, step, its size's average rate,
                                              less the time run since its last report
        4. scheduler.forecast.forecast        the production policy run forward
        5. store_estimates                    one bulk update; live updates on commit

The forecast is pure (``scheduler.forecast``); this module reads and writes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from control.assembly import type_quota_pairs
from control.policy import live_policy
from control.state import build_snapshot, label_pairs, read_cluster
from jobs.agent_commands import runtime_job_name
from jobs.choices import JobState
from jobs.dependencies import forecast_waits
from jobs.lifecycle import ESTIMATE_FIELDS, FORECAST_STATES, estimate_fields, save_estimates
from jobs.models import Job
from jobs.progress import seconds_left, total_steps
from scheduler.curves import policy_curve, relative_speeds
from scheduler.forecast import Estimate, Forecast, forecast, steady
from scheduler.types import JobState as ViewState
from scheduler.types import JobView
from utilities.realtime import broadcast_on_commit, job_group, tenant_group
from utilities.redis_clients import shared_redis

log = logging.getLogger(__name__)

FORECAST_TASK = "jobs.tasks.refresh_forecast"
DUE_KEY = "portal:forecast-due"
LOCK_KEY = "portal:forecast"


def remaining_work(
    *,
    total: int | None,
    step: int,
    batch_size: int,
    samples_per_s: float | None,
    parallelism: int,
    requested: int,
    curve: Mapping[int, float] | None,
    curve_known: bool,
    since_report_s: float = 0.0,
) -> float | None:
    """Seconds of work left at the requested size (``JobView.remaining_work``); None: unknown.

    A running job with a measured rate: the samples left at that rate, less
    the ``since_report_s`` it has run since it reported ``step`` (it goes on
    between reports: an estimate holds still until a report says otherwise),
    turned into requested-size seconds with the policy's curve (the forecast
    turns them back, so the measured rate is what it uses).  A job that is
    not running: the samples left at the curve's rate for its request, when
    the curve was profiled or measured (the linear prior is no measurement).
    """
    if total is None or batch_size <= 0:
        return None
    seconds_here = seconds_left(total, step, batch_size, samples_per_s)
    if seconds_here is not None:
        seconds_here = max(0.0, seconds_here - max(0.0, since_report_s))
    if seconds_here is not None and parallelism > 0:
        top = max([requested, parallelism, *(curve or {})])
        speeds = relative_speeds(curve, requested, top) if curve else None
        rate = speeds[parallelism] if speeds is not None else 1.0
        return seconds_here * rate if rate > 0 else seconds_here
    if curve_known and curve and curve.get(requested, 0.0) > 0:
        return max(0, total - step) * batch_size / curve[requested]
    return None


@dataclass(frozen=True)
class LiveForecast:
    """A forecast of the live cluster and the database ids of its jobs."""

    result: Forecast
    ids: dict[str, int]  # job name in the snapshot -> database id
    at: datetime


def _row_view(row: Mapping[str, Any], holdings: Mapping[int, list[int]], epoch: float) -> JobView:
    """A job the tick's snapshot leaves out now, as the forecast sees it."""
    held = tuple(holdings.get(row["id"], ())) if row["state"] != JobState.QUEUED else ()
    return JobView(
        id=runtime_job_name(row["id"]),
        submit_time=row["submitted_at"].timestamp() - epoch,
        requested_gpus=row["gpus"],
        tenant=row["tenant__slug"],
        min_gpus=row["min_gpus"],
        max_gpus=row["max_gpus"],
        gpus=held,
        attained_service=row["attained_gpu_seconds"],
        state=ViewState.RUNNING if held else ViewState.QUEUED,
        priority=row["priority"],
        throughput=_curve(row),
        weight=row["sched_weight"],
        gpu_types=tuple(row["gpu_types"] or ()),
        selector=label_pairs(row["node_selector"]),
    )


def _curve(row: Mapping[str, Any]) -> Mapping[int, float]:
    profiled = {int(k): float(v) for k, v in (row["throughput_curve"] or {}).items()}
    measured = {int(k): float(v) for k, v in (row["measured_curve"] or {}).items()}
    return policy_curve(profiled, measured, row["max_gpus"])


def compute_forecast(now: datetime) -> LiveForecast | None:
    """Read the cluster and run the production policy forward (no writes); None: no fabric."""
    cluster = read_cluster()
    if cluster is None:
        return None
    view = build_snapshot(cluster, now)
    rows = {
        row["id"]: row
        for row in Job.objects.filter(state__in=(*FORECAST_STATES, JobState.PENDING)).values(
            "id",
            "state",
            "submitted_at",
            "gpus",
            "min_gpus",
            "max_gpus",
            "parallelism",
            "attained_gpu_seconds",
            "priority",
            "workload",
            "args",
            "batch_size",
            "step",
            "samples_per_s",
            "throughput_curve",
            "measured_curve",
            "last_service_at",
            "tenant__slug",
            "tenant__gpu_quota",
            "tenant__gpu_type_quota",
            "sched_weight",
            "gpu_types",
            "node_selector",
        )
    }
    waits = forecast_waits(pk for pk, row in rows.items() if row["state"] == JobState.PENDING)
    for job_id in waits.left_out:
        rows.pop(job_id, None)
    epoch = now.timestamp()
    ids = dict(view.ids)
    views = list(view.snapshot.jobs)
    for job_id, row in rows.items():
        name = runtime_job_name(job_id)
        if name not in ids:
            views.append(_row_view(row, cluster.holdings, epoch))
            ids[name] = job_id
    with_work = []
    for job_view in views:
        data = rows.get(ids[job_view.id])
        if data is None:
            continue  # gone since the snapshot's read
        work = remaining_work(
            total=total_steps(data["workload"], data["args"] or {}, data["batch_size"]),
            step=data["step"],
            batch_size=data["batch_size"],
            samples_per_s=steady_rate(data, len(job_view.gpus)),
            parallelism=len(job_view.gpus),
            requested=job_view.requested_gpus,
            curve=job_view.throughput,
            curve_known=bool(data["throughput_curve"] or data["measured_curve"]),
            since_report_s=_since(data["last_service_at"], now) if job_view.gpus else 0.0,
        )
        with_work.append(dataclasses.replace(job_view, remaining_work=work))
    snapshot = dataclasses.replace(view.snapshot, jobs=tuple(with_work))  # keeps what else it has
    quota = {row["tenant__slug"]: row["tenant__gpu_quota"] for row in rows.values()}
    type_quota = {
        row["tenant__slug"]: per_type
        for row in rows.values()
        if (per_type := dict(type_quota_pairs(row["tenant__gpu_type_quota"])))
    }
    result = forecast(
        snapshot,
        live_policy(),
        quota=quota,
        waits_for=_named(waits.waits_for, rows),
        type_quota=type_quota,
    )
    unestimated: dict[str, Estimate] = {}
    for job_id, why in waits.left_out.items():  # no estimate, and why not
        name = runtime_job_name(job_id)
        unestimated[name] = Estimate(job=name, start=None, finish=None, reason=why)
        ids[name] = job_id
    result = dataclasses.replace(result, estimates={**result.estimates, **unestimated})
    return LiveForecast(result=result, ids=ids, at=now)


def _named(
    waits_for: Mapping[int, frozenset[int]], rows: Mapping[int, Any]
) -> dict[str, frozenset[str]]:
    """``waits_for`` by the snapshot's job names, over the jobs the forecast has."""
    return {
        runtime_job_name(job): frozenset(runtime_job_name(t) for t in targets if t in rows)
        for job, targets in waits_for.items()
        if job in rows
    }


def steady_rate(row: Mapping[str, Any], parallelism: int) -> float | None:
    """A running job's samples/s at its size: the running average of its reports there
    (``measured_curve``), not the last report alone, whose wobble would move every
    estimate behind it; the last report where no average is kept yet."""
    average = (row["measured_curve"] or {}).get(str(parallelism))
    if average is not None and float(average) > 0:
        return float(average)
    rate = row["samples_per_s"]
    return None if rate is None else float(rate)


def _since(reported: datetime | None, now: datetime) -> float:
    return 0.0 if reported is None else max(0.0, (now - reported).total_seconds())


def _at(now: datetime, seconds: float | None) -> datetime | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return (now + timedelta(seconds=seconds)).replace(microsecond=0)


def store_estimates(*, live: LiveForecast) -> list[int]:
    """Write every forecast job's estimates and position; clear those of jobs it left.

    Only the estimate fields are written (never a job's state), so a tick that
    moved a job meanwhile is not undone; the next refresh catches up.  Jobs
    whose figures changed are announced to their tenant and their page, on
    commit.  Returns the ids of those jobs.
    """
    positions = {name: index for index, name in enumerate(live.result.order, start=1)}
    wanted: dict[int, dict[str, Any]] = {}
    for name, estimate in live.result.estimates.items():
        job_id = live.ids.get(name)
        if job_id is None:
            continue
        wanted[job_id] = {
            "estimated_start": _at(live.at, estimate.start),
            "estimated_finish": _at(live.at, estimate.finish),
            "queue_position": positions.get(name),
            "estimate_reason": estimate.reason[:200],
        }
    blank: dict[str, Any] = {
        "estimated_start": None,
        "estimated_finish": None,
        "queue_position": None,
        "estimate_reason": "",
    }
    jobs = Job.objects.filter(Q(pk__in=list(wanted)) | Q(estimated_at__isnull=False)).only(
        "id", "tenant_id", *ESTIMATE_FIELDS
    )
    changed: list[Job] = []
    touched: list[Job] = []
    for job in jobs:
        values = _steady(job, wanted.get(job.pk, blank), live.at)
        if any(getattr(job, key) != value for key, value in values.items()):
            changed.append(job)
        for key, value in values.items():
            setattr(job, key, value)
        job.estimated_at = live.at if job.pk in wanted else None
        touched.append(job)
    with transaction.atomic():
        save_estimates(touched)
        _announce(changed)
    return [job.pk for job in changed]


def _steady(job: Job, values: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``values`` with each estimated time kept as stored where it moved too little to be news
    (``scheduler.forecast.steady``: a second's edge, a rate's wobble)."""
    out = dict(values)
    epoch = now.timestamp()
    for key in ("estimated_start", "estimated_finish"):
        stored, new = getattr(job, key), values[key]
        if stored is None or new is None:
            continue
        kept = steady(stored.timestamp() - epoch, new.timestamp() - epoch, 0.0)
        if kept != new.timestamp() - epoch:
            out[key] = stored
    return out


def _announce(changed: list[Job]) -> None:
    """One small event per tenant (its changed jobs) and one per changed job's page."""
    by_tenant: dict[int, list[dict[str, Any]]] = {}
    for job in changed:
        entry = {"job": job.pk, **estimate_fields(job)}
        by_tenant.setdefault(job.tenant_id, []).append(entry)
        page = {"type": "forecast.updated", "job": job.pk, "jobs": [entry]}
        broadcast_on_commit((job_group(job.pk),), page)
    for tenant_id, entries in by_tenant.items():
        payload = {"type": "forecast.updated", "tenant": tenant_id, "jobs": entries}
        broadcast_on_commit((tenant_group(tenant_id),), payload)


def _redis() -> redis.Redis:
    return shared_redis()


def refresh_forecast(now: datetime | None = None) -> list[int] | None:
    """Forecast and store, under a lock; None when another refresh holds it or no fabric."""
    lock = _redis().lock(LOCK_KEY, timeout=max(60.0, 6 * settings.FORECAST_SECONDS))
    if not lock.acquire(blocking=False):
        return None
    try:
        live = compute_forecast(now or timezone.now())
        return None if live is None else store_estimates(live=live)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("the forecast outlived its lock")


_asked_until: dict[str, float] = {}
"""Per Redis URL, until when (``time.monotonic``) the ``DUE_KEY`` this process set lives."""


def forget_asked() -> None:
    """Forget when this process last asked for a forecast: the next tick asks Redis (a test
    that deletes ``DUE_KEY``, or another process's clean slate)."""
    _asked_until.clear()


def maybe_refresh(now: datetime, *, clock: Callable[[], float] = time.monotonic) -> None:
    """Ask for a forecast in the background when one is due (the tick calls this every time).

    Due means none was asked for in the last ``FORECAST_SECONDS`` (a Redis key
    with that lifetime, set by whichever process asks).  The task is sent after
    the caller's transaction commits, on the ``whatif`` queue, and expires when
    the next one is due.  The process that set the key remembers until when it
    lives (``clock``, read before the ``SET``: never past the key's own end), and
    until then asks Redis nothing: its ``SET NX`` could only fail, and the tick
    saves a round trip every tick but one an interval.
    """
    interval = settings.FORECAST_SECONDS
    if interval <= 0:
        return
    url = str(settings.REDIS_URL)

    def enqueue() -> None:
        asked = clock()
        if asked < _asked_until.get(url, -math.inf):
            return  # this process's key still lives: not due
        try:
            if _redis().set(DUE_KEY, "1", nx=True, px=int(interval * 1000)):
                _asked_until[url] = asked + interval
                current_app.send_task(
                    FORECAST_TASK,
                    expires=interval,  # seconds from sending: the next one is due then
                    ignore_result=True,
                )
        except Exception:  # estimates only go stale; the tick must not fail for them
            log.warning("could not request a forecast", exc_info=True)

    transaction.on_commit(enqueue)
