"""The simulator's event loop: one :class:`Simulation` per run, one method per event kind.

:func:`scheduler.simulator.simulate` builds one and calls :meth:`Simulation.run`::

    run()
     ├─ while _next_event()     min(completion heap, next arrival, policy wake-up, tick,
     │     is not inf:              a handover, an outage, a deadline, leavers done)
     │   _handle(now)           what happens at now, in this order:
     │    ├─ advance               accounting and fair share up to now; the next tick
     │    ├─ _completions          done -> finished (or handed over, release_s); program
     │    │                           failed -> requeued or failed; run-time limit -> failed;
     │    │                           with a feed (scheduler.sim_feed) _fed: its jobs join
     │    ├─ _leavers_done         scale-ins whose leavers stopped: CPUs shared by fewer
     │    ├─ _handovers            ended jobs' GPUs handed over: off the books
     │    ├─ _take_out             outages start on free GPUs and end
     │    ├─ _deadlines            queued jobs past their run-time limit: failed
     │    ├─ _arrivals             trace jobs the policy sees now: core.add (or skipped)
     │    ├─ scheduling.run_parts  the scheduling pass (scheduler.pipeline), its steps
     │    │   │                        composed by _compose from the run's Fidelity:
     │    │   ├─ hold_back            none, or ShownAsOwned: _cap_ending /
     │    │   │                          _pin_switching (the runtime's say shown); with
     │    │   │                          quotas QuotaHeld around it (over quota: refused)
     │    │   ├─ decide               the policy core itself (PinsRestored around it)
     │    │   ├─ check, make_room     with quotas (SimConfig.quota): QuotaDropped,
     │    │   │                          QuotaRoomMade (the pipeline's steps on views of
     │    │   │                          the records); a change asks for a follow-up pass
     │    │   ├─ bind: SimBind        _run_pass: each (job, n): _runtime_refuses / _place
     │    │   │   └─ _apply              preempt, resize (_switch) or start; completion pushed
     │    │   └─ again                AroundRefusals: a second round (BindingRounds)
     │    ├─ _start_ups            first starts: no progress for their start-up
     │    ├─ _restretch / _refresh_paces   after a change: start-ups and paces follow
     │    │                           the busy slots and the links' contention
     │    └─ sample                the time series
     └─ _result()               the summary and :class:`~scheduler.sim_accounting.SimResult`

The state the event methods share lives on the instance; each method says
which part it changes.  Completions sit in a heap with lazy invalidation (a
job's ``version`` changes with every change of its pace or size), so an event
costs what changed.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from heapq import heappop, heappush
from typing import Any

from fabric.allocator import VClosAllocator
from scheduler.fabric_placement import Contention, collective_for, sim_placement
from scheduler.fairshare import FairShare
from scheduler.pipeline import (
    NO_WAITS,
    Candidates,
    EnforceQuotas,
    PreemptWithinQuota,
    SchedulingPass,
    Waits,
)
from scheduler.placement import CountOnly, SimPlacement
from scheduler.policies.base import Plan, Policy, PolicyCore
from scheduler.policies.elastic import curve_limit
from scheduler.priority import HIGH, HIGH_FROM, LOW, LOW_BELOW, NORMAL, priority_class
from scheduler.quota import Blocked, QuotaBook, quota_need
from scheduler.records import JobRecord
from scheduler.sim_accounting import Accounting, SimResult, distribution
from scheduler.sim_config import (
    BindingRounds,
    EndingJobs,
    Fidelity,
    LeaversSlots,
    Outage,
    SimConfig,
    StartUpScaleIn,
    SwitchingJobs,
)
from scheduler.sim_feed import Feed
from scheduler.throughput import (
    NetworkSpec,
    contention_pace,
    get_model,
    speed_table,
    speedup_over_one,
    type_speedup,
)
from scheduler.traces import TraceJob
from scheduler.types import Cluster, Decision, JobState, JobView, Preempt, Scale, Snapshot, Start


def make_record(idx: int, job: TraceJob, cfg: SimConfig, elastic: bool) -> JobRecord:
    """The simulator's record of trace job ``job`` (its speed table when ``elastic``)."""
    rec = _new_record(idx, job, cfg, elastic)
    if job.fail_after is not None or job.max_runtime is not None:
        rec.fail_after = job.fail_after
        rec.max_restarts = job.max_restarts
        rec.max_runtime = job.max_runtime
    return rec


@functools.lru_cache(maxsize=4096)
def _curve_top(
    model: str, requested: int, total: int, gpus_per_server: int, speed: float = 1.0
) -> int:
    """Most GPUs a job may reach when only its throughput curve bounds scale-out."""
    # At speed 1 the same cache keys as the accounting's calls (no speed argument).
    extra = (gpus_per_server,) if speed == 1.0 else (gpus_per_server, speed)
    return max(
        requested, curve_limit(lambda n: speedup_over_one(model, n, *extra), requested, total)
    )


def _new_record(idx: int, job: TraceJob, cfg: SimConfig, elastic: bool) -> JobRecord:
    klass = NORMAL if job.priority is None else priority_class(job.priority)
    speed = cfg.gpu_speed
    duration = job.duration
    if speed != 1.0:  # the trace's duration is on the reference type
        duration /= type_speedup(job.model or "resnet50", job.gpus, cfg.gpus_per_server, speed)
    if elastic:
        model = job.model or "resnet50"
        if cfg.max_scale > 0:
            top = min(max(job.gpus, int(job.gpus * cfg.max_scale)), cfg.total_gpus)
        elif speed == 1.0:
            top = _curve_top(model, job.gpus, cfg.total_gpus, cfg.gpus_per_server)
        else:
            top = _curve_top(model, job.gpus, cfg.total_gpus, cfg.gpus_per_server, speed)
        low = max(1, math.ceil(job.gpus * cfg.min_fraction))
        table = (
            speed_table(model, job.gpus, top, cfg.gpus_per_server)
            if speed == 1.0
            else speed_table(model, job.gpus, top, cfg.gpus_per_server, speed)
        )
        rec = JobRecord(
            job.id, idx, job.submit, job.gpus, duration,
            tenant=job.tenant, model=job.model, min_gpus=low, max_gpus=top, speed=table,
            klass=klass,
        )  # fmt: skip
        rec.gain_ref = (
            speedup_over_one(model, job.gpus, cfg.gpus_per_server)
            if speed == 1.0
            else speedup_over_one(model, job.gpus, cfg.gpus_per_server, speed)
        )
        return rec
    return JobRecord(
        job.id, idx, job.submit, job.gpus, duration,
        tenant=job.tenant, model=job.model, klass=klass,
    )  # fmt: skip


