"""Discrete-event simulator: replays a trace through a policy core on a GPU cluster.

One event loop for every policy and every placement::

    next event = min(completion heap, next arrival, policy wake-up, --tick)
      1. completions      job done: placement.release, accounting.finished, core.remove
                          (or its program failed: requeued with its progress while
                          restarts remain, else failed; or its run-time limit: failed)
         deadlines        a queued job past its run-time limit leaves the queue, failed
      2. arrivals         in trace order: core.add (a job no placement could ever
                          hold, e.g. no vClos shape of its size, is skipped)
      3. one pass         core.decide(now) -> [(job, n GPUs)], 0 = preempt
                          each change: placement.place(job, n) -> GPU ids | None
                            placed:   accounting.started / resized / preempted,
                                      new completion time on the heap
                            refused:  the job keeps what it had; core.unplaced()
                                      (FIFO: the starts behind it wait too)
      4. contention       if anything moved: slowdown of every running job's
                          communication -> its pace -> new completion times
    accounting integrates busy GPUs and cluster efficiency between events; with fair
    share on, each tenant's decayed usage advances there too (GPUs held since the last event)

At one timestamp the order is the public Tiresias simulator's: completions
release GPUs, arrivals join, then one scheduling pass.  Completions sit in a
heap with lazy invalidation, so an event costs what changed.

Placements (``SimConfig.placement``, see :func:`scheduler.fabric_placement.sim_placement`):
``count`` (no GPU ids: the policy's count is the placement, the fastest and
the Tiresias simulator's scheme), ``consolidated``, ``vclos`` (bound through
:func:`scheduler.binding.bind`, as in production) and ``ecmp`` (lowest free
ids, with ECMP link contention).  Scaling and preemption costs are parameters
(all free by default, as in the Tiresias simulator).
"""

from __future__ import annotations

import functools
import heapq
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.fabric_placement import Contention, collective_for, sim_placement
from scheduler.fairshare import FAIR_SHARE_HALF_LIFE, FairShare
from scheduler.placement import CountOnly, SimPlacement
from scheduler.policies.base import Plan, Policy
from scheduler.policies.elastic import curve_limit
from scheduler.priority import CLASS_NAMES, NORMAL, priority_class
from scheduler.records import JobRecord
from scheduler.throughput import (
    NetworkSpec,
    contention_pace,
    get_model,
    speed_table,
    speedup_over_one,
)
from scheduler.traces import TraceJob


@dataclass(frozen=True, slots=True)
class ScalingCost:
    """Seconds of lost progress when a job's allocation changes, and a job's fixed costs.

    ``stop_resume`` charges ``restart_s`` to every start after a preemption
    and every resize (EDL measured 40-80 s); ``stop_free`` charges only
    ``broadcast_s`` to existing workers on scale-out and nothing on scale-in
    (new workers prepare their context while the others train).  ``free``
    charges nothing (the Tiresias simulator).

    The fixed costs apply in every mode and are all zero by default:

    * ``first_start_s``: seconds from a job's first start to its first step
      (process start, imports, data, rendezvous): it holds its GPUs and makes
      no progress.  ``first_start_by_model`` overrides it per ``TraceJob.model``
      (the cost is the workload's: its imports and its data).
    * ``join_s`` (stop-free scale-out): seconds until the newcomers of a
      scale-out have joined (they start as the job's first workers did); the
      job keeps training at its old size meanwhile, charged as the progress
      that costs (``join_pause``).  A job still starting trains at neither
      size until its start-up ends.
    * ``leave_s`` (scale-in): seconds from the job training (now, or at the
      end of its start-up) until the leavers are gone.  The GPUs are free at
      once (the newcomer of another job starts meanwhile).
    * ``finish_s``: seconds a job still holds its GPUs after its last step
      (final checkpoint, exit, the end reported and recorded); its JCT ends
      there.
    * ``first_start_by_job`` and ``finish_by_job`` override the first start
      and the end per job (``TraceJob.id``): a replay of a run that measured
      each job's own (``devtools.measured``), as it measured each job's rates.

    While a switch is in flight (``join_s``, ``leave_s``) the job's size is
    the runtime's, not the policy's: a resize or preemption decided meanwhile
    is refused, as the live tick leaves switching jobs out of its snapshot.
    """

    mode: str = "free"
    restart_s: float = 40.0
    broadcast_s: float = 1.0
    first_start_s: float = 0.0
    first_start_by_model: Mapping[str, float] = field(default_factory=dict)
    join_s: float = 0.0
    leave_s: float = 0.0
    finish_s: float = 0.0
    first_start_by_job: Mapping[str, float] = field(default_factory=dict)
    finish_by_job: Mapping[str, float] = field(default_factory=dict)

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

    def first_start(self, model: str, job: str = "") -> float:
        """Seconds from a job's first start to its first step (its own, its workload's, else
        the default)."""
        own = self.first_start_by_job.get(job)
        return own if own is not None else self.first_start_by_model.get(model, self.first_start_s)

    def has_first_start(self) -> bool:
        """Whether any first start costs something (the loop skips the bookkeeping otherwise)."""
        return (
            self.first_start_s > 0
            or any(v > 0 for v in self.first_start_by_model.values())
            or any(v > 0 for v in self.first_start_by_job.values())
        )

    def join_pause(self, old_rate: float, new_rate: float, seconds: float) -> float:
        """Lost seconds at the new size while a scale-out's newcomers join.

        For ``seconds`` (of ``join_s`` that the job trains: not its start-up)
        it still progresses at ``old_rate``; in time at ``new_rate`` that is
        ``seconds * (1 - old_rate / new_rate)`` lost, so one pause charges it
        exactly while nothing else changes meanwhile.
        """
        if seconds <= 0 or new_rate <= old_rate or new_rate <= 0:
            return 0.0
        return seconds * (1.0 - old_rate / new_rate)

    def switch_end(self, now: float, trains_from: float, old: int, new: int) -> float:
        """When a resize from ``old`` to ``new`` GPUs decided at ``now`` is done (``now``: at once).

        ``trains_from`` is when the job makes progress again (its start-up's
        end, or ``now``).  A scale-out is done when its newcomers have joined
        and the job trains; a scale-in ``leave_s`` after the job trains.
        """
        if 0 < old < new and self.join_s > 0:
            return max(now + self.join_s, trains_from)
        if 0 < new < old and self.leave_s > 0:
            return max(now, trains_from) + self.leave_s
        return now


