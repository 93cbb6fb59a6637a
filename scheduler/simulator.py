"""Discrete-event simulator: replays a trace through a policy core on a GPU cluster.

Events, in this order at one timestamp (as the public Tiresias simulator):
completions release GPUs, arrivals join (in trace order), then one
scheduling pass.  The pass also runs when the policy asks for a wake-up
(demotion checks) and, optionally, on a periodic tick.  Completions sit in a
heap with lazy invalidation, so an event costs what changed.

Placement here is by count; GPU ids only matter to fabric-aware experiments
(:mod:`scheduler.fabric_placement`), which use a communication slowdown
instead.  Scaling and preemption costs are parameters (all free by default,
as in the Tiresias simulator).
"""

from __future__ import annotations

import heapq
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.policies.base import Policy
from scheduler.records import JobRecord
from scheduler.throughput import speed_table, speedup_over_one
from scheduler.traces import TraceJob


@dataclass(frozen=True, slots=True)
class ScalingCost:
    """Seconds of lost progress when a job's allocation changes.

    ``stop_resume`` charges ``restart_s`` to every start after a preemption
    and every resize (EDL measured 40-80 s); ``stop_free`` charges only
    ``broadcast_s`` to existing workers on scale-out and nothing on scale-in
    (new workers prepare their context while the others train).  ``free``
    charges nothing (the Tiresias simulator).
    """

    mode: str = "free"
    restart_s: float = 40.0
    broadcast_s: float = 1.0

    def pause(self, old: int, new: int, resumed: bool) -> float:
        """Seconds without progress after going from ``old`` to ``new`` GPUs."""
        if self.mode == "free" or new <= 0:
            return 0.0
        if self.mode == "stop_resume":
            return self.restart_s if (old > 0 or resumed) else 0.0
        if self.mode == "stop_free":
            if resumed:
                return self.restart_s
            return self.broadcast_s if new > old > 0 else 0.0
        raise ValueError(f"unknown scaling cost mode {self.mode!r}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulation knobs.

    ``elastic`` gives every job a speed table from the throughput model with
    ``max_scale`` x requested GPUs at most and ``min_fraction`` x requested at
    least; ``comm_slowdown`` maps (job, GPUs) to a factor >= 1 on its
    communication time (ECMP contention); ``sample_every`` thins the time
    series (seconds).
    """

    total_gpus: int
    gpus_per_server: int = 8
    tick: float | None = None
    cost: ScalingCost = field(default_factory=ScalingCost)
    elastic: bool = False
    max_scale: float = 2.0
    min_fraction: float = 0.5
    sample_every: float = 60.0
    progress: bool = False
    slowdown: Callable[[TraceJob], float] | None = None


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

    @property
    def jct(self) -> float:
        """Completion time minus submit time."""
        return self.end - self.submit


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-job results, a thinned time series and the summary figures."""

    policy: str
    jobs: tuple[JobResult, ...]
    series: dict[str, list[float]]
    summary: dict[str, Any]


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _make_record(idx: int, job: TraceJob, cfg: SimConfig, elastic: bool) -> JobRecord:
    if elastic:
        top = max(job.gpus, int(job.gpus * cfg.max_scale))
        top = min(top, cfg.total_gpus)
        low = max(1, math.ceil(job.gpus * cfg.min_fraction))
        model = job.model or "resnet50"
        speed = speed_table(model, job.gpus, top, cfg.gpus_per_server)
        rec = JobRecord(
            job.id, idx, job.submit, job.gpus, job.duration,
            tenant=job.tenant, model=job.model, min_gpus=low, max_gpus=top, speed=speed,
        )  # fmt: skip
        rec.gain_ref = speedup_over_one(model, job.gpus, cfg.gpus_per_server)
        return rec
    return JobRecord(
        job.id, idx, job.submit, job.gpus, job.duration, tenant=job.tenant, model=job.model
    )


def simulate(trace: Sequence[TraceJob], policy: Policy, cfg: SimConfig) -> SimResult:
    """Replay ``trace`` (sorted by submit time) through ``policy``; returns results and figures."""
    core = policy.new_core(cfg.total_gpus)
    elastic = cfg.elastic or bool(getattr(policy, "elastic", False))
    records = [_make_record(i, j, cfg, elastic) for i, j in enumerate(trace)]
    n_jobs = len(records)
    with_model = any(j.model for j in trace)
    comp: list[tuple[float, int, JobRecord, int]] = []
    seq = 0
    ai = 0
    used = 0
    eff_sum = 0.0
    busy_area = 0.0
    eff_area = 0.0
    first = trace[0].submit if trace else 0.0
    prev = first
    results: list[JobResult] = []
    series: dict[str, list[float]] = {
        "t": [],
        "busy": [],
        "efficiency": [],
        "queued": [],
        "running": [],
    }
    next_sample = first
    scale_events = 0
    preemptions = 0
    running_count = 0
    tick = cfg.tick
    next_tick = first + tick if tick else math.inf
    contrib: dict[JobRecord, float] = {}

    bar: Any = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=n_jobs, file=sys.stderr, unit="job", mininterval=0.5)
    done = 0

    def contribution(job: JobRecord, n: int) -> float:
        if n <= 0:
            return 0.0
        if with_model:
            return speedup_over_one(job.model or "resnet50", n, cfg.gpus_per_server)
        return float(n)

    while ai < n_jobs or comp:
        while comp and comp[0][2].version != comp[0][3]:
            heapq.heappop(comp)
        t_comp = comp[0][0] if comp else math.inf
        t_arr = records[ai].submit if ai < n_jobs else math.inf
        wake = core.next_wakeup()
        t_wake = wake if wake is not None else math.inf
        now = min(t_comp, t_arr, t_wake, next_tick)
        if now == math.inf:
            break  # nothing runs and nothing arrives: the rest can never be placed
        if now > prev:
            dt = now - prev
            busy_area += used * dt
            eff_area += eff_sum * dt
            prev = now
        if now >= next_tick:
            next_tick = now + tick if tick and (running_count or ai < n_jobs) else math.inf
        # 1. completions
        while comp and comp[0][0] <= now:
            _, _, job, version = heapq.heappop(comp)
            if job.version != version:
                continue
            job.settle(now)
            job.remaining = 0.0
            core.remove(job, now)
            used -= job.alloc
            eff_sum -= contrib.pop(job, 0.0)
            running_count -= 1
            job.running = False
            job.end_time = now
            job.version += 1
            results.append(
                JobResult(
                    job.id, job.submit, job.start_time if job.start_time is not None else now,
                    now, job.requested, job.duration, job.model, job.preemptions, job.scale_events,
                )
            )  # fmt: skip
            done += 1
        # 2. arrivals
        while ai < n_jobs and records[ai].submit <= now:
            core.add(records[ai], now)
            ai += 1
        # 3. one pass
        for job, n in core.decide(now):
            job.settle(now)
            old = job.alloc if job.running else 0
            resumed = not job.running and job.start_time is not None
            job.version += 1
            if n <= 0:
                if job.running:
                    used -= old
                    eff_sum -= contrib.pop(job, 0.0)
                    running_count -= 1
                job.running = False
                job.alloc = 0
                job.preemptions += 1
                preemptions += 1
                continue
            if job.running:
                if n == old:
                    job.version -= 1
                    continue
                scale_events += 1
                job.scale_events += 1
                used += n - old
            else:
                running_count += 1
                used += n
                if job.start_time is None:
                    job.start_time = now
            eff_sum -= contrib.pop(job, 0.0)
            c = contribution(job, n)
            contrib[job] = c
            eff_sum += c
            job.alloc = n
            job.running = True
            pause = cfg.cost.pause(old, n, resumed)
            if pause > 0 and now + pause > job.resume_at:
                job.resume_at = now + pause
            seq += 1
            heapq.heappush(comp, (job.finish_time(), seq, job, job.version))
        if now >= next_sample:
            series["t"].append(now)
            series["busy"].append(used)
            series["efficiency"].append(eff_sum)
            series["queued"].append(core.waiting_count())
            series["running"].append(running_count)
            next_sample = now + cfg.sample_every
        if bar is not None and done - bar.n >= 200:
            bar.update(done - bar.n)
    if bar is not None:
        bar.update(done - bar.n)
        bar.close()

    results.sort(key=lambda r: (r.submit, r.id))
    summary = summarize(
        results, cfg.total_gpus, busy_area, eff_area, first, prev, scale_events, preemptions,
        unfinished=n_jobs - len(results),
    )  # fmt: skip
    summary["policy"] = policy.name
    return SimResult(policy.name, tuple(results), series, summary)


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
        "makespan": round(makespan, 4),
        "gpu_utilization": round(busy_area / (total_gpus * span), 6),
        "cluster_efficiency": round(eff_area / (total_gpus * span), 6),
        "scale_events": scale_events,
        "preemptions": preemptions,
    }