def _placement_for(cfg: SimConfig) -> tuple[SimPlacement, Contention | None]:
    """The placement ``cfg.placement`` names, and its contention model."""
    return sim_placement(
        cfg.placement,
        cfg.total_gpus,
        cfg.gpus_per_server,
        cfg.fabric,
        seed=cfg.seed,
        reshape=cfg.fidelity.binder.reshapes,
    )


class Simulation:
    """One replay of a trace through a policy core on a placement (see the module docstring).

    Build it with what :func:`scheduler.simulator.simulate` takes, then call
    :meth:`run` once.
    """

    # Slots: some fifty attributes are more than a shared-key instance dict holds, and the
    # loop reads them at every event.
    __slots__ = (
        "acct",
        "ageing",
        "ai",
        "arrival_s",
        "binding",
        "blocker",
        "by_count",
        "caps_ending",
        "cfg",
        "comp",
        "contention",
        "core",
        "deadlines",
        "done",
        "due_out",
        "elastic",
        "ended",
        "fabric_aware",
        "fair",
        "feed",
        "first_costs",
        "follow",
        "growth",
        "handing",
        "held",
        "leavers",
        "leaving",
        "limited",
        "n_jobs",
        "near_end",
        "net",
        "next_arrival",
        "next_tick",
        "oi",
        "out_now",
        "outages",
        "own_max",
        "pinned",
        "placement",
        "policy",
        "records",
        "release_s",
        "releases",
        "scheduling",
        "seq",
        "shared_cpu",
        "shared_start",
        "skipped",
        "slow_area",
        "slow_now",
        "starting",
        "starts_on_base",
        "switch_times",
        "switching",
        "tail",
        "tails",
        "tick",
        "tracked",
    )

    def __init__(
        self,
        trace: Sequence[TraceJob],
        policy: Policy,
        cfg: SimConfig,
        placement: SimPlacement | None = None,
        contention: Contention | None = None,
        feed: Feed | None = None,
    ) -> None:
        if placement is None:
            placement, contention = _placement_for(cfg)
        collective_for("", cfg.traffic)  # an unknown traffic model fails here, not mid-run
        # Outages take GPUs off a vClos allocator (VClosBinder's, or a wrapper's that shows it).
        self.blocker = getattr(placement, "allocator", None)
        if cfg.outages and not (
            isinstance(placement, CountOnly) or isinstance(self.blocker, VClosAllocator)
        ):
            raise ValueError(f"outages need the count or vclos placement, not {placement.name}")
        self.cfg = cfg
        self.policy = policy
        self.placement = placement
        self.contention = contention
        self.feed = feed
        self._init_core(trace, policy, cfg)
        self._init_books(cfg)
        self._init_outages(cfg)

    def _init_core(self, trace: Sequence[TraceJob], policy: Policy, cfg: SimConfig) -> None:
        """The policy's core, the job records, fair share and the accounting."""
        self.core = core = policy.new_core(cfg.total_gpus)
        core.ageing = policy.class_ageing_s
        self.ageing = core.ageing is not None
        self.elastic = cfg.elastic or bool(getattr(policy, "elastic", False))
        self.records = [make_record(i, j, cfg, self.elastic) for i, j in enumerate(trace)]
        self.n_jobs = len(self.records)
        first = trace[0].submit if trace else 0.0
        self.fabric_aware = self.placement.name != "count"
        # Count placement never refuses and holds nothing: skip the calls.
        self.by_count = isinstance(self.placement, CountOnly)
        self.fair: FairShare | None = None
        if cfg.tenant_weights:
            self.fair = FairShare(cfg.tenant_weights, half_life_s=cfg.half_life, now=first)
            core.fair_share = self.fair
        self.acct = Accounting(
            cfg, first, any(j.model for j in trace), self.fabric_aware, self.fair is not None
        )
        self.net = NetworkSpec(gpus_per_server=cfg.gpus_per_server)
        if cfg.fabric is not None:
            self.net = NetworkSpec(
                gpus_per_server=cfg.gpus_per_server,
                network_bytes_per_s=cfg.fabric.link_gbps * 1e9 / 8,
            )
        self.tick = cfg.tick
        self.next_tick = first + self.tick if self.tick else math.inf
        # Only a trace with failing programs or run-time limits pays for checking them.
        self.limited = any(
            r.fail_after is not None or r.max_runtime is not None for r in self.records
        )

    def _init_books(self, cfg: SimConfig) -> None:
        """The loop's books: the heaps, the running jobs' GPUs, switches, leavers, start-ups."""
        # Running jobs' GPUs in start order: the input of the contention model (and, with
        # shared CPUs, the jobs to re-pace when the busy count changes).
        self.held: dict[JobRecord, tuple[int, ...]] = {}
        self.shared_cpu = bool(cfg.slot_slowdown)
        self.tracked = self.contention is not None or self.shared_cpu
        self.tail = cfg.cost.finish_s  # GPUs held after the last step
        self.tails = cfg.cost.finish_by_job  # ... per job, where measured
        self.first_costs = cfg.cost.has_first_start()
        # Resizes in flight: job -> when its switch is done (only with switch times).
        self.switching: dict[JobRecord, float] = {}
        self.switch_times = cfg.cost.join_s > 0 or cfg.cost.leave_s > 0
        fidelity = cfg.fidelity
        self.leavers = fidelity.leavers is LeaversSlots.BUSY_UNTIL_GONE and (
            self.shared_cpu or bool(cfg.start_slowdown)
        )
        self.follow = (
            fidelity.start_up_scale_in is StartUpScaleIn.AFTER_START_UP and cfg.cost.leave_s > 0
        )
        self.near_end = cfg.grow_min_left_s
        self.caps_ending = fidelity.ending is EndingJobs.SHOWN_CAPPED and self.near_end > 0
        self.starts_on_base = fidelity.binder.starts_on_base
        self.binding = SimBind(self)
        self.scheduling = self._compose(fidelity)
        self.own_max: dict[JobRecord, int] = {}  # EndingJobs.SHOWN_CAPPED: capped jobs' own max
        self.comp: list[tuple[float, int, JobRecord, int]] = []
        # Run-time limits of started jobs (a queued job can pass its limit too).
        self.deadlines: list[tuple[float, int, JobRecord]] = []
        self.seq = 0
        self.ai = 0  # next trace job to arrive
        self.skipped = 0
        self.done = 0
        # Elasticity against the placement: grows asked for and refused (no shape free),
        # and elastic starts whose extras no shape fitted (started on their base size).
        self.growth = {"grow_requests": 0, "grow_refused": 0, "start_extras_refused": 0}
        self.ended: set[str] = set()  # jobs off their GPUs for good (an outage's holder)
        # Scale-ins whose leavers still run (LeaversSlots.BUSY_UNTIL_GONE): job -> (switch
        # done, slots).
        self.leaving: dict[JobRecord, tuple[float, int]] = {}
        # Scale-ins decided during a start-up, done after it (StartUpScaleIn.AFTER_START_UP).
        self.pinned: set[JobRecord] = set()
        # Ended jobs whose GPUs the control plane has not handed over yet (release_s):
        # (when they are free, seq, job).
        self.releases: list[tuple[float, int, JobRecord]] = []
        self.release_s = cfg.release_s
        self.arrival_s = cfg.arrival_s
        self.next_arrival = self._arrival_time(0)  # when the policy sees trace job ``ai``
        self.handing = 0  # GPUs of those jobs: the count placement's books no longer hold them
        # Per job, its communication slowdown integrated over the time it ran (contention
        # models only): job id -> [slowdown x seconds, seconds]; running job -> (since, factor).
        self.slow_area: dict[str, list[float]] = {}
        self.slow_now: dict[JobRecord, tuple[float, float]] = {}
        # Jobs in their first start -> the stretch its rest runs at (shared CPUs only).
        self.starting: dict[JobRecord, float] = {}
        self.shared_start = bool(cfg.start_slowdown)

    def _compose(self, fidelity: Fidelity) -> SimPass:
        """The scheduling pass with the steps ``fidelity`` asks for (none for a rule off)."""
        core = self.core
        pins = PinsRestored(core) if fidelity.switching is SwitchingJobs.SHOWN_PINNED else None
        shown = None  # nothing held back: the candidates are the time
        if self.caps_ending or pins is not None:
            shown = ShownAsOwned(self, self.caps_ending, pins)
        hold_back: ShownAsOwned | QuotaHeld | None = shown
        retries = fidelity.rounds is BindingRounds.RETRY_AROUND_REFUSALS
        quota_check: QuotaDropped | None = None
        within_quota: QuotaRoomMade | None = None
        if self.cfg.quota is not None:  # the quota steps see the core's records
            books = QuotaTurn(self, self.cfg.quota)
            hold_back = QuotaHeld(books, shown)
            quota_check, within_quota = QuotaDropped(books), QuotaRoomMade(books)
        return SchedulingPass(
            hold_back=hold_back,
            decide=core if pins is None else pins,  # the core itself is the Decide step
            quota_check=quota_check,  # None: no quotas (SimConfig.quota)
            within_quota=within_quota,
            bind=self.binding,
            retry=AroundRefusals(core) if retries else None,
        )

    def _init_outages(self, cfg: SimConfig) -> None:
        """GPUs out of service (cfg.outages): due ones wait for a free GPU (and their holder's
        end); the core's total counts those out."""
        self.outages = sorted(cfg.outages, key=lambda o: o.at)
        self.oi = 0
        self.due_out: list[Outage] = []
        self.out_now: list[tuple[float, int]] = []  # (until, GPU id or -1)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Replay the whole trace; the results and figures."""
        bar: Any = None
        if self.cfg.progress:
            from tqdm import tqdm  # optional: only a terminal run shows a progress bar

            bar = tqdm(total=self.n_jobs, file=sys.stderr, unit="job", mininterval=0.5)
        # This frame runs once, so CPython never specializes its bytecode: the loop only
        # calls the per-event methods (which are), bound once.
        next_event, handle = self._next_event, self._handle
        while (now := next_event()) != math.inf:
            handle(now)
            if bar is not None and self.done - bar.n >= 200:
                bar.update(self.done - bar.n)
        if bar is not None:
            bar.update(self.done - bar.n)
            bar.close()
        return self._result()

    def _handle(self, now: float) -> None:
        """Everything that happens at ``now``, in the Tiresias simulator's order: completions
        release GPUs, arrivals join, then one scheduling pass."""
        acct, comp = self.acct, self.comp
        acct.advance(now)
        if self.fair is not None:  # usage up to now, from what each tenant held meanwhile
            self.fair.advance(now, acct.tenant_held)
        if now >= self.next_tick:
            self._tick_after(now)
        changed = False
        if comp and comp[0][0] <= now:
            changed = self._completions(now)
        if self.leaving:
            self._leavers_done(now)
        if self.releases:
            changed = self._handovers(now) or changed
        if self.outages:
            changed = self._take_out(now) or changed
        if self.deadlines:
            changed = self._deadlines(now) or changed
        if self.next_arrival <= now:
            self._arrivals(now)
        # The pass (scheduler.pipeline); its binding keeps what moved, so no result is named.
        self.scheduling.run_parts(now)
        binding = self.binding
        if binding.moved:
            binding.moved = False
            changed = True
        if binding.fresh:  # first starts: no progress for their start-up
            self._start_ups(now, binding.fresh)
            binding.fresh = []
        if changed and self.starting:
            self._restretch(now)
        if changed and self.tracked:
            acct.worst_slowdown = self._refresh_paces(now)
        if now >= acct.next_sample:
            acct.sample(now, self.core.waiting_count())

    def _next_event(self) -> float:
        """When the next event is; inf once nothing is left to arrive, run, hand over or take
        out, or what is left can never be placed (nothing runs and nothing arrives).  Drops
        stale heap entries on the way."""
        comp, deadlines = self.comp, self.deadlines
        if not (
            self.ai < self.n_jobs
            or comp
            or deadlines
            or self.releases
            or self.due_out
            or self.out_now
        ):
            return math.inf
        while comp and comp[0][2].version != comp[0][3]:
            heappop(comp)
        if deadlines:
            while deadlines and (deadlines[0][2].end_time is not None or deadlines[0][2].running):
                heappop(deadlines)  # done, or running: its completion entry holds the limit
        t_comp = comp[0][0] if comp else math.inf
        t_arr = self.next_arrival
        core = self.core
        wake = core.next_wakeup()
        t_wake = wake if wake is not None else math.inf
        if self.ageing:
            aged = core.next_ageing()
            if aged is not None and aged < t_wake:
                t_wake = aged
        now = t_comp if t_comp < t_arr else t_arr  # min() of four, without its call
        if t_wake < now:
            now = t_wake
        if self.next_tick < now:
            now = self.next_tick
        releases = self.releases
        if releases and releases[0][0] < now:
            now = releases[0][0]
        if self.outages:
            now = min(now, self._next_outage())
        if deadlines and deadlines[0][0] < now:
            now = deadlines[0][0]
        if self.leaving:
            now = min(now, min(until for until, _ in self.leaving.values()))
        return now

    def _tick_after(self, now: float) -> None:
        """The tick due at ``now`` is taken: the next one (none once nothing runs or comes)."""
        tick = self.tick
        self.next_tick = (
            now + tick
            if tick and (self.acct.running or self.ai < self.n_jobs or self.releases)
            else math.inf
        )

    # -- 1. completions, leavers, handovers, outages, deadlines ----------------------------

    def _completions(self, now: float) -> bool:
        """Jobs whose completion entry is due: done, failed or requeued; whether any was."""
        comp = self.comp
        changed = False
        while comp and comp[0][0] <= now:
            _, _, job, version = heappop(comp)
            if job.version != version:
                continue
            job.settle(now)
            changed = True
            if self.limited and job.remaining > 1e-7 * max(1.0, job.duration):
                self._cut_short(job, now)
                continue
            job.remaining = 0.0
            self.done += 1
            if self.feed is not None:
                self._fed(job, now)
            if self.release_s > 0:
                self._hand_over(job, now)
                continue
            self.acct.finished(job, now)
            self._stop(job, now)
            job.end_time = now
        return changed

    def _cut_short(self, job: JobRecord, now: float) -> None:
        """A running job ended before its work: its run-time limit, or its program failed
        (requeued with its progress while restarts remain)."""
        started = job.start_time if job.start_time is not None else now
        limit = started + job.max_runtime if job.max_runtime is not None else math.inf
        if now >= limit - 1e-9:
            self.acct.ended_failed(job, now, "run-time limit reached")
        elif job.restarts < job.max_restarts:
            self.acct.requeued(job)
            self._stop(job, now)
            job.restarts += 1
            job.alloc = 0
            job.pace = 1.0
            job.pending_since = now  # waits again: class ageing starts over
            self.core.add(job, now)  # keeps its progress: resumes from its checkpoint
            return
        else:
            self.acct.ended_failed(job, now, "program failed, no restarts left")
        self._stop(job, now)
        job.end_time = now
        self.done += 1

    def _stop(self, job: JobRecord, now: float) -> None:
        """Take a running job off its GPUs and out of the core (it completed or failed)."""
        self.core.remove(job, now)
        self.placement.release(job.id)
        self.held.pop(job, None)
        self.switching.pop(job, None)
        self.leaving.pop(job, None)
        self.ended.add(job.id)
        job.running = False
        job.version += 1

    def _hand_over(self, job: JobRecord, now: float) -> None:
        """An ended job's GPUs stay its own for ``release_s`` (the policy still sees it run)."""
        self.acct.finished(job, now)
        self.handing += job.alloc
        self.held.pop(job, None)  # no longer paced: it runs no more
        self.leaving.pop(job, None)
        self.switching[job] = now + self.release_s  # no decision resizes it meanwhile
        job.version += 1
        job.end_time = now
        self.seq += 1
        heappush(self.releases, (now + self.release_s, self.seq, job))

    def _leavers_done(self, now: float) -> None:
        """Scale-ins whose leavers have stopped: the CPUs are shared by fewer slots from now."""
        leaving = self.leaving
        gone = [job for job, (until, _) in leaving.items() if until <= now]
        if gone:
            for job in gone:
                del leaving[job]
            if self.starting:
                self._restretch(now)
            if self.tracked:
                self.acct.worst_slowdown = self._refresh_paces(now)

    def _handovers(self, now: float) -> bool:
        """Ended jobs whose GPUs are handed over now leave the books; whether any did."""
        releases = self.releases
        changed = False
        while releases and releases[0][0] <= now:
            job = heappop(releases)[2]
            self.handing -= job.alloc
            self._stop(job, now)
            changed = True
        return changed

    def _deadlines(self, now: float) -> bool:
        """Queued jobs past their run-time limit end failed; whether any did."""
        deadlines = self.deadlines
        changed = False
        while deadlines and deadlines[0][0] <= now:
            job = heappop(deadlines)[2]
            if job.end_time is None and not job.running:
                self.core.remove(job, now)
                self.acct.ended_failed(job, now, "run-time limit reached")
                job.end_time = now
                job.version += 1
                self.done += 1
                changed = True
        return changed

    def _take_out(self, now: float) -> bool:
        """Start due outages on free GPUs and end lapsed ones; whether anything changed."""
        moved = False
        out_now, blocker = self.out_now, self.blocker
        for until, gpu in [o for o in out_now if o[0] <= now]:
            out_now.remove((until, gpu))
            if gpu >= 0 and isinstance(blocker, VClosAllocator):
                blocker.set_available([gpu])
            moved = True
        while self.oi < len(self.outages) and self.outages[self.oi].at <= now:
            self.due_out.append(self.outages[self.oi])
            self.oi += 1
        for outage in list(self.due_out):
            if outage.until <= now:
                self.due_out.remove(outage)
                continue
            if outage.holder and outage.holder not in self.ended:
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
            elif self.acct.used + self.handing + len(out_now) >= self.cfg.total_gpus:
                continue
            self.due_out.remove(outage)
            out_now.append((outage.until, gpu))
            moved = True
        if moved:
            self.core.total = self.cfg.total_gpus - len(out_now)
        return moved

    def _next_outage(self) -> float:
        """When the next outage starts or ends (inf: none)."""
        starts = self.outages[self.oi].at if self.oi < len(self.outages) else math.inf
        ends = min((u for u, _ in self.out_now), default=math.inf)
        return min(starts, ends)

    # -- 2. arrivals -----------------------------------------------------------------------

    def _arrivals(self, now: float) -> None:
        """Trace jobs the policy sees by ``now`` join the core (or are skipped: no placement
        could ever hold them)."""
        records, n_jobs, arrival_s = self.records, self.n_jobs, self.arrival_s
        ai = self.ai
        while ai < n_jobs and records[ai].submit + arrival_s <= now:
            if self.placement.admits(records[ai].requested):
                self.core.add(records[ai], now)
            else:
                self.skipped += 1
            ai += 1
        self.ai = ai
        self.next_arrival = self._arrival_time(ai)

    def _fed(self, ended: JobRecord, now: float) -> None:
        """The feed's jobs for ``ended``'s end join the trace, submitted at ``now``.

        Each goes after the trace jobs due by ``now`` (so it arrives in this
        event, behind them) and before later ones, which are not in the core
        yet: their idx moves up with their place.
        """
        assert self.feed is not None
        records, cfg = self.records, self.cfg
        for fed in self.feed.ended(ended.id, now):
            at = self.ai
            while at < len(records) and records[at].submit <= now:
                at += 1
            job = fed.job if fed.job.submit == now else replace(fed.job, submit=now)
            rec = make_record(at, job, cfg, self.elastic)
            rec.weight = fed.weight
            records.insert(at, rec)
            for later in records[at + 1 :]:
                later.idx += 1
            self.limited = self.limited or rec.fail_after is not None or rec.max_runtime is not None
        self.n_jobs = len(records)
        self.next_arrival = self._arrival_time(self.ai)

    def _arrival_time(self, ai: int) -> float:
        """When the policy sees trace job ``ai`` (inf: none is left)."""
        return self.records[ai].submit + self.arrival_s if ai < self.n_jobs else math.inf

    # -- 3. one pass (and, after refusals, one more that goes around the refused jobs) -----

    def _run_pass(self, plan: Plan, now: float, fresh: list[JobRecord]) -> tuple[Plan, bool]:
        """Place each decision of ``plan`` (a pass begun); the refused ones, and whether
        anything moved."""
        refused: Plan = []
        blocked = False
        changed = False
        checks = self.switch_times or self.near_end > 0 or self.release_s > 0
        by_count = self.by_count
        for job, n in plan:
            if checks and self._runtime_refuses(job, n, now):
                refused.append((job, n))
                continue
            gpus: tuple[int, ...] | None = ()
            if n > 0 and not by_count and not (job.running and n == job.alloc):
                n, gpus, blocked = self._place(job, n, blocked, refused)
            if gpus is None:
                continue
            if self._apply(job, n, gpus, now, fresh):
                changed = True
        return refused, changed

    def _runtime_refuses(self, job: JobRecord, n: int, now: float) -> bool:
        """Whether the runtime refuses ``n`` GPUs for ``job`` before placement is asked: a
        switch in flight or an end near, or (count placement) the GPUs are not free."""
        if job.running and n != job.alloc and self._resize_refused(job, n, now):
            return True
        # Count placement holds no GPU ids: after a refused shrink the GPUs the plan
        # counted on are still held, so check the count itself.
        held_now = job.alloc if job.running else 0
        return (
            self.by_count
            and n > held_now
            and self.acct.used + self.handing + len(self.out_now) + n - held_now
            > self.cfg.total_gpus
        )

    def _place(
        self, job: JobRecord, n: int, blocked: bool, refused: Plan
    ) -> tuple[int, tuple[int, ...] | None, bool]:
        """Ask the placement for ``n`` GPUs: (the size placed, its GPU ids or None when
        refused, whether later starts are blocked).  Refusals are added to ``refused``."""
        placement = self.placement
        gpus = None if blocked and not job.running else placement.place(job.id, n)
        if job.running and n > job.alloc:
            self.growth["grow_requests"] += 1
            self.growth["grow_refused"] += gpus is None
        if (
            gpus is None
            and not blocked
            and not job.running
            and 0 < job.base < n
            and self.starts_on_base
        ):
            # An elastic start with extras no shape fits: start on the base size alone;
            # the core hears that the extras were refused.
            self.growth["start_extras_refused"] += 1
            refused.append((job, n))
            n = job.base
            return n, placement.place(job.id, n), blocked
        if gpus is None:
            refused.append((job, n))
            return n, None, blocked or (self.core.blocking and not job.running)
        return n, gpus, blocked

    def _apply(
        self, job: JobRecord, n: int, gpus: tuple[int, ...], now: float, fresh: list[JobRecord]
    ) -> bool:
        """Book a placed decision: preempt, resize or start ``job`` on ``n`` GPUs (``gpus``);
        whether it changed anything."""
        job.settle(now)
        old = job.alloc if job.running else 0
        resumed = not job.running and job.start_time is not None
        job.version += 1
        if n <= 0:
            self._preempt(job, old)
            return True
        if job.running:
            if n == old:
                job.version -= 1
                return False
            self.acct.resized(job, old, n)
        else:  # a start, or a restart after a preemption
            self.acct.started(job, n)
            job.attempt_start = now
            if job.start_time is None:
                self._first_start(job, now, fresh)
        if self.tracked:
            self.held[job] = gpus or ()
        cost = self.cfg.cost
        pause = cost.pause(old, n, resumed)
        paused_from = now
        if self.switch_times and old > 0:
            pause, paused_from = self._switch(job, old, n, now, pause)
        job.alloc = n
        job.running = True
        if pause > 0 and paused_from + pause > job.resume_at:
            job.resume_at = paused_from + pause
        self._push(job)
        return True

    def _preempt(self, job: JobRecord, old: int) -> None:
        """The policy took every GPU from ``job`` (it held ``old``)."""
        self.acct.preempted(job, old, job.running)
        self.placement.release(job.id)
        self.held.pop(job, None)
        self.leaving.pop(job, None)
        job.running = False
        job.alloc = 0
        job.pace = 1.0

    def _first_start(self, job: JobRecord, now: float, fresh: list[JobRecord]) -> None:
        """A job starts for the first time: its start-up (``fresh``) and run-time limit."""
        job.start_time = now
        if self.first_costs:
            fresh.append(job)
        if job.max_runtime is not None:
            heappush(self.deadlines, (now + job.max_runtime, job.idx, job))

    def _switch(
        self, job: JobRecord, old: int, n: int, now: float, pause: float
    ) -> tuple[float, float]:
        """A resize with switch times: book the switch in flight (and its leavers); the
        pause, with a scale-out's join cost, and when it starts."""
        cost = self.cfg.cost
        trains_from = max(now, job.resume_at)
        switched = cost.switch_end(now, trains_from, old, n)
        self.switching[job] = switched
        if self.follow and n < old and trains_from > now:
            self.pinned.add(job)
        if self.leavers and n < old and switched > now:
            _, still = self.leaving.get(job, (0.0, 0))
            self.leaving[job] = (switched, still + old - n)
        if old < n:
            # The switch's cost comes after a start-up still in progress.
            pause += cost.join_pause(
                job.progress_rate(old), job.progress_rate(n), switched - trains_from
            )
            return pause, trains_from
        return pause, now

    def _start_ups(self, now: float, fresh: list[JobRecord]) -> None:
        """Start-up: no progress for the workload's first-start cost, stretched as the CPUs
        are shared once this pass's changes are in."""
        cfg = self.cfg
        stretch = cfg.start_factor(self._cpu_busy(now))
        for job in fresh:
            if job.running:
                job.resume_at = max(
                    job.resume_at, now + cfg.cost.first_start(job.model, job.id) * stretch
                )
                job.version += 1
                self._push(job)
                if self.shared_start:
                    self.starting[job] = stretch

    # -- what the runtime, not the policy, decides -----------------------------------------

    def _ends_soon(self, job: JobRecord, now: float) -> bool:
        """Whether a running job past its start-up ends within ``near_end`` at its rate now."""
        if self.near_end <= 0 or now < job.resume_at:
            return False
        job.settle(now)
        return job.remaining < self.near_end * job.progress_rate(job.alloc) * job.pace

    def _resize_refused(self, job: JobRecord, n: int, now: float) -> bool:
        """Whether the runtime, not the policy, owns this running job's size now."""
        if self.switching and self.switching.get(job, -math.inf) > now:
            return True  # a switch in flight, or an ended job not handed over yet
        return n > job.alloc and self._ends_soon(job, now)

    def _cap_ending(self, now: float) -> None:
        """Show the policy each job about to end capped at its size, as the live snapshot does."""
        own_max = self.own_max
        for job in list(own_max):
            if not job.running:
                job.max_gpus = own_max.pop(job)
        for job in self.records[: self.ai]:
            if not job.running:
                continue
            mine = own_max.get(job, job.max_gpus)
            if self._ends_soon(job, now):
                own_max[job] = mine
                job.max_gpus = min(mine, job.alloc)
            elif job in own_max:
                job.max_gpus = own_max.pop(job)

    def _pin_switching(self, now: float) -> list[tuple[JobRecord, int, int]]:
        """Pin each job with a switch in flight at its size; what to restore after the pass."""
        sizes = []
        for job, until in self.switching.items():
            if until > now and job.running and job.end_time is None:
                sizes.append((job, job.min_gpus, job.max_gpus))
                job.min_gpus = job.max_gpus = job.alloc
        return sizes

    # -- completion times: the heap, start-ups, paces --------------------------------------

    def _push(self, job: JobRecord) -> None:
        """Put ``job``'s completion (or failure, or run-time limit) on the heap."""
        self.seq += 1
        tails = self.tails
        end = tails.get(job.id, self.tail) if tails else self.tail
        if not self.limited:
            heappush(self.comp, (job.finish_time(end), self.seq, job, job.version))
            return
        when = job.finish_time(end)
        if job.fail_after is not None and job.attempt_start + job.fail_after < when:
            when = job.attempt_start + job.fail_after
        if job.max_runtime is not None and job.start_time is not None:
            when = min(when, job.start_time + job.max_runtime)
        heappush(self.comp, (when, self.seq, job, job.version))

    def _cpu_busy(self, now: float) -> int:
        """Busy slots as the CPUs see them: the held GPUs and the leavers still running."""
        return self.acct.used + sum(n for until, n in self.leaving.values() if until > now)

    def _restretch(self, now: float) -> None:
        """Start-ups in progress go on at the stretch of the busy slots from now on."""
        stretch = self.cfg.start_factor(self._cpu_busy(now))
        starting = self.starting
        for job, was in list(starting.items()):
            if not job.running or now >= job.resume_at:
                del starting[job]
                self.pinned.discard(job)
            elif stretch != was:
                job.resume_at = now + (job.resume_at - now) / was * stretch
                starting[job] = stretch
                job.version += 1
                self._push(job)
                if job in self.pinned:
                    # Its scale-in is done leave_s after the start-up, as it ends now.
                    self.switching[job] = job.resume_at + self.cfg.cost.leave_s
                    if job in self.leaving:
                        self.leaving[job] = (self.switching[job], self.leaving[job][1])

    def _refresh_paces(self, now: float) -> float:
        """Re-pace every running job after a change; returns the worst slowdown."""
        cpu = self.cfg.slot_factor(self._cpu_busy(now))
        held, contention = self.held, self.contention
        if contention is None:
            target = 1.0 / cpu  # shared CPUs only: one pace for every running job
            for job in held:
                if job.pace != target:
                    job.settle(now)
                    job.pace = target
                    job.version += 1
                    self._push(job)
            return 1.0
        if not held:
            self._book_slowdowns(now, {})
            return 1.0
        multi = [(job, gpus) for job, gpus in held.items() if len(gpus) > 1]
        patterns = [collective_for(job.model, self.cfg.traffic) for job, _ in multi]
        slow = contention.slowdowns([gpus for _, gpus in multi], patterns) if multi else ()
        factor = {job: s for (job, _), s in zip(multi, slow, strict=True)}
        self._book_slowdowns(now, factor)
        for job, gpus in held.items():
            s = factor.get(job, 1.0)
            model = get_model(job.model or "resnet50")
            pace = contention_pace(model, len(gpus), self.net, s) / cpu
            if pace != job.pace:
                job.settle(now)
                job.pace = pace
                job.version += 1
                self._push(job)
        return max(slow, default=1.0)

    def _book_slowdowns(self, now: float, factor: Mapping[JobRecord, float]) -> None:
        """Integrate each running job's slowdown up to ``now``; from now on, ``factor``'s."""
        for job, (since, f) in self.slow_now.items():
            acc = self.slow_area.setdefault(job.id, [0.0, 0.0])
            acc[0] += f * (now - since)
            acc[1] += now - since
        self.slow_now.clear()
        for job in self.held:
            self.slow_now[job] = (now, factor.get(job, 1.0))

    # -- the end ---------------------------------------------------------------------------

    def _result(self) -> SimResult:
        """The summary (with the placement's figures) and the results."""
        acct = self.acct
        summary = acct.summary(
            unfinished=self.n_jobs - self.skipped - len(acct.results) - len(acct.failed)
        )
        policy, placement = self.policy, self.placement
        name = policy.name if not self.fabric_aware else f"{policy.name}+{placement.name}"
        summary["policy"] = name
        if self.cfg.quota is not None:  # requests over their tenant's quota are skipped
            summary["skipped"] = self.skipped
        if self.fabric_aware:
            summary["skipped"] = self.skipped
            slow = acct.series["slowdown"]
            summary["mean_max_slowdown"] = round(statistics.fmean(slow), 4) if slow else 1.0
            if self.elastic:
                summary.update(self.growth)
            if self.contention is not None:
                summary["job_slowdown"] = distribution(
                    [a / t for a, t in self.slow_area.values() if t > 0]
                )
        return SimResult(name, tuple(acct.results), acct.series, summary, tuple(acct.failed))