@dataclass(frozen=True, slots=True)
class Outage:
    """One GPU out of service from ``at`` until ``until`` (a suspect mark, say).

    ``gpu`` is the one to take when it is free (else the lowest free id);
    ``holder`` a job that keeps the GPU meanwhile: it goes out when that job
    ends.  Without a free GPU the outage waits for the next one freed.
    """

    at: float
    until: float
    gpu: int = -1
    holder: str = ""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulation knobs.

    ``elastic`` gives every job a speed table from the throughput model with
    ``max_scale`` x requested GPUs at most (``max_scale <= 0``: bounded by the
    curve only, up to where the next GPU adds no throughput) and
    ``min_fraction`` x requested at least; ``sample_every`` thins the time
    series (seconds).  ``placement`` names the placement (``count``,
    ``consolidated``, ``vclos``, ``ecmp``); the fabric ones need ``fabric``,
    and ``seed`` is ECMP's hash seed.
    ``traffic`` picks each job's collective for the contention model (``ring``
    for all, or ``mix``: by model, see :func:`scheduler.fabric_placement.collective_for`).
    ``tenant_weights`` turns tenant fair share on (usage decays with
    ``half_life`` seconds; the simulator keeps it from its running jobs).
    ``slot_slowdown`` and ``start_slowdown`` model GPU slots that share CPUs
    (the CPU emulation of the demo cluster: 8 slots on 2 cores), which a real
    GPU cluster does not have.  Entry ``b`` of ``slot_slowdown`` is the factor
    by which every running job's step time stretches while ``b`` GPUs are
    busy; entry ``b`` of ``start_slowdown`` stretches what is left of a first
    start (``ScalingCost.first_start_s``, in seconds of a free core) while
    ``b`` GPUs are busy.  The last entry holds beyond a table; empty: off.
    ``grow_min_left_s``: a running job that ends within this many seconds at
    its current rate gets no more GPUs (the control plane's
    ``SCALE_OUT_MIN_SECONDS_LEFT``: a newcomer would join a finished job);
    0: off.  It and a switch in flight (``ScalingCost.join_s``/``leave_s``)
    refuse resizes, so they need a policy core that takes refusals
    (``PolicyCore.unplaced``).  ``ending_caps_policy``: the live tick does
    not refuse such a growth, it shows the policy the job capped at its size
    (``max_gpus``), so the idle GPUs go to the next job; on, each pass caps
    ``max_gpus`` so (a core that reads it at each pass: ``TickCore``).
    ``switching_pins_policy``: the live tick leaves a job in ``scaling`` out
    of its snapshot, so the policy gives the idle GPUs to the others; on, each
    pass shows the policy every job with a switch in flight pinned at its size
    (``min_gpus = max_gpus`` = its GPUs) instead of refusing its resize after
    the pass, where with one bind per tick nothing else got those GPUs in that
    pass (the 2026-12-04 13:24 live run grew a job the simulator held back).
    An ended job not handed over yet is not pinned: the live snapshot still
    shows it running.

    The live control plane hears of a change some time after it happens; two
    delays model that (0: off, the policy sees every change at once):

    * ``arrival_s``: seconds from a job's submission until the policy sees it
      (the API's commit, the tick it requests, the tick's own run).  Its JCT
      still counts from its submission.
    * ``release_s``: seconds an ended job's GPUs stay held after its recorded
      end (the control plane's handover: the next tick that sees them free
      and its run time).  Its JCT ends at the end; meanwhile the policy still
      counts it as running and no decision resizes it.

    ``outages``: GPUs taken out of service for a while (:class:`Outage`; the
    live control plane marks a straggler's GPU suspect for a cool-down): the
    policy's core counts them as gone and placement never gives them out.
    ``count`` and ``vclos`` placements only.  Empty: every GPU always serves.

    ``leavers_busy``: with shared CPUs, the leavers of a scale-in count as
    busy slots for ``slot_slowdown`` and ``start_slowdown`` until their
    switch is done (``ScalingCost.leave_s`` after the job trains), as they do
    on the live cluster: they train until then, and the run's busy count, from
    which the law was fitted, counts them.  Their GPUs still go to other jobs
    at once.  Off: the slots stop counting at the decision.
    ``leave_follows_start``: a scale-in decided during a job's first start
    is done ``leave_s`` after the start-up's end as ``start_slowdown``
    stretches it later (the live leavers stop once the job trains); off: the
    end as it was due at the decision.

    ``second_pass``: after placement refuses part of a pass, a second pass at
    the same time goes around the refused jobs (the default).  The live tick
    binds once: a refused start waits for the next tick, which plans it again
    (the policy keeps nothing between ticks), while the GPUs it was given
    stay idle; ``False`` models that.
    ``refuse_whole_start``: an elastic start whose extras no shape fits is
    refused whole and waits for the next pass, as the live binder did when
    every saved run (``bench/sim_vs_real_runs``, to 2026-12-03 21:35) was
    made: it placed the size the policy chose or nothing.  Off: it starts on
    its base size alone, as the simulator always did and
    ``scheduler.binding.bind`` now does with ``Start.base``.
    ``reshape_reclaims``: a start that fits no shape is placed before the jobs
    the same pass shrank, which then go back on their own GPUs or a fresh
    shape (``scheduler.binding.reshape_around``), as the live binder does
    since 2026-12-04.  Off: a shrink keeps its GPUs in place whatever the
    start needs, as the live binder did for the runs saved before.
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
    placement: str = "count"
    fabric: FabricSpec | None = None
    seed: int = 0
    traffic: str = "ring"
    tenant_weights: Mapping[str, float] | None = None
    half_life: float = FAIR_SHARE_HALF_LIFE
    slot_slowdown: tuple[float, ...] = ()
    start_slowdown: tuple[float, ...] = ()
    grow_min_left_s: float = 0.0
    arrival_s: float = 0.0
    release_s: float = 0.0
    outages: tuple[Outage, ...] = ()
    second_pass: bool = True
    leavers_busy: bool = False
    leave_follows_start: bool = False
    ending_caps_policy: bool = False
    switching_pins_policy: bool = False
    refuse_whole_start: bool = False
    reshape_reclaims: bool = True

    def slot_factor(self, busy: int) -> float:
        """``slot_slowdown`` at ``busy`` busy GPUs (1.0 when off)."""
        return _entry(self.slot_slowdown, busy)

    def start_factor(self, busy: int) -> float:
        """``start_slowdown`` at ``busy`` busy GPUs (1.0 when off)."""
        return _entry(self.start_slowdown, busy)


def _entry(table: tuple[float, ...], busy: int) -> float:
    """A slowdown table's factor at ``busy`` (the last entry beyond it; 1.0 for no table)."""
    if not table:
        return 1.0
    return table[busy] if 0 <= busy < len(table) else table[-1]


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


def _make_record(idx: int, job: TraceJob, cfg: SimConfig, elastic: bool) -> JobRecord:
    rec = _new_record(idx, job, cfg, elastic)
    if job.fail_after is not None or job.max_runtime is not None:
        rec.fail_after = job.fail_after
        rec.max_restarts = job.max_restarts
        rec.max_runtime = job.max_runtime
    return rec


@functools.lru_cache(maxsize=4096)
def _curve_top(model: str, requested: int, total: int, gpus_per_server: int) -> int:
    """Most GPUs a job may reach when only its throughput curve bounds scale-out."""
    return max(
        requested,
        curve_limit(lambda n: speedup_over_one(model, n, gpus_per_server), requested, total),
    )


def _new_record(idx: int, job: TraceJob, cfg: SimConfig, elastic: bool) -> JobRecord:
    klass = NORMAL if job.priority is None else priority_class(job.priority)
    if elastic:
        model = job.model or "resnet50"
        if cfg.max_scale > 0:
            top = min(max(job.gpus, int(job.gpus * cfg.max_scale)), cfg.total_gpus)
        else:
            top = _curve_top(model, job.gpus, cfg.total_gpus, cfg.gpus_per_server)
        low = max(1, math.ceil(job.gpus * cfg.min_fraction))
        speed = speed_table(model, job.gpus, top, cfg.gpus_per_server)
        rec = JobRecord(
            job.id, idx, job.submit, job.gpus, job.duration,
            tenant=job.tenant, model=job.model, min_gpus=low, max_gpus=top, speed=speed,
            klass=klass,
        )  # fmt: skip
        rec.gain_ref = speedup_over_one(model, job.gpus, cfg.gpus_per_server)
        return rec
    return JobRecord(
        job.id, idx, job.submit, job.gpus, job.duration,
        tenant=job.tenant, model=job.model, klass=klass,
    )  # fmt: skip


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


def simulate(
    trace: Sequence[TraceJob],
    policy: Policy,
    cfg: SimConfig,
    *,
    placement: SimPlacement | None = None,
    contention: Contention | None = None,
) -> SimResult:
    """Replay ``trace`` (sorted by submit time) through ``policy``; returns results and figures.

    The placement and its contention model come from ``cfg.placement`` unless
    ``placement`` is given (then ``contention`` goes with it; None: links are
    free).  With any placement but ``count`` the policy is reported as
    ``policy+placement`` and the summary adds ``skipped`` (jobs no placement
    could ever hold) and ``mean_max_slowdown``; with an elastic policy also
    ``grow_requests`` and ``grow_refused`` (resizes up the placement was asked
    for and refused: no shape free) and ``start_extras_refused`` (starts whose
    extra GPUs fitted no shape; they started on their base size); with a
    contention model ``job_slowdown``: the distribution over jobs of each job's
    communication slowdown averaged over the time it ran.
    """
    if placement is None:
        placement, contention = sim_placement(
            cfg.placement,
            cfg.total_gpus,
            cfg.gpus_per_server,
            cfg.fabric,
            seed=cfg.seed,
            reshape=cfg.reshape_reclaims,
        )
    collective_for("", cfg.traffic)  # an unknown traffic model fails here, not mid-run
    # Outages take GPUs off a vClos allocator (VClosBinder's, or a wrapper's that shows it).
    blocker = getattr(placement, "allocator", None)
    if cfg.outages and not (
        isinstance(placement, CountOnly) or isinstance(blocker, VClosAllocator)
    ):
        raise ValueError(f"outages need the count or vclos placement, not {placement.name}")
    core = policy.new_core(cfg.total_gpus)
    core.ageing = policy.class_ageing_s
    ageing = core.ageing is not None
    elastic = cfg.elastic or bool(getattr(policy, "elastic", False))
    records = [_make_record(i, j, cfg, elastic) for i, j in enumerate(trace)]
    n_jobs = len(records)
    first = trace[0].submit if trace else 0.0
    fabric_aware = placement.name != "count"
    by_count = isinstance(placement, CountOnly)  # never refuses and holds nothing: skip the calls
    fair = None
    if cfg.tenant_weights:
        fair = FairShare(cfg.tenant_weights, half_life_s=cfg.half_life, now=first)
        core.fair_share = fair
    acct = Accounting(cfg, first, any(j.model for j in trace), fabric_aware, fair is not None)
    net = NetworkSpec(gpus_per_server=cfg.gpus_per_server)
    if cfg.fabric is not None:
        net = NetworkSpec(
            gpus_per_server=cfg.gpus_per_server,
            network_bytes_per_s=cfg.fabric.link_gbps * 1e9 / 8,
        )
    # Running jobs' GPUs in start order: the input of the contention model (and, with
    # shared CPUs, the jobs to re-pace when the busy count changes).
    held: dict[JobRecord, tuple[int, ...]] = {}
    shared_cpu = bool(cfg.slot_slowdown)
    tracked = contention is not None or shared_cpu
    tail = cfg.cost.finish_s  # GPUs held after the last step
    tails = cfg.cost.finish_by_job  # ... per job, where measured
    first_costs = cfg.cost.has_first_start()
    # Resizes in flight: job -> when its switch is done (only with switch times).
    switching: dict[JobRecord, float] = {}
    switch_times = cfg.cost.join_s > 0 or cfg.cost.leave_s > 0
    leavers = cfg.leavers_busy and (shared_cpu or bool(cfg.start_slowdown))
    follow = cfg.leave_follows_start and cfg.cost.leave_s > 0
    near_end = cfg.grow_min_left_s

    def ends_soon(job: JobRecord, now: float) -> bool:
        """Whether a running job past its start-up ends within ``near_end`` at its rate now."""
        if near_end <= 0 or now < job.resume_at:
            return False
        job.settle(now)
        return job.remaining < near_end * job.progress_rate(job.alloc) * job.pace

    def resize_refused(job: JobRecord, n: int, now: float) -> bool:
        """Whether the runtime, not the policy, owns this running job's size now."""
        if switching and switching.get(job, -math.inf) > now:
            return True  # a switch in flight, or an ended job not handed over yet
        return n > job.alloc and ends_soon(job, now)

    own_max: dict[JobRecord, int] = {}  # cfg.ending_caps_policy: each capped job's own max

    def cap_ending(now: float) -> None:
        """Show the policy each job about to end capped at its size, as the live snapshot does."""
        for job in list(own_max):
            if not job.running:
                job.max_gpus = own_max.pop(job)
        for job in records[:ai]:
            if not job.running:
                continue
            mine = own_max.get(job, job.max_gpus)
            if ends_soon(job, now):
                own_max[job] = mine
                job.max_gpus = min(mine, job.alloc)
            elif job in own_max:
                job.max_gpus = own_max.pop(job)

    def pin_switching(now: float) -> list[tuple[JobRecord, int, int]]:
        """Pin each job with a switch in flight at its size; what to restore after the pass."""
        sizes = []
        for job, until in switching.items():
            if until > now and job.running and job.end_time is None:
                sizes.append((job, job.min_gpus, job.max_gpus))
                job.min_gpus = job.max_gpus = job.alloc
        return sizes

    comp: list[tuple[float, int, JobRecord, int]] = []
    # Run-time limits of started jobs (a queued job can pass its limit too).
    deadlines: list[tuple[float, int, JobRecord]] = []
    seq = 0
    ai = 0
    skipped = 0
    # Elasticity against the placement: grows asked for and refused (no shape free),
    # and elastic starts whose extras no shape fitted (started on their base size).
    growth = {"grow_requests": 0, "grow_refused": 0, "start_extras_refused": 0}
    tick = cfg.tick
    next_tick = first + tick if tick else math.inf

    # Only a trace with failing programs or run-time limits pays for checking them.
    limited = any(r.fail_after is not None or r.max_runtime is not None for r in records)

    def push(job: JobRecord) -> None:
        nonlocal seq
        seq += 1
        end = tails.get(job.id, tail) if tails else tail
        if not limited:
            heapq.heappush(comp, (job.finish_time(end), seq, job, job.version))
            return
        when = job.finish_time(end)
        if job.fail_after is not None and job.attempt_start + job.fail_after < when:
            when = job.attempt_start + job.fail_after
        if job.max_runtime is not None and job.start_time is not None:
            when = min(when, job.start_time + job.max_runtime)
        heapq.heappush(comp, (when, seq, job, job.version))

    ended: set[str] = set()  # jobs off their GPUs for good (an outage's holder)
    # Scale-ins whose leavers still run (cfg.leavers_busy): job -> (switch done, slots).
    leaving: dict[JobRecord, tuple[float, int]] = {}
    # Scale-ins decided during a start-up, done after it (cfg.leave_follows_start).
    pinned: set[JobRecord] = set()

    def cpu_busy(now: float) -> int:
        """Busy slots as the CPUs see them: the held GPUs and the leavers still running."""
        return acct.used + sum(n for until, n in leaving.values() if until > now)

    def stop(job: JobRecord, now: float) -> None:
        """Take a running job off its GPUs and out of the core (it completed or failed)."""
        core.remove(job, now)
        placement.release(job.id)
        held.pop(job, None)
        switching.pop(job, None)
        leaving.pop(job, None)
        ended.add(job.id)
        job.running = False
        job.version += 1

    # Ended jobs whose GPUs the control plane has not handed over yet (release_s):
    # (when they are free, seq, job).
    releases: list[tuple[float, int, JobRecord]] = []
    release_s = cfg.release_s
    arrival_s = cfg.arrival_s
    handing = 0  # GPUs of those jobs: the count placement's books no longer hold them

    def hand_over(job: JobRecord, now: float) -> None:
        """An ended job's GPUs stay its own for ``release_s`` (the policy still sees it run)."""
        nonlocal seq, handing
        acct.finished(job, now)
        handing += job.alloc
        held.pop(job, None)  # no longer paced: it runs no more
        leaving.pop(job, None)
        switching[job] = now + release_s  # no decision resizes it meanwhile
        job.version += 1
        job.end_time = now
        seq += 1
        heapq.heappush(releases, (now + release_s, seq, job))

    # GPUs out of service (cfg.outages): due ones wait for a free GPU (and their holder's
    # end); the core's total counts those out.
    outages = sorted(cfg.outages, key=lambda o: o.at)
    oi = 0
    due_out: list[Outage] = []
    out_now: list[tuple[float, int]] = []  # (until, GPU id or -1)

    def take_out(now: float) -> bool:
        """Start due outages on free GPUs and end lapsed ones; whether anything changed."""
        nonlocal oi
        moved = False
        for until, gpu in [o for o in out_now if o[0] <= now]:
            out_now.remove((until, gpu))
            if gpu >= 0 and isinstance(blocker, VClosAllocator):
                blocker.set_available([gpu])
            moved = True
        while oi < len(outages) and outages[oi].at <= now:
            due_out.append(outages[oi])
            oi += 1
        for outage in list(due_out):
            if outage.until <= now:
                due_out.remove(outage)
                continue
            if outage.holder and outage.holder not in ended:
                continue
            gpu = -1
            if isinstance(blocker, VClosAllocator):
                free = [
                    g
                    for leaf in range(blocker.spec.leaves)
                    for g in blocker.free_gpus_on_leaf(leaf)
                ]
                if not free:
                    continue
                gpu = outage.gpu if outage.gpu in free else min(free)
                blocker.set_unavailable([gpu])
            elif acct.used + handing + len(out_now) >= cfg.total_gpus:
                continue
            due_out.remove(outage)
            out_now.append((outage.until, gpu))
            moved = True
        if moved:
            core.total = cfg.total_gpus - len(out_now)
        return moved

    def next_outage() -> float:
        """When the next outage starts or ends (inf: none)."""
        starts = outages[oi].at if oi < len(outages) else math.inf
        ends = min((u for u, _ in out_now), default=math.inf)
        return min(starts, ends)

    # Per job, its communication slowdown integrated over the time it ran (contention
    # models only): job id -> [slowdown x seconds, seconds]; running job -> (since, factor).
    slow_area: dict[str, list[float]] = {}
    slow_now: dict[JobRecord, tuple[float, float]] = {}

    def book_slowdowns(now: float, factor: Mapping[JobRecord, float]) -> None:
        for job, (since, f) in slow_now.items():
            acc = slow_area.setdefault(job.id, [0.0, 0.0])
            acc[0] += f * (now - since)
            acc[1] += now - since
        slow_now.clear()
        for job in held:
            slow_now[job] = (now, factor.get(job, 1.0))

    # Jobs in their first start -> the stretch its rest runs at (shared CPUs only).
    starting: dict[JobRecord, float] = {}
    shared_start = bool(cfg.start_slowdown)

    def restretch(now: float) -> None:
        """Start-ups in progress go on at the stretch of the busy slots from now on."""
        stretch = cfg.start_factor(cpu_busy(now))
        for job, was in list(starting.items()):
            if not job.running or now >= job.resume_at:
                del starting[job]
                pinned.discard(job)
            elif stretch != was:
                job.resume_at = now + (job.resume_at - now) / was * stretch
                starting[job] = stretch
                job.version += 1
                push(job)
                if job in pinned:
                    # Its scale-in is done leave_s after the start-up, as it ends now.
                    switching[job] = job.resume_at + cfg.cost.leave_s
                    if job in leaving:
                        leaving[job] = (switching[job], leaving[job][1])

    def refresh_paces(now: float) -> float:
        """Re-pace every running job after a change; returns the worst slowdown."""
        cpu = cfg.slot_factor(cpu_busy(now))
        if contention is None:
            target = 1.0 / cpu  # shared CPUs only: one pace for every running job
            for job in held:
                if job.pace != target:
                    job.settle(now)
                    job.pace = target
                    job.version += 1
                    push(job)
            return 1.0
        if not held:
            book_slowdowns(now, {})
            return 1.0
        multi = [(job, gpus) for job, gpus in held.items() if len(gpus) > 1]
        patterns = [collective_for(job.model, cfg.traffic) for job, _ in multi]
        slow = contention.slowdowns([gpus for _, gpus in multi], patterns) if multi else ()
        factor = {job: s for (job, _), s in zip(multi, slow, strict=True)}
        book_slowdowns(now, factor)
        for job, gpus in held.items():
            s = factor.get(job, 1.0)
            model = get_model(job.model or "resnet50")
            pace = contention_pace(model, len(gpus), net, s) / cpu
            if pace != job.pace:
                job.settle(now)
                job.pace = pace
                job.version += 1
                push(job)
        return max(slow, default=1.0)

    bar: Any = None
    if cfg.progress:
        from tqdm import tqdm  # optional: only a terminal run shows a progress bar

        bar = tqdm(total=n_jobs, file=sys.stderr, unit="job", mininterval=0.5)
    done = 0

    while ai < n_jobs or comp or deadlines or releases or due_out or out_now:
        while comp and comp[0][2].version != comp[0][3]:
            heapq.heappop(comp)
        if deadlines:
            while deadlines and (deadlines[0][2].end_time is not None or deadlines[0][2].running):
                heapq.heappop(deadlines)  # done, or running: its completion entry holds the limit
        t_comp = comp[0][0] if comp else math.inf
        t_arr = records[ai].submit + arrival_s if ai < n_jobs else math.inf
        wake = core.next_wakeup()
        t_wake = wake if wake is not None else math.inf
        if ageing:
            aged = core.next_ageing()
            if aged is not None and aged < t_wake:
                t_wake = aged
        now = min(t_comp, t_arr, t_wake, next_tick)
        if releases and releases[0][0] < now:
            now = releases[0][0]
        if outages:
            now = min(now, next_outage())
        if deadlines and deadlines[0][0] < now:
            now = deadlines[0][0]
        if leaving:
            now = min(now, min(until for until, _ in leaving.values()))
        if now == math.inf:
            break  # nothing runs and nothing arrives: the rest can never be placed
        acct.advance(now)
        if fair is not None:  # usage up to now, from what each tenant held since the last event
            fair.advance(now, acct.tenant_held)
        if now >= next_tick:
            next_tick = (
                now + tick if tick and (acct.running or ai < n_jobs or releases) else math.inf
            )
        changed = False
        # 1. completions
        while comp and comp[0][0] <= now:
            _, _, job, version = heapq.heappop(comp)
            if job.version != version:
                continue
            job.settle(now)
            changed = True
            if limited and job.remaining > 1e-7 * max(1.0, job.duration):
                first = job.start_time if job.start_time is not None else now
                limit = first + job.max_runtime if job.max_runtime is not None else math.inf
                if now >= limit - 1e-9:
                    acct.ended_failed(job, now, "run-time limit reached")
                elif job.restarts < job.max_restarts:
                    acct.requeued(job)
                    stop(job, now)
                    job.restarts += 1
                    job.alloc = 0
                    job.pace = 1.0
                    job.pending_since = now  # waits again: class ageing starts over
                    core.add(job, now)  # keeps its progress: resumes from its checkpoint
                    continue
                else:
                    acct.ended_failed(job, now, "program failed, no restarts left")
                stop(job, now)
                job.end_time = now
                done += 1
                continue
            job.remaining = 0.0
            done += 1
            if release_s > 0:
                hand_over(job, now)
                continue
            acct.finished(job, now)
            stop(job, now)
            job.end_time = now
        gone = [job for job, (until, _) in leaving.items() if until <= now]
        if gone:
            # Leavers done: the CPUs are shared by fewer slots from now on.
            for job in gone:
                del leaving[job]
            if starting:
                restretch(now)
            if tracked:
                acct.worst_slowdown = refresh_paces(now)
        while releases and releases[0][0] <= now:
            job = heapq.heappop(releases)[2]
            handing -= job.alloc
            stop(job, now)
            changed = True
        if outages:
            changed = take_out(now) or changed
        while deadlines and deadlines[0][0] <= now:
            job = heapq.heappop(deadlines)[2]
            if job.end_time is None and not job.running:
                core.remove(job, now)
                acct.ended_failed(job, now, "run-time limit reached")
                job.end_time = now
                job.version += 1
                done += 1
                changed = True
        # 2. arrivals
        while ai < n_jobs and records[ai].submit + arrival_s <= now:
            if placement.admits(records[ai].requested):
                core.add(records[ai], now)
            else:
                skipped += 1
            ai += 1
        # 3. one pass (and, after refusals, one more that goes around the refused jobs)
        if cfg.ending_caps_policy and near_end > 0:
            cap_ending(now)
        sizes = pin_switching(now) if cfg.switching_pins_policy and switching else []
        plan = core.decide(now)
        for job, lo, hi in sizes:
            job.min_gpus, job.max_gpus = lo, hi
        fresh: list[JobRecord] = []  # first starts of this pass: start-up charged after it
        for retry in (False, True):
            placement.begin_pass()
            refused: Plan = []
            blocked = False
            for job, n in plan:
                if switch_times or near_end > 0 or release_s > 0:
                    if job.running and n != job.alloc and resize_refused(job, n, now):
                        refused.append((job, n))
                        continue
                    # Count placement holds no GPU ids: after a refused shrink the GPUs
                    # the plan counted on are still held, so check the count itself.
                    held_now = job.alloc if job.running else 0
                    if (
                        by_count
                        and n > held_now
                        and acct.used + handing + len(out_now) + n - held_now > cfg.total_gpus
                    ):
                        refused.append((job, n))
                        continue
                gpus: tuple[int, ...] | None = ()
                if n > 0 and not by_count and not (job.running and n == job.alloc):
                    gpus = None if blocked and not job.running else placement.place(job.id, n)
                    grows = job.running and n > job.alloc
                    if grows:
                        growth["grow_requests"] += 1
                        growth["grow_refused"] += gpus is None
                    if (
                        gpus is None
                        and not blocked
                        and not job.running
                        and 0 < job.base < n
                        and not cfg.refuse_whole_start
                    ):
                        # An elastic start with extras no shape fits: start on the base
                        # size alone; the core hears that the extras were refused.
                        growth["start_extras_refused"] += 1
                        refused.append((job, n))
                        n = job.base
                        gpus = placement.place(job.id, n)
                        if gpus is None:
                            continue
                    elif gpus is None:
                        refused.append((job, n))
                        blocked = blocked or (core.blocking and not job.running)
                        continue
                job.settle(now)
                old = job.alloc if job.running else 0
                resumed = not job.running and job.start_time is not None
                job.version += 1
                if n <= 0:
                    acct.preempted(job, old, job.running)
                    placement.release(job.id)
                    held.pop(job, None)
                    leaving.pop(job, None)
                    job.running = False
                    job.alloc = 0
                    job.pace = 1.0
                    changed = True
                    continue
                if job.running:
                    if n == old:
                        job.version -= 1
                        continue
                    acct.resized(job, old, n)
                else:
                    acct.started(job, n)
                    job.attempt_start = now
                    if job.start_time is None:
                        job.start_time = now
                        if first_costs:
                            fresh.append(job)
                        if job.max_runtime is not None:
                            heapq.heappush(deadlines, (now + job.max_runtime, job.idx, job))
                if tracked:
                    held[job] = gpus or ()
                pause = cfg.cost.pause(old, n, resumed)
                paused_from = now
                if switch_times and old > 0:
                    trains_from = max(now, job.resume_at)
                    switched = cfg.cost.switch_end(now, trains_from, old, n)
                    switching[job] = switched
                    if follow and n < old and trains_from > now:
                        pinned.add(job)
                    if leavers and n < old and switched > now:
                        _, still = leaving.get(job, (0.0, 0))
                        leaving[job] = (switched, still + old - n)
                    if old < n:
                        # The switch's cost comes after a start-up still in progress.
                        pause += cfg.cost.join_pause(
                            job.progress_rate(old), job.progress_rate(n), switched - trains_from
                        )
                        paused_from = trains_from
                job.alloc = n
                job.running = True
                if pause > 0 and paused_from + pause > job.resume_at:
                    job.resume_at = paused_from + pause
                push(job)
                changed = True
            if not refused:
                break
            core.unplaced(refused, now)
            core.note_refused(refused, now)
            if retry or core.blocking or not cfg.second_pass:
                break
            plan = core.decide(now)
        if fresh:
            # Start-up: no progress for the workload's first-start cost, stretched as
            # the CPUs are shared once this pass's changes are in.
            stretch = cfg.start_factor(cpu_busy(now))
            for job in fresh:
                if job.running:
                    job.resume_at = max(
                        job.resume_at, now + cfg.cost.first_start(job.model, job.id) * stretch
                    )
                    job.version += 1
                    push(job)
                    if shared_start:
                        starting[job] = stretch
        if changed and starting:
            restretch(now)
        if changed and tracked:
            acct.worst_slowdown = refresh_paces(now)
        if now >= acct.next_sample:
            acct.sample(now, core.waiting_count())
        if bar is not None and done - bar.n >= 200:
            bar.update(done - bar.n)
    if bar is not None:
        bar.update(done - bar.n)
        bar.close()

    summary = acct.summary(unfinished=n_jobs - skipped - len(acct.results) - len(acct.failed))
    name = policy.name if not fabric_aware else f"{policy.name}+{placement.name}"
    summary["policy"] = name
    if fabric_aware:
        summary["skipped"] = skipped
        slow = acct.series["slowdown"]
        summary["mean_max_slowdown"] = round(statistics.fmean(slow), 4) if slow else 1.0
        if elastic:
            summary.update(growth)
        if contention is not None:
            summary["job_slowdown"] = _distribution([a / t for a, t in slow_area.values() if t > 0])
    return SimResult(name, tuple(acct.results), acct.series, summary, tuple(acct.failed))


def _distribution(values: Sequence[float]) -> dict[str, float]:
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
