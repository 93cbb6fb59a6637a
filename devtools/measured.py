"""Feeding what the live runtime measured into the simulator (pure).

The simulator builds each job's speed table from the analytic model of
:mod:`scheduler.throughput`; to predict a run of the real cluster it needs what
the runtime measured instead.  This module turns a job's progress samples
(``JobMetric``: time, step, parallelism) and the run's busy GPU slots into:

* steps/s per GPU count (:func:`step_rates`): wall clock over each stretch the
  job trained at one size, checkpoints and stalls inside it included; with
  shared CPUs (:class:`SharedCpu`) each second is weighed by how crowded the
  CPUs were, so the rate is the job's own, not the run's contention;
* the fixed costs at its edges: start to first step (:func:`startup_delay`)
  and last step to recorded end (:func:`finish_delay`);
* the CPU-sharing law of the run (:func:`fit_shared_cpu`): the demo cluster
  emulates GPU slots with processes, 8 slots on 2 cores here, so a job's rate
  falls as more slots are busy.  A property of this emulation that a real GPU
  cluster does not have; the simulator applies it as ``SimConfig.slot_slowdown``.

:class:`MeasuredJob` is a job as the simulator should see it, and
:class:`MeasuredPolicy` wraps a policy so that the simulator's records carry
the measured speed table and the job's own elastic range.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from scheduler.curves import policy_curve, record_measurement
from scheduler.policies.base import Plan, Policy, PolicyCore
from scheduler.records import JobRecord


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress report: seconds since a common origin, steps done, GPUs it ran on."""

    at: float
    step: int
    parallelism: int


@dataclass(frozen=True, slots=True)
class SharedCpu:
    """How crowded CPUs slow every busy slot: step time x ``max(cores, busy + external) / cores``.

    ``busy`` slots of this cluster and ``external`` runnable processes of
    other work on the machine share ``cores`` CPUs; while they fit, a slot has
    a core of its own (factor 1).  ``external`` is fitted from the run
    (:func:`fit_shared_cpu`): the other sessions' load, as the slots saw it.
    """

    cores: float
    external: float = 0.0

    def factor(self, busy: float) -> float:
        """How much longer a step takes with ``busy`` slots busy than on a free core."""
        return max(self.cores, busy + self.external) / self.cores

    def table(self, slots: int) -> tuple[float, ...]:
        """``factor`` at 0..slots busy slots (``SimConfig.slot_slowdown``)."""
        return tuple(self.factor(b) for b in range(slots + 1))


class BusySlots:
    """The number of busy GPU slots over time: a step function built from changes."""

    def __init__(self, changes: Iterable[tuple[float, int]]) -> None:
        ordered = sorted(changes, key=lambda c: c[0])
        self.times: list[float] = []
        self.counts: list[int] = []
        busy = 0
        for at, delta in ordered:
            busy += delta
            if self.times and self.times[-1] == at:
                self.counts[-1] = busy
            else:
                self.times.append(at)
                self.counts.append(busy)

    def at(self, t: float) -> int:
        """Busy slots just after ``t`` (0 before the first change)."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[i] if i >= 0 else 0

    def pieces(self, t0: float, t1: float) -> list[tuple[float, int]]:
        """(seconds, busy) of each constant piece of ``[t0, t1]``."""
        if t1 <= t0:
            return []
        out: list[tuple[float, int]] = []
        at, busy = t0, self.at(t0)
        for i in range(bisect.bisect_right(self.times, t0), len(self.times)):
            if self.times[i] >= t1:
                break
            out.append((self.times[i] - at, busy))
            at, busy = self.times[i], self.counts[i]
        out.append((t1 - at, busy))
        return out

    def mean(self, t0: float, t1: float) -> float:
        """Time-weighted mean of busy slots over ``[t0, t1]`` (the value at ``t0`` if empty)."""
        pieces = self.pieces(t0, t1)
        if not pieces:
            return float(self.at(t0))
        return sum(dt * b for dt, b in pieces) / (t1 - t0)

    def free_seconds(self, t0: float, t1: float, cpu: SharedCpu) -> float:
        """``[t0, t1]`` in seconds of a free core: each second divided by that moment's factor."""
        return sum(dt / cpu.factor(b) for dt, b in self.pieces(t0, t1))