# -- the simulator's steps of the scheduling pass (scheduler.pipeline) -----------------------
#
# The pass's candidates are the time of the event: the policy core holds the jobs, and each
# step works on it at that time.  Which steps a run composes follows its Fidelity
# (Simulation._compose): a rule the run does not follow costs no call at each event.


class ShownAsOwned:
    """Step 1 where the runtime, not the policy, owns some sizes: each job about to end shown
    capped at its size (``EndingJobs.SHOWN_CAPPED``), each job with a switch in flight
    pinned at its size (``SwitchingJobs.SHOWN_PINNED``, given back by :class:`PinsRestored`
    once the policy has decided).  Nothing waits here: with quotas, :class:`QuotaHeld`
    runs it first."""

    __slots__ = ("caps", "pins", "sim")

    def __init__(self, sim: Simulation, caps: bool, pins: PinsRestored | None) -> None:
        self.sim = sim
        self.caps = caps
        self.pins = pins

    def hold_back(self, now: float) -> tuple[float, Waits]:
        """Cap and pin for the policy's eyes; the candidates are the time."""
        sim = self.sim
        if self.caps:
            sim._cap_ending(now)
        if self.pins is not None and sim.switching:
            self.pins.pinned = sim._pin_switching(now)
        return now, NO_WAITS


