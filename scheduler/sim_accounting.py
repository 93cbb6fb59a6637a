"""What a simulated run adds up: per-job results, the time series and the summary figures.

:class:`Accounting` is booked by the loop (:mod:`scheduler.simulation`) at
every change the placement accepted; :class:`SimResult` is what
:func:`scheduler.simulator.simulate` returns; :func:`summarize` and
:func:`jct_by` turn results into the JSON figures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.priority import CLASS_NAMES, NORMAL
from scheduler.records import JobRecord
from scheduler.sim_config import SimConfig
from scheduler.throughput import speedup_over_one


@dataclass(frozen=True, slots=True)
class JobResult:
    """One finished job."""

    id: str
    submit: float
    start: float
    end: float
    gpus: int
    duration: float
    model: str
    preemptions: int
    scale_events: int
    tenant: str = ""
    klass: int = NORMAL
    restarts: int = 0
    failed: str = ""  # why the job failed ("" when it completed)
    run_time: float = 0.0  # seconds it held GPUs; jct - run_time is time spent waiting

    @property
    def jct(self) -> float:
        """Completion time minus submit time."""
        return self.end - self.submit


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-job results, a thinned time series and the summary figures.

    ``jobs`` are the completed jobs (the JCT statistics); ``failed`` the jobs
    that ended failed (retries used up, or their run-time limit).
    """

    policy: str
    jobs: tuple[JobResult, ...]
    series: dict[str, list[float]]
    summary: dict[str, Any]
    failed: tuple[JobResult, ...] = ()


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


class Accounting:
    """What a run adds up: busy GPUs, cluster efficiency, counters, time series, results.

    Between two events the loop calls :meth:`advance`; every change the
    placement accepted is booked here, so the summary and the series come
    from one place whatever the policy and the placement.
    """

    def __init__(
        self, cfg: SimConfig, first: float, with_model: bool, fabric: bool, by_tenant: bool = False
    ) -> None:
        self.total = cfg.total_gpus
        self.gpus_per_server = cfg.gpus_per_server
        self.sample_every = cfg.sample_every
        self.with_model = with_model
        self.first = first
        self.prev = first
        self.next_sample = first
        self.used = 0
        self.eff_sum = 0.0
        self.busy_area = 0.0
        self.eff_area = 0.0
        self.running = 0
        self.scale_events = 0
        self.preemptions = 0
        self.worst_slowdown = 1.0
        self.contrib: dict[JobRecord, float] = {}
        self.results: list[JobResult] = []
        self.failed: list[JobResult] = []
        self.restarts = 0
        self.series: dict[str, list[float]] = {
            "t": [],
            "busy": [],
            "efficiency": [],
            "queued": [],
            "running": [],
        }
        if fabric:
            self.series["slowdown"] = []
        # GPUs held and GPU-seconds held per tenant (kept only with fair share on)
        self.by_tenant = by_tenant
        self.tenant_held: dict[str, int] = {}
        self.tenant_area: dict[str, float] = {}

    def _hold(self, job: JobRecord, delta: int) -> None:
        self.tenant_held[job.tenant] = self.tenant_held.get(job.tenant, 0) + delta

    def advance(self, now: float) -> None:
        """Integrate busy GPUs and efficiency up to ``now``."""
        if now > self.prev:
            dt = now - self.prev
            self.busy_area += self.used * dt
            self.eff_area += self.eff_sum * dt
            self.prev = now
            if self.by_tenant:
                area = self.tenant_area
                for name, gpus in self.tenant_held.items():
                    area[name] = area.get(name, 0.0) + gpus * dt

    def _contribution(self, job: JobRecord, n: int) -> float:
        if n <= 0:
            return 0.0
        if self.with_model:
            return speedup_over_one(job.model or "resnet50", n, self.gpus_per_server)
        return float(n)

    def started(self, job: JobRecord, n: int) -> None:
        """A queued job got ``n`` GPUs."""
        self.running += 1
        self.used += n
        if self.by_tenant:
            self._hold(job, n)
        self.eff_sum -= self.contrib.pop(job, 0.0)
        c = self._contribution(job, n)
        self.contrib[job] = c
        self.eff_sum += c

    def resized(self, job: JobRecord, old: int, n: int) -> None:
        """A running job went from ``old`` to ``n`` GPUs."""
        self.scale_events += 1
        job.scale_events += 1
        self.used += n - old
        if self.by_tenant:
            self._hold(job, n - old)
        self.eff_sum -= self.contrib.pop(job, 0.0)
        c = self._contribution(job, n)
        self.contrib[job] = c
        self.eff_sum += c

    def preempted(self, job: JobRecord, old: int, was_running: bool) -> None:
        """A job was told to stop (it counts as a preemption even if it held nothing)."""
        if was_running:
            self.used -= old
            if self.by_tenant:
                self._hold(job, -old)
            self.eff_sum -= self.contrib.pop(job, 0.0)
            self.running -= 1
        job.preemptions += 1
        self.preemptions += 1

    def _release(self, job: JobRecord) -> None:
        self.used -= job.alloc
        if self.by_tenant:
            self._hold(job, -job.alloc)
        self.eff_sum -= self.contrib.pop(job, 0.0)
        self.running -= 1

    def _result(self, job: JobRecord, now: float, failed: str = "") -> JobResult:
        return JobResult(
            job.id, job.submit, job.start_time if job.start_time is not None else now,
            now, job.requested, job.duration, job.model, job.preemptions, job.scale_events,
            job.tenant, job.own_klass, job.restarts, failed, job.executed,
        )  # fmt: skip

    def finished(self, job: JobRecord, now: float) -> None:
        """A running job completed at ``now``."""
        self.used -= job.alloc  # _release and _result inlined: this runs once per job
        if self.by_tenant:
            self._hold(job, -job.alloc)
        self.eff_sum -= self.contrib.pop(job, 0.0)
        self.running -= 1
        self.results.append(
            JobResult(
                job.id, job.submit, job.start_time if job.start_time is not None else now,
                now, job.requested, job.duration, job.model, job.preemptions, job.scale_events,
                job.tenant, job.own_klass, job.restarts, run_time=job.executed,
            )
        )  # fmt: skip

    def requeued(self, job: JobRecord) -> None:
        """A running job's program failed and it waits for another try (not a preemption)."""
        self._release(job)
        self.restarts += 1

    def ended_failed(self, job: JobRecord, now: float, reason: str) -> None:
        """A job (running or queued) ends failed at ``now``."""
        if job.running:
            self._release(job)
        self.failed.append(self._result(job, now, reason))

    def sample(self, now: float, queued: int) -> None:
        """Append one point to the time series (the loop calls it once ``next_sample`` is due)."""
        series = self.series
        series["t"].append(now)
        series["busy"].append(self.used)
        series["efficiency"].append(self.eff_sum)
        series["queued"].append(queued)
        series["running"].append(self.running)
        if "slowdown" in series:
            series["slowdown"].append(self.worst_slowdown)
        self.next_sample = now + self.sample_every

    def summary(self, unfinished: int) -> dict[str, Any]:
        """The JSON summary (see :func:`summarize`)."""
        self.results.sort(key=lambda r: (r.submit, r.id))
        out = summarize(
            self.results, self.total, self.busy_area, self.eff_area, self.first, self.prev,
            self.scale_events, self.preemptions, unfinished=unfinished,
        )  # fmt: skip
        if self.failed or self.restarts:
            out["failed"] = len(self.failed)
            out["restarts"] = self.restarts
        if len({r.klass for r in self.results}) > 1:
            by_name = jct_by(self.results, lambda r: CLASS_NAMES[r.klass])
            out["by_class"] = {n: by_name[n] for n in CLASS_NAMES.values() if n in by_name}
        if self.by_tenant:
            groups = jct_by(self.results, lambda r: r.tenant)
            for name, row in groups.items():
                row["gpu_seconds"] = round(self.tenant_area.get(name, 0.0), 1)
            out["by_tenant"] = groups
        return out