def _same_size_pairs(samples: Sequence[Progress]) -> list[tuple[Progress, Progress]]:
    """Consecutive reports at one size (a pair that spans a resize mixes two rates)."""
    ordered = sorted(samples, key=lambda s: s.at)
    return [
        (a, b)
        for a, b in pairwise(ordered)
        if a.parallelism == b.parallelism and a.parallelism > 0 and b.at > a.at and b.step >= a.step
    ]


def step_totals(
    samples: Sequence[Progress], busy: BusySlots | None = None, cpu: SharedCpu | None = None
) -> dict[int, tuple[float, float]]:
    """(steps, seconds) per GPU count, summed over consecutive reports at that count.

    Only pairs of reports at the same parallelism count; a size with no such
    pair is absent.  The sums are the wall clock of each stretch at one size,
    so whatever the job paid inside it (checkpoints, stalls) is in them.  With
    ``busy`` and ``cpu`` each second counts as ``1 / factor`` seconds of a
    free core: the time the job would have taken with a core per slot.
    """
    out: dict[int, tuple[float, float]] = {}
    for a, b in _same_size_pairs(samples):
        dt = b.at - a.at if busy is None or cpu is None else busy.free_seconds(a.at, b.at, cpu)
        steps, seconds = out.get(a.parallelism, (0.0, 0.0))
        out[a.parallelism] = (steps + (b.step - a.step), seconds + dt)
    return dict(sorted(out.items()))


def step_rates(
    samples: Sequence[Progress], busy: BusySlots | None = None, cpu: SharedCpu | None = None
) -> dict[int, float]:
    """Steps/s per GPU count (:func:`step_totals` divided; sizes with no steps are absent)."""
    return {
        n: steps / seconds
        for n, (steps, seconds) in step_totals(samples, busy, cpu).items()
        if steps > 0 and seconds > 0
    }


def first_step_at(samples: Sequence[Progress], rates: Mapping[int, float]) -> float | None:
    """When the job's first step began: the first report less the steps it had done by then.

    ``rates`` are wall-clock rates (without ``busy``); None without reports.
    """
    if not samples:
        return None
    first = min(samples, key=lambda s: s.at)
    rate = rates.get(first.parallelism, 0.0)
    return first.at - (first.step / rate if rate > 0 else 0.0)


def startup_delay(started: float, samples: Sequence[Progress], rates: Mapping[int, float]) -> float:
    """Seconds from the job's start to its first step (process start, data, rendezvous).

    The first report came ``first.at - started`` seconds after the start, with
    ``first.step`` steps done; those steps took ``step / rate`` at the size it
    ran on, and the rest is the fixed cost.  Never negative; 0 without data.
    """
    began = first_step_at(samples, rates)
    return 0.0 if began is None else max(0.0, began - started)


def finish_delay(
    finished: float, final_step: int, samples: Sequence[Progress], rates: Mapping[int, float]
) -> float | None:
    """Seconds from the job's last step to its recorded end (checkpoint, exit, report).

    The last report is ``final_step - last.step`` steps short of the end;
    those take ``steps / rate`` at its size, and the rest is the job's end
    holding its GPUs.  Never negative; None without reports.
    """
    if not samples:
        return None
    last = max(samples, key=lambda s: s.at)
    rate = rates.get(last.parallelism, 0.0)
    left = max(0, final_step - last.step)
    done = last.at + (left / rate if rate > 0 else 0.0)
    return max(0.0, finished - done)


@dataclass(frozen=True, slots=True)
class CpuFit:
    """A fitted sharing law and how well it explains the data (weighted log variance)."""

    cpu: SharedCpu
    residual: float  # with the law
    residual_without: float  # with one value per group (no law)
    weight: float  # seconds of training (rates) or start-ups (start-ups) the fit saw


EXTERNAL_GRID = tuple(x / 4 for x in range(129))  # 0 to 32 runnable processes


def _fit_external(
    points: Sequence[tuple[object, float, float, float]],
    cores: float,
    sign: float,
    grid: Sequence[float],
) -> CpuFit:
    """The ``external`` of ``grid`` that makes ``log(value) + sign * log(factor(busy))`` most
    constant within each group; ``points`` are (group, value, busy, weight).

    A rate falls as the factor grows (``sign`` +1: rate x factor is the free
    rate); a start-up lengthens (``sign`` -1: start-up / factor is the free one).
    """
    total = sum(w for _, _, _, w in points)

    def residual(cpu: SharedCpu | None) -> float:
        groups: dict[object, list[tuple[float, float]]] = {}
        for group, value, busy, weight in points:
            factor = cpu.factor(busy) if cpu is not None else 1.0
            groups.setdefault(group, []).append((math.log(value) + sign * math.log(factor), weight))
        spread = 0.0
        for values in groups.values():
            mass = sum(w for _, w in values)
            mean = sum(x * w for x, w in values) / mass
            spread += sum(w * (x - mean) ** 2 for x, w in values)
        return spread / total

    if total <= 0:
        return CpuFit(SharedCpu(cores), 0.0, 0.0, 0.0)
    best = min(grid, key=lambda e: (residual(SharedCpu(cores, e)), e))
    law = SharedCpu(cores, best)
    return CpuFit(law, residual(law), residual(None), total)