class PinsRestored:
    """Step 2 with pinned jobs: the core's decision, then each pinned job's own bounds back."""

    __slots__ = ("core", "pinned")

    def __init__(self, core: PolicyCore) -> None:
        self.core = core
        self.pinned: Sequence[tuple[JobRecord, int, int]] = ()

    def decide(self, now: float) -> Plan:
        """``core.decide(now)``, the pinned sizes restored after it."""
        plan = self.core.decide(now)
        if self.pinned:
            for job, lo, hi in self.pinned:
                job.min_gpus, job.max_gpus = lo, hi
            self.pinned = ()
        return plan


REFUSED = "refused on this pass: no shape free for it, or the runtime owns its size now"
"""Why a job the simulator's binding refused waits (the pipeline retries only then)."""

Refusals = Sequence[tuple[JobRecord, int]]
"""The outcome of the simulator's binding: the changes it refused, as the plan had them."""

_NOTHING_REFUSED: tuple[Refusals, Waits] = ((), NO_WAITS)
"""The outcome of binding an empty plan (most events): one, shared."""


class SimBind:
    """Step 5: each change placed (:meth:`Simulation._run_pass`), a placement pass begun; the
    refused ones undone in the core, which goes around them if the pass retries.

    Its outcome is the refused changes.  What the pass moved and the jobs that started
    for the first time stay here for the loop (:meth:`Simulation._handle`) to read and
    clear after the pass.
    """

    __slots__ = ("cut", "fresh", "moved", "settles", "sim")

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        # Count placement has nothing to settle between passes: no call at every event.
        self.settles = type(sim.placement) is not CountOnly
        self.fresh: list[JobRecord] = []  # first starts: their start-up is charged after it
        self.moved = False  # whether any round changed a job's GPUs
        # Jobs the quota check cut below the core's plan (QuotaDropped): refiled once placed.
        self.cut: list[JobRecord] = []

    def bind(self, now: float, plan: Plan) -> tuple[Refusals, Waits]:
        """Place the plan; the refused changes and why each waits."""
        if self.settles:
            self.sim.placement.begin_pass()
        if not plan:
            return _NOTHING_REFUSED
        sim = self.sim
        refused, moved = sim._run_pass(plan, now, self.fresh)
        if self.cut:
            self._refile_cut(now)
        if moved:
            self.moved = True
        if not refused:
            return refused, NO_WAITS
        sim.core.unplaced(refused, now)
        sim.core.note_refused(refused, now)
        return refused, dict.fromkeys([job.id for job, _ in refused], REFUSED)

    def _refile_cut(self, now: float) -> None:
        """Each job the quota check cut that now runs is filed again at the size it got, as
        a fresh core restores it from the tick's snapshot (below its request: compacted)."""
        core = self.sim.core
        for job in self.cut:
            if job.running:
                core.remove(job, now)
                core.restore_running(job, now)
        self.cut = []