def distribution(values: Sequence[float]) -> dict[str, float]:
    """Mean, median, p95 and max of ``values`` (all 1.0 when empty: nothing slowed down)."""
    v = sorted(values) or [1.0]
    return {
        "mean": round(statistics.fmean(v), 4),
        "p50": round(_percentile(v, 0.5), 4),
        "p95": round(_percentile(v, 0.95), 4),
        "max": round(v[-1], 4),
    }


def jct_by(
    results: Sequence[JobResult], group: Callable[[JobResult], str]
) -> dict[str, dict[str, float]]:
    """JCT (avg, median, p95) and job count per group (``group(result) -> name``), by name."""
    buckets: dict[str, list[float]] = {}
    for r in results:
        buckets.setdefault(group(r), []).append(r.jct)
    out: dict[str, dict[str, float]] = {}
    for name in sorted(buckets):
        jcts = sorted(buckets[name])
        out[name] = {
            "jobs": len(jcts),
            "avg_jct": round(statistics.fmean(jcts), 4),
            "median_jct": round(_percentile(jcts, 0.5), 4),
            "p95_jct": round(_percentile(jcts, 0.95), 4),
        }
    return out


def summarize(
    results: Sequence[JobResult],
    total_gpus: int,
    busy_area: float,
    eff_area: float,
    first: float,
    last: float,
    scale_events: int,
    preemptions: int,
    unfinished: int = 0,
) -> dict[str, Any]:
    """The JSON summary: JCT statistics, queueing delay, makespan, utilization, efficiency."""
    jcts = sorted(r.jct for r in results)
    waits = [r.start - r.submit for r in results]
    runs = [r.run_time for r in results]
    makespan = (max(r.end for r in results) - first) if results else 0.0
    span = max(last - first, 1e-9)
    return {
        "jobs": len(results),
        "unfinished": unfinished,
        "avg_jct": round(statistics.fmean(jcts), 4) if jcts else 0.0,
        "median_jct": round(_percentile(jcts, 0.5), 4),
        "p95_jct": round(_percentile(jcts, 0.95), 4),
        "p99_jct": round(_percentile(jcts, 0.99), 4),
        "avg_queueing_delay": round(statistics.fmean(waits), 4) if waits else 0.0,
        # JCT = time holding GPUs + time waiting (before the first start and after preemptions)
        "avg_run_time": round(statistics.fmean(runs), 4) if runs else 0.0,
        "avg_waiting": round(statistics.fmean(jcts) - statistics.fmean(runs), 4) if runs else 0.0,
        "makespan": round(makespan, 4),
        "gpu_utilization": round(busy_area / (total_gpus * span), 6),
        "cluster_efficiency": round(eff_area / (total_gpus * span), 6),
        "scale_events": scale_events,
        "preemptions": preemptions,
    }