def fit_shared_cpu(
    jobs: Mapping[str, Sequence[Progress]],
    busy: BusySlots,
    cores: float,
    grid: Sequence[float] = EXTERNAL_GRID,
) -> CpuFit:
    """The ``external`` load (of ``grid``) that best explains each job's rates by busy slots.

    Each job's stretches between reports are pooled by (size, busy slots
    rounded): one rate per pool, weighted by its seconds.  A job at one size
    has one free-core rate; the law predicts how it falls as slots fill.  The
    fit minimizes the weighted variance of log(rate x factor) within each
    (job, size): the law that makes every job's free-core rate most constant.
    Pools remove the reports' own jitter (each report's time is when the agent
    forwarded it), which would otherwise drown the trend.
    """
    pools: dict[tuple[str, int, int], list[float]] = {}
    for job, samples in jobs.items():
        for a, b in _same_size_pairs(samples):
            if b.step == a.step:
                continue
            key = (job, a.parallelism, round(busy.mean(a.at, b.at)))
            pool = pools.setdefault(key, [0.0, 0.0])
            pool[0] += b.step - a.step
            pool[1] += b.at - a.at
    points = [
        ((job, size), steps / seconds, float(b), seconds)
        for (job, size, b), (steps, seconds) in pools.items()
    ]
    return _fit_external(points, cores, +1.0, grid)