class AroundRefusals:
    """Step 6 with ``BindingRounds.RETRY_AROUND_REFUSALS``: once more after refusals (the
    pipeline asks only then), around the refused jobs, unless the queue is strict."""

    __slots__ = ("core",)

    def __init__(self, core: PolicyCore) -> None:
        self.core = core

    def again(self, now: float, refused: Refusals, rounds: int) -> bool:
        """True on the first refusal of a pass, unless the core blocks behind a refused job."""
        return rounds == 0 and not self.core.blocking


# -- the quota steps (SimConfig.quota): scheduler.pipeline's, on the core's records ---------
#
# The pipeline's quota steps read a snapshot's job views and decisions; these adapters show
# them the core's records as views (GPUs by count) and its plan as decisions, and carry
# what the steps keep back into the core: a held-back job is refused at the time (the core
# goes around it, as around a refused placement), a dropped start is undone, a job stopped
# to make room is filed as queued.


_CLASS_PRIORITY = {HIGH: HIGH_FROM, NORMAL: LOW_BELOW, LOW: 0}
"""A priority of each class: the quota steps read a job's class through its priority."""

_NO_GPUS = Cluster(gpus=())
"""The quota steps read a snapshot's jobs only."""


def _view(job: JobRecord) -> JobView:
    """``job`` as the quota steps read it: its tenant, request and minimum, the GPUs it
    holds (by count: their ids are the placement's), its class (the one the core orders it
    by) and when it last started."""
    running = job.running
    return JobView(
        job.id, job.submit, job.requested, tenant=job.tenant, min_gpus=job.min_gpus,
        max_gpus=job.max_gpus, gpus=tuple(range(job.alloc)) if running else (),
        state=JobState.RUNNING if running else JobState.QUEUED,
        priority=_CLASS_PRIORITY[job.klass], queue_since=job.attempt_start, weight=job.weight,
    )  # fmt: skip


