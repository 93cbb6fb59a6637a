"""Feeding what the live runtime measured into the simulator (pure).

The simulator builds each job's speed table from the analytic model of
:mod:`scheduler.throughput`; to predict a run of the real cluster it needs the
throughput the runtime measured instead.  This module turns a job's progress
samples (``JobMetric``: time, step, parallelism) into steps/s per GPU count,
the job's work into seconds at its requested size, and wraps a policy so that
the simulator's records carry the measured table, the job's own elastic range
and a start-up delay before the first step — without touching the simulator.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from scheduler.curves import policy_curve
from scheduler.policies.base import Plan, Policy, PolicyCore
from scheduler.records import JobRecord


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress report: seconds since a common origin, steps done, GPUs it ran on."""

    at: float
    step: int
    parallelism: int


def step_rates(samples: Sequence[Progress]) -> dict[int, float]:
    """Steps/s per GPU count: steps gained over time spent between consecutive reports.

    Only pairs of reports at the same parallelism count (a pair that spans a
    resize mixes two rates); a size with no such pair is absent.  The ratio of
    sums weights each interval by its length, so the figure is the rate the job
    really kept at that size under whatever contention the run had.
    """
    ordered = sorted(samples, key=lambda s: s.at)
    steps: dict[int, float] = {}
    seconds: dict[int, float] = {}
    for a, b in pairwise(ordered):
        dt = b.at - a.at
        if a.parallelism != b.parallelism or a.parallelism <= 0 or dt <= 0 or b.step < a.step:
            continue
        steps[a.parallelism] = steps.get(a.parallelism, 0.0) + (b.step - a.step)
        seconds[a.parallelism] = seconds.get(a.parallelism, 0.0) + dt
    return {n: steps[n] / seconds[n] for n in sorted(steps) if steps[n] > 0}


def startup_delay(started: float, samples: Sequence[Progress], rates: Mapping[int, float]) -> float:
    """Seconds from the job's start to its first step (process start, data, rendezvous).

    The first report came ``first.at - started`` seconds after the start, with
    ``first.step`` steps done; those steps took ``step / rate`` at the size it
    ran on, and the rest is the fixed cost.  Never negative; 0 without data.
    """
    if not samples:
        return 0.0
    first = min(samples, key=lambda s: s.at)
    rate = rates.get(first.parallelism, 0.0)
    work = first.step / rate if rate > 0 else 0.0
    return max(0.0, first.at - started - work)


@dataclass(frozen=True, slots=True)
class MeasuredJob:
    """A job of the real run as the simulator should see it.

    ``steps`` is its total work in mini-batches (fixed whatever its size: the
    global batch is fixed); ``rates`` the steps/s it kept at each size.
    """

    id: str
    requested: int
    min_gpus: int
    max_gpus: int
    steps: int
    rates: Mapping[int, float] = field(default_factory=dict)

    def curve(self) -> Mapping[int, float]:
        """Steps/s on 1..max_gpus: measured sizes as measured, the rest as the live policy fills them.

        Raises ValueError when nothing was measured (the prior's 1 step/s is no prediction).
        """
        if not any(rate > 0 for rate in self.rates.values()):
            raise ValueError(f"job {self.id}: no positive rate measured")
        return policy_curve({}, dict(self.rates), max(self.max_gpus, self.requested))

    def duration(self) -> float:
        """Seconds of work at the requested size (the simulator's ``TraceJob.duration``)."""
        return self.steps / self.curve()[self.requested]

    def speed_table(self) -> tuple[float, ...]:
        """Progress rate on 0..max_gpus relative to the requested size (``JobRecord.speed``)."""
        curve = self.curve()
        ref = curve[self.requested]
        top = max(self.max_gpus, self.requested)
        return (0.0, *(curve[n] / ref for n in range(1, top + 1)))

    def gain_ref(self) -> float:
        """throughput(requested) / throughput(1): turns relative rates into speedups over one GPU."""
        curve = self.curve()
        return curve[self.requested] / curve[1]


class MeasuredPolicy(Policy):
    """``inner`` with each job's measured speed table, own elastic range and a start-up delay.

    The simulator makes its records from the trace (an analytic speed table,
    a range of ``max_scale`` x the request); the core this policy hands out
    rewrites each record as it joins (``add``) from ``jobs`` (by id), and on
    each first start (``decide``) holds the job's progress back by
    ``startup_s`` seconds, the fixed cost the real runtime pays before its
    first step (the simulator's cost model charges nothing to a first start).
    """

    def __init__(self, inner: Policy, jobs: Mapping[str, MeasuredJob], startup_s: float) -> None:
        self.inner = inner
        self.jobs = dict(jobs)
        self.startup_s = max(0.0, startup_s)
        self.name = inner.name
        self.elastic = bool(getattr(inner, "elastic", False))
        self.class_ageing_s = inner.class_ageing_s

    def new_core(self, total_gpus: int) -> PolicyCore:
        """The inner policy's core, with ``add`` and ``decide`` wrapped."""
        core = self.inner.new_core(total_gpus)
        add, decide = core.add, core.decide
        jobs, startup = self.jobs, self.startup_s

        def measured_add(job: JobRecord, now: float) -> None:
            measured = jobs.get(job.id)
            if measured is not None:
                job.min_gpus = measured.min_gpus
                job.max_gpus = max(measured.max_gpus, job.requested)
                job.speed = measured.speed_table()
                job.gain_ref = measured.gain_ref()
            add(job, now)

        def delayed_decide(now: float) -> Plan:
            plan = decide(now)
            for job, n in plan:
                if n > 0 and not job.running and job.start_time is None:
                    job.resume_at = max(job.resume_at, now + startup)
            return plan

        setattr(core, "add", measured_add)  # noqa: B010 - instance hooks on a core we own
        setattr(core, "decide", delayed_decide)  # noqa: B010
        return core


def median_or(values: Sequence[float], default: float) -> float:
    """The median of ``values``, or ``default`` when there are none."""
    return statistics.median(values) if values else default