def implied_external(
    jobs: Mapping[str, Sequence[Progress]],
    free_rates: Mapping[str, Mapping[int, float]],
    busy: BusySlots,
    cores: float,
    bin_s: float,
) -> list[tuple[float, float, float]]:
    """The other load each stretch of training implies, averaged per ``bin_s`` of the run.

    A stretch at rate ``r`` of a job whose free-core rate is ``R`` had a
    factor ``R / r``, hence ``cores * R / r - busy`` other runnable processes.
    Returns (bin start, implied external load, seconds of training in the bin),
    bins from the earliest report: how far the run's load drifted from the one
    constant the fit gives the simulator.
    """
    pairs = [
        (a, b, free_rates[job][a.parallelism])
        for job, samples in jobs.items()
        for a, b in _same_size_pairs(samples)
        if b.step > a.step and free_rates.get(job, {}).get(a.parallelism, 0.0) > 0
    ]
    if not pairs or bin_s <= 0:
        return []
    origin = min(a.at for a, _, _ in pairs)
    bins: dict[int, list[float]] = {}
    for a, b, free in pairs:
        seconds = b.at - a.at
        external = cores * free * seconds / (b.step - a.step) - busy.mean(a.at, b.at)
        acc = bins.setdefault(int((a.at - origin) // bin_s), [0.0, 0.0])
        acc[0] += external * seconds
        acc[1] += seconds
    return [(k * bin_s, acc[0] / acc[1], acc[1]) for k, acc in sorted(bins.items())]


def law_by_busy(
    jobs: Mapping[str, Sequence[Progress]],
    free_rates: Mapping[str, Mapping[int, float]],
    groups: Mapping[str, str],
    busy: BusySlots,
    cpu: SharedCpu,
) -> dict[tuple[str, int], tuple[float, float]]:
    """How the law did where it was fitted: per (group of a job, busy slots), steps done over
    the steps the law predicts, and the seconds of training behind it.

    Each stretch between two reports at one size is predicted from the job's
    free-core rate at that size, slowed by ``cpu`` as the busy slots moved
    inside it, and counted in the bucket of its mean busy count (rounded).  A
    ratio of 1 at every busy count: the law stretches the rates as the crowd
    did; a trend with the count (or with ``groups``, the jobs' workloads, say)
    is a bias of the law that the simulator would carry into every busy period.
    """
    sums: dict[tuple[str, int], list[float]] = {}
    for job, samples in jobs.items():
        for a, b in _same_size_pairs(samples):
            free = free_rates.get(job, {}).get(a.parallelism, 0.0)
            if b.step <= a.step or free <= 0:
                continue
            predicted = sum(dt * free / cpu.factor(n) for dt, n in busy.pieces(a.at, b.at))
            key = (groups.get(job, ""), round(busy.mean(a.at, b.at)))
            acc = sums.setdefault(key, [0.0, 0.0, 0.0])
            acc[0] += b.step - a.step
            acc[1] += predicted
            acc[2] += b.at - a.at
    return {
        key: (done / predicted, seconds) for key, (done, predicted, seconds) in sorted(sums.items())
    }


def fit_start_law(
    startups: Sequence[tuple[str, float, float]],
    busy: BusySlots,
    cores: float,
    grid: Sequence[float] = EXTERNAL_GRID,
) -> CpuFit:
    """The sharing law of first starts: (workload, start, first step) of each job.

    A start-up is CPU work too (imports, data), but it need not feel the
    crowd as a training step does, so it gets its own law: the ``external``
    that makes each workload's start-up in free-core seconds
    (``BusySlots.free_seconds`` over it, as the busy slots changed) most
    constant.  The simulator stretches a start-up in progress the same way
    (``SimConfig.start_slowdown``).
    """
    spans = [(w, t0, t1) for w, t0, t1 in startups if t1 > t0]
    total = float(len(spans))

    def residual(cpu: SharedCpu | None) -> float:
        groups: dict[str, list[float]] = {}
        for workload, t0, t1 in spans:
            free = busy.free_seconds(t0, t1, cpu) if cpu is not None else t1 - t0
            groups.setdefault(workload, []).append(math.log(free))
        return sum(len(v) * statistics.pvariance(v) for v in groups.values()) / total

    if not spans:
        return CpuFit(SharedCpu(cores), 0.0, 0.0, 0.0)
    best = min(grid, key=lambda e: (residual(SharedCpu(cores, e)), e))
    law = SharedCpu(cores, best)
    return CpuFit(law, residual(law), residual(None), total)


@dataclass(frozen=True, slots=True)
class MeasuredJob:
    """A job of the real run as the simulator should see it.

    ``steps`` is its total work in mini-batches (fixed whatever its size: the
    global batch is fixed); ``rates`` the steps/s it kept at each size.
    ``peers`` are the steps/s of its workload at each size, pooled over the
    run's jobs of that workload (:func:`pooled_rates`): a size this job never
    ran at is taken from them, scaled by how fast this job ran where both
    are known.  ``seen`` is what the live policy's curve held for each size
    the job reported at (:func:`live_curve`: samples/s as reported, crowded
    CPUs and all), for :class:`MeasuredPolicy` to show the policy instead of
    ``rates``; empty: the policy sees ``rates``.
    """

    id: str
    requested: int
    min_gpus: int
    max_gpus: int
    steps: int
    rates: Mapping[int, float] = field(default_factory=dict)
    peers: Mapping[int, float] = field(default_factory=dict)
    seen: Mapping[int, float] = field(default_factory=dict)

    def view_at(self, size: int) -> float:
        """What the live policy's curve held at ``size`` once the job trained there.

        ``seen`` where the job reported at that size; elsewhere :meth:`curve`
        in ``seen``'s units (scaled by the mean ratio where both are known),
        or :meth:`curve` itself without ``seen``.
        """
        curve = self.curve()
        seen = {n: r for n, r in self.seen.items() if r > 0 and n in curve}
        if size in seen:
            return seen[size]
        if not seen:
            return curve[size]
        return curve[size] * statistics.fmean(seen[n] / curve[n] for n in seen)

    def curve(self) -> Mapping[int, float]:
        """Steps/s on 1..max_gpus: measured sizes as measured, then its workload's, then the
        live policy's prior (linear from the largest known size).

        Raises ValueError when nothing was measured (the prior's 1 step/s is no prediction).
        """
        own = {n: r for n, r in self.rates.items() if r > 0}
        if not own:
            raise ValueError(f"job {self.id}: no positive rate measured")
        shared = [n for n in own if self.peers.get(n, 0.0) > 0]
        known = dict(own)
        if shared:
            scale = statistics.fmean(own[n] / self.peers[n] for n in shared)
            for n, rate in self.peers.items():
                if n not in known and rate > 0:
                    known[n] = rate * scale
        return policy_curve({}, known, max(self.max_gpus, self.requested))

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


class TickCore(PolicyCore):
    """A core that decides as the live tick does: every pass on a fresh core of ``policy``.

    The control plane keeps no policy state between ticks: each tick builds a
    core from the database's snapshot (``Policy.schedule``: running jobs
    restored at their size and service, queued ones added in submission
    order) and throws it away.  A simulator's core lives for the whole run,
    so what a past pass computed outlives it: an elastic core's scale-out
    candidates keep the marginal gain of the speed table they were pushed
    with, after the job has learned another.  This core holds only the jobs;
    each pass at a new time rebuilds ``policy``'s core from them, and a second
    pass at the same time (after placement refused something) goes on with
    that pass's core, as the simulator's loop expects.
    """

    def __init__(self, policy: Policy, total_gpus: int) -> None:
        super().__init__(total_gpus)
        self.policy = policy
        self.jobs: dict[JobRecord, None] = {}
        self.current = policy.new_core(total_gpus)
        self.blocking = self.current.blocking
        self.made_at: float | None = None

    def add(self, job: JobRecord, now: float) -> None:
        """A job arrives (or is requeued): the next pass sees it queued."""
        self.jobs[job] = None

    def remove(self, job: JobRecord, now: float) -> None:
        """A job ended: the next pass no longer sees it."""
        self.jobs.pop(job, None)

    def decide(self, now: float) -> Plan:
        """A fresh core of the jobs as they are (the snapshot's order), then its pass."""
        if self.made_at == now and self.refused_at == now:
            return self.current.decide(now)  # the pass again around what placement refused
        core = self.policy.new_core(self.total)
        core.ageing = self.ageing
        core.fair_share = self.fair_share
        ordered = sorted(self.jobs, key=lambda j: (not j.running, j.submit, j.id))
        for job in ordered:
            job.klass = job.own_klass  # a snapshot's record: the class its priority says
            job.compacted = False
        core.restore_many([j for j in ordered if j.running], now)
        for job in ordered:
            if not job.running:
                core.add(job, now)
        self.current, self.made_at = core, now
        return core.decide(now)

    def unplaced(self, refused: Plan, now: float) -> None:
        """Placement refused part of the pass: the pass's core takes it back."""
        self.current.unplaced(refused, now)

    def note_refused(self, refused: Plan, now: float) -> None:
        """As any core; the pass's core hears it too (its second pass goes around them)."""
        super().note_refused(refused, now)
        self.current.note_refused(refused, now)

    def next_wakeup(self) -> float | None:
        """The last pass's core's (a demotion due, say)."""
        return self.current.next_wakeup()

    def next_ageing(self) -> float | None:
        """The last pass's core's."""
        return self.current.next_ageing()

    def waiting_count(self) -> int:
        """Jobs held here without GPUs."""
        return sum(1 for job in self.jobs if not job.running)

    def pending_order(self, now: float) -> list[JobRecord]:
        """The last pass's core's order."""
        return self.current.pending_order(now)


class MeasuredPolicy(Policy):
    """``inner`` on measured jobs: their own elastic range, their measured progress, and the
    policy seeing only what the live policy could have seen.

    The simulator makes its records from the trace (an analytic speed table,
    a range of ``max_scale`` x the request); the core this policy hands out
    rewrites each record as it joins (``add``) from ``jobs`` (by id): its
    progress follows the measured curve (``JobRecord.true_speed``), while the
    policy's table (``JobRecord.speed``) is the live one, ``policy_curve`` of
    what the job has measured so far: nothing at first (the linear prior),
    then each size it has trained at (``decide`` learns it at the first pass
    after the job's start-up there).  So the simulated policy tries the sizes
    the live one tried, on the same optimistic prior.  ``learn=False`` shows
    it the measured curve from the start.  ``per_tick=True`` decides each
    pass on a fresh core, as the live tick does (:class:`TickCore`).  Fixed
    costs (start-up, end) are the simulator's own (``ScalingCost``).  Each pass looks at every job it
    was given: for replays of a live run (tens of jobs), not of a long trace.
    """

    def __init__(
        self,
        inner: Policy,
        jobs: Mapping[str, MeasuredJob],
        *,
        learn: bool = True,
        per_tick: bool = False,
    ) -> None:
        self.inner = inner
        self.jobs = dict(jobs)
        self.learn = learn
        self.per_tick = per_tick
        self.name = inner.name
        self.elastic = bool(getattr(inner, "elastic", False))
        self.class_ageing_s = inner.class_ageing_s

    def new_core(self, total_gpus: int) -> PolicyCore:
        """The inner policy's core, with ``add`` and ``decide`` wrapped."""
        core = (
            TickCore(self.inner, total_gpus) if self.per_tick else self.inner.new_core(total_gpus)
        )
        add, decide = core.add, core.decide
        jobs, learn = self.jobs, self.learn
        seen: dict[str, dict[int, float]] = {}
        records: list[JobRecord] = []

        def believe(job: JobRecord, measured: MeasuredJob) -> None:
            top = max(measured.max_gpus, measured.requested)
            view = policy_curve({}, seen[job.id], top) if learn else measured.curve()
            ref = view[measured.requested]
            job.speed = (0.0, *(view[n] / ref for n in range(1, top + 1)))
            job.gain_ref = ref / view[1]

        def measured_add(job: JobRecord, now: float) -> None:
            measured = jobs.get(job.id)
            if measured is not None:
                job.min_gpus = measured.min_gpus
                job.max_gpus = max(measured.max_gpus, job.requested)
                job.true_speed = measured.speed_table()
                seen.setdefault(job.id, {})
                believe(job, measured)
                records.append(job)
            add(job, now)

        def learning_decide(now: float) -> Plan:
            if learn:
                for job in records:
                    size = job.alloc
                    if not job.running or now < job.resume_at or size in seen[job.id]:
                        continue
                    measured = jobs[job.id]
                    seen[job.id][size] = measured.view_at(size)
                    believe(job, measured)
            return decide(now)

        setattr(core, "add", measured_add)  # noqa: B010 - instance hooks on a core we own
        setattr(core, "decide", learning_decide)  # noqa: B010
        return core


def handover_delays(
    ends: Iterable[float], placements: Iterable[tuple[float, float]]
) -> list[float]:
    """Seconds from a job's recorded end to the control plane's next placement it made room for.

    ``ends`` are the recorded ends of the run's jobs; ``placements`` (when,
    submitted) each start or growth with its job's submission time.  After an
    end, the first placement before the next end of a job already submitted
    is the handover of that end's GPUs (the end reported, the next tick, the
    tick's run); an end no placement follows before the next one, or whose
    next placement is a new job's first look (it arrived after the end), made
    room for nobody and is left out.
    """
    order = sorted(ends)
    moves = sorted(placements)
    out: list[float] = []
    for i, end in enumerate(order):
        until = order[i + 1] if i + 1 < len(order) else math.inf
        for at, submitted in moves:
            if at <= end:
                continue
            if at > until:
                break
            if submitted <= end:
                out.append(at - end)
                break
    return out


def arrival_delays(starts: Iterable[tuple[float, float]], ends: Iterable[float]) -> list[float]:
    """Seconds from a job's submission to its first placement, for jobs that found room at once.

    ``starts`` are (submitted, first placed) per job; a job placed before any
    other job ended after its submission waited for the control plane alone
    (the commit, the tick it requests, the tick's run), not for GPUs.
    """
    order = sorted(ends)
    out: list[float] = []
    for submitted, placed in starts:
        i = bisect.bisect_right(order, submitted)
        if placed >= submitted and (i == len(order) or order[i] > placed):
            out.append(placed - submitted)
    return out


def live_curve(reports: Iterable[tuple[int, float]]) -> dict[int, float]:
    """The live policy's measured curve after ``reports`` (size, samples/s), in their order.

    The control plane keeps a running average per size of the samples/s each
    progress report gives (:func:`scheduler.curves.record_measurement`, the
    same function): this is that curve at the job's end, the rates the live
    policy ranked the job's sizes by, as reported under whatever crowded the
    machine, not the free-core rates its progress follows.
    """
    curve: dict[str, float] = {}
    for size, rate in reports:
        curve = record_measurement(curve, size, rate)
    return {int(n): r for n, r in sorted(curve.items(), key=lambda kv: int(kv[0]))}


def pooled_rates(rates: Iterable[tuple[int, float, float]]) -> dict[int, float]:
    """Steps/s per size over several jobs: (size, steps, seconds) summed, then divided."""
    steps: dict[int, float] = {}
    seconds: dict[int, float] = {}
    for size, done, spent in rates:
        steps[size] = steps.get(size, 0.0) + done
        seconds[size] = seconds.get(size, 0.0) + spent
    return {n: steps[n] / seconds[n] for n in sorted(steps) if seconds[n] > 0 and steps[n] > 0}


def median_or(values: Sequence[float], default: float) -> float:
    """The median of ``values``, or ``default`` when there are none."""
    return statistics.median(values) if values else default