def _decisions(plan: Plan) -> list[Decision]:
    """The plan as decisions (GPUs by count): 0 preempts, a queued job starts, a running
    one scales."""
    out: list[Decision] = []
    for job, n in plan:
        if n <= 0:
            out.append(Preempt(job.id))
        else:
            out.append(
                Scale(job.id, tuple(range(n))) if job.running else Start(job.id, tuple(range(n)))
            )
    return out


class QuotaTurn:
    """What the quota steps share in a pass: the jobs the policy has seen and that have
    not ended (or still hold GPUs), the quota book at the pass's start, and the jobs its
    hold-back kept out (what the tick's snapshot holds, from the core's records)."""

    __slots__ = ("blocked", "book", "followed", "live", "quota", "seen", "sim")

    def __init__(self, sim: Simulation, quota: Mapping[str, int]) -> None:
        self.sim = sim
        self.quota = dict(quota)
        self.live: list[JobRecord] = []
        self.seen = 0  # trace jobs looked at, in arrival order
        self.book = QuotaBook(quota=self.quota)
        self.blocked: tuple[Blocked, ...] = ()
        self.followed = -math.inf  # when the last follow-up pass was due

    def follow_up(self, now: float) -> None:
        """A quota step changed the plan at ``now``: the next pass runs at once (the next
        time there is, so this pass's refusals lapse), as the tick's next tick would; a
        follow-up pass asks for none (a start dropped again waits for the next event)."""
        if now == self.followed:
            return
        self.followed = math.nextafter(now, math.inf)
        if self.followed < self.sim.next_tick:
            self.sim.next_tick = self.followed

    def refresh(self, now: float) -> list[JobRecord]:
        """The live jobs now: those arrived since the last pass in, those ended out.

        A job asking for more than its tenant's quota leaves the core at once and counts
        as skipped: the live API refuses its submission."""
        sim = self.sim
        records, admits = sim.records, sim.placement.admits
        while self.seen < sim.ai:
            job = records[self.seen]
            self.seen += 1
            if not admits(job.requested):  # a skipped job never joined the core
                continue
            if self.book.admits(job.tenant, job.requested):
                self.live.append(job)
            else:
                sim.core.remove(job, now)
                sim.skipped += 1
        self.live = [job for job in self.live if job.running or job.end_time is None]
        return self.live


class QuotaHeld:
    """Step 1 with quotas: the run's own hold-back (:class:`ShownAsOwned`, if composed),
    then :meth:`scheduler.quota.QuotaBook.hold_reason` over the queued jobs; each job held
    back is refused at the time, so the core's pass goes around it."""

    __slots__ = ("inner", "turn")

    def __init__(self, turn: QuotaTurn, inner: ShownAsOwned | None) -> None:
        self.turn = turn
        self.inner = inner

    def hold_back(self, now: float) -> tuple[float, Waits]:
        """The book from the running jobs; why each queued job over its quota waits."""
        if self.inner is not None:
            self.inner.hold_back(now)
        turn = self.turn
        live = turn.refresh(now)
        book = turn.book = QuotaBook(quota=turn.quota)
        for job in live:
            if job.running:
                book.count(job.tenant, job.alloc, job.requested)
        waits: dict[str, str] = {}
        held: Plan = []
        blocked: list[Blocked] = []
        for job in live:
            if job.running or job.tenant not in turn.quota:
                continue
            need = quota_need(job.min_gpus, job.requested)
            reason = book.hold_reason(job.tenant, need)
            if reason is not None:
                waits[job.id] = reason
                held.append((job, 0))
                blocked.append(Blocked(job.id, job.tenant, _CLASS_PRIORITY[job.klass], need))
        turn.blocked = tuple(blocked)
        if not held:
            return now, NO_WAITS
        turn.sim.core.note_refused(held, now)
        return now, waits


class QuotaDropped:
    """Step 3 with quotas: :class:`scheduler.pipeline.EnforceQuotas` on the plan, in its
    order; each dropped start or growth is undone in the core and refused at the time, and
    the next pass follows at once, where the hold-back keeps the job out and the policy may
    give its GPUs to another.  A start or growth cut to what fits goes on at its cut size,
    and its job is filed again in the core at that size once placed (:class:`SimBind`)."""

    __slots__ = ("enforce", "turn")

    def __init__(self, turn: QuotaTurn) -> None:
        self.turn = turn
        self.enforce = EnforceQuotas()

    def check(self, now: float, plan: Plan) -> tuple[Plan, Waits]:
        """The plan without the starts and growth over their tenant's quota, those that fit
        smaller cut down; why each dropped or held back from growing waits."""
        quota = self.turn.quota
        grows = (n > (job.alloc if job.running else 0) for job, n in plan if job.tenant in quota)
        if not any(grows):
            return plan, NO_WAITS  # nothing grows a share to check
        # Only jobs of a tenant with a quota are shown: the others are never dropped.
        views = tuple(_view(job) for job, _ in plan if job.tenant in quota)
        shown = Candidates(Snapshot(now, _NO_GPUS, views), self.turn.book)
        kept, waits = self.enforce.check(shown, _decisions(plan))
        sizes = {d.job: len(d.gpus) for d in kept if isinstance(d, Start | Scale)}
        out: Plan = []
        dropped: Plan = []
        cut: list[JobRecord] = []
        for job, n in plan:
            size = sizes.get(job.id, 0) if n > 0 else n
            if size <= 0 < n:
                dropped.append((job, n))
                continue
            if size < n:
                cut.append(job)
            out.append((job, size))
        if not dropped and not cut:
            return plan, waits
        self.turn.sim.binding.cut.extend(cut)
        if dropped:
            core = self.turn.sim.core
            core.unplaced(dropped, now)
            core.note_refused(dropped, now)
            self.turn.follow_up(now)
        return out, waits


class QuotaRoomMade:
    """Step 4 with quotas: :class:`scheduler.pipeline.PreemptWithinQuota` for the jobs held
    back, once a pass.  Each job stopped to make room leaves the core's running books and
    joins its queue (as a requeued job does), its own change of the plan undone; the next
    pass follows at once (:meth:`QuotaTurn.follow_up`), where the job it was stopped for
    may start.

    A job whose size the runtime owns now (a switch in flight, GPUs not handed over yet)
    is nobody's victim, as the tick leaves switching jobs out of its snapshot."""

    __slots__ = ("room", "turn")

    def __init__(self, turn: QuotaTurn) -> None:
        self.turn = turn
        self.room = PreemptWithinQuota()

    def make_room(self, now: float, plan: Plan) -> tuple[Plan, Waits, Waits]:
        """The plan with the preemptions in; the served jobs' waits; the victims' reasons."""
        turn = self.turn
        if not turn.blocked:
            return plan, NO_WAITS, NO_WAITS
        sim = turn.sim
        tenants = {b.tenant for b in turn.blocked}
        running = {
            job.id: job
            for job in turn.live
            if job.running
            and job.end_time is None
            and job.tenant in tenants
            and sim.switching.get(job, -math.inf) <= now
        }
        shown = Candidates(
            Snapshot(now, _NO_GPUS, tuple(map(_view, running.values()))), turn.book, turn.blocked
        )
        _, waits, stopped = self.room.make_room(shown, _decisions(plan))
        turn.blocked = ()  # a retry round of this pass makes no more room
        if not stopped:
            return plan, NO_WAITS, NO_WAITS
        core = sim.core
        own = {job.id: n for job, n in plan if job.id in stopped}
        undo = [(job, n) for job, n in plan if own.get(job.id, 0) > 0]
        if undo:
            core.unplaced(undo, now)  # the core's own change for a victim
        kept = [(job, n) for job, n in plan if job.id not in own or own[job.id] <= 0]
        for victim in stopped:
            if own.get(victim, 1) <= 0:
                continue  # the core stops it itself
            job = running[victim]
            core.remove(job, now)
            core.add(job, now)
            core.requeued(job, now)
            kept.append((job, 0))
        turn.follow_up(now)
        return kept, waits, stopped


SimPass = SchedulingPass[float, float, Plan, Refusals]
"""The simulator's scheduling pass: from the time of an event to the changes it refused."""
