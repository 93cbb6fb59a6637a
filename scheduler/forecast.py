"""Predicted start and finish: the production policy run forward from a snapshot (pure).

The control plane's tick decides on a :class:`~scheduler.types.Snapshot` once
every few seconds.  A forecast replays that same decision, ``Policy.schedule``
with placement by count, on a virtual clock, with no new arrivals::

    t = snapshot.now
    loop
      1-2. the tick's scheduling pass (scheduler.pipeline) on the snapshot at t: the
         dependency and quota hold-backs, the policy, the quota check, preemption
         within a tenant's quota; binding by GPU count
      3. apply them: starts (first start = predicted start), resizes, preemptions
      4. next time = the next finish of a running job with known remaining work,
         or, while jobs still wait, t + step (the step doubles from ``step_s`` up to
         ``max_step_s`` while passes change nothing)
      5. progress: remaining -= dt x rate(GPUs held); service += GPUs x dt
      6. a change the policy's own clock made inside the interval (a LAS demotion
         that lets a queued job in) is found by bisection to ``RESOLUTION_S``;
         before a finish, one probe just earlier tells whether there is one
    until no job waits and none with known work runs, the horizon or max_passes

A job's ``remaining_work`` is seconds at its requested size; ``rate(n)`` comes
from its throughput curve relative to the requested size (1.0 without one, as
in the simulator).  A job whose remaining work is unknown runs forever in the
forecast: its finish is None with a reason, and jobs that wait on its GPUs get
no start.  Nothing is invented.

A job that waits for others (``waits_for``: job -> the jobs it waits for,
``scheduler.dependencies``) is held back until every one of them has
finished on the virtual clock, so its predicted start follows their
predicted finish; the forecast assumes they succeed.

Placement is by GPU count: the fabric (vClos shapes, which the tick's binding
may refuse) is not modelled, so a start that binding would refuse is predicted
too early.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.curves import view_speeds
from scheduler.pipeline import (
    Candidates,
    CountBind,
    DependencyHoldBack,
    PolicyDecide,
    QuotaHoldBack,
    SchedulingPass,
    snapshot_pass,
)
from scheduler.policies.base import Policy
from scheduler.types import (
    Cluster,
    Decision,
    Gpu,
    GpuState,
    JobState,
    JobView,
    Preempt,
    Scale,
    Snapshot,
    Start,
)

DEFAULT_STEP_S = 60.0
DEFAULT_MAX_STEP_S = 960.0
DEFAULT_HORIZON_S = 7 * 24 * 3600.0
DEFAULT_MAX_PASSES = 5000
RESOLUTION_S = 1.0
"""How precisely a change the policy's own clock makes (a demotion) is placed in time."""

STEADY_S = 2.0
"""A new estimate within this many seconds of the published one is no change (estimates are cut to
the second: one that holds still moves by a second when two refreshes straddle an edge)."""
TOLERANCE = 0.05
"""Nor is one within this fraction of the time still to go to the published one: measured rates
wobble by a few percent from report to report, and an estimate hours away must not move by
minutes at every refresh for that."""

UNKNOWN_WORK = "remaining work unknown (no total steps or no measured throughput)"
WAITS_ON_UNKNOWN = "waits for GPUs held by jobs whose remaining work is unknown"
BEYOND_HORIZON = "not within the forecast horizon"
NEVER_FITS = "asks for more GPUs than the cluster has up"


@dataclass(frozen=True, slots=True)
class Estimate:
    """One job's forecast: seconds from the snapshot's ``now`` (None: not predicted, see reason).

    ``start`` is for a queued job (a running one has started); ``finish`` for both.
    """

    job: str
    start: float | None
    finish: float | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Forecast:
    """Every job's estimate, and the queued jobs in queue order (position 1 first)."""

    estimates: Mapping[str, Estimate]
    order: tuple[str, ...]
    passes: int = 0
    horizon_reached: bool = False


@dataclass(slots=True)
class _Progress:
    """The virtual state of one job during a forecast."""

    view: JobView
    gpus: tuple[int, ...]
    remaining: float
    attained: float
    speeds: list[float] | None
    started: float | None = None
    finished: float | None = None
    last_view: JobView | None = None  # the view of the last pass, while nothing moved

    def rate(self, n: int) -> float:
        """Seconds of requested-size work done per second on ``n`` GPUs."""
        if n <= 0:
            return 0.0
        table = self.speeds
        if table is None:
            return 1.0
        return table[n] if n < len(table) else table[-1]

    def finish_after(self) -> float:
        """Seconds until it finishes on the GPUs it holds (inf: unknown work or no progress)."""
        rate = self.rate(len(self.gpus))
        if not self.gpus or rate <= 0 or math.isinf(self.remaining):
            return math.inf
        return max(0.0, self.remaining) / rate


@dataclass(slots=True)
class _World:
    """The virtual cluster: the input snapshot, its GPUs as when idle (down stays down), jobs."""

    base: Snapshot
    idle: dict[int, Gpu]
    jobs: dict[str, _Progress] = field(default_factory=dict)


def _speeds(view: JobView) -> list[float] | None:
    if not view.throughput:
        return None
    return view_speeds(view.throughput, view.requested_gpus, view.max_gpus)


def _start_world(snapshot: Snapshot) -> _World:
    idle = {
        g.id: g if g.state is GpuState.DOWN else Gpu(g.id, g.server, g.leaf, gpu_type=g.gpu_type)
        for g in snapshot.cluster.gpus
    }
    world = _World(base=snapshot, idle=idle)
    for view in snapshot.jobs:
        remaining = math.inf if view.remaining_work is None else max(0.0, view.remaining_work)
        world.jobs[view.id] = _Progress(
            view=view,
            gpus=tuple(view.gpus) if view.running else (),
            remaining=remaining,
            attained=view.attained_service,
            speeds=_speeds(view),
            started=snapshot.now if view.running else None,
        )
    return world


def _snapshot_at(world: _World, now: float) -> Snapshot:
    """The virtual cluster as the tick would see it at ``now``, before the hold-back.

    Views are the input's with only what the forecast moves replaced, so whatever
    else the snapshot carries (tenants, classes) reaches every pass unchanged.
    """
    busy = {g: job for job, p in world.jobs.items() if p.finished is None for g in p.gpus}
    gpus = [
        Gpu(gpu.id, gpu.server, gpu.leaf, GpuState.BUSY, busy[gid], gpu.gpu_type)
        if gid in busy
        else gpu
        for gid, gpu in world.idle.items()
    ]
    views = []
    for p in world.jobs.values():
        if p.finished is not None:
            continue
        remaining = None if math.isinf(p.remaining) else p.remaining
        view = p.last_view
        if (
            view is None
            or view.gpus != p.gpus
            or view.attained_service != p.attained
            or view.remaining_work != remaining
        ):
            view = dataclasses.replace(
                p.view,
                gpus=p.gpus,
                attained_service=p.attained,
                remaining_work=remaining,
                state=JobState.RUNNING if p.gpus else JobState.QUEUED,
            )
            p.last_view = view
        views.append(view)
    return dataclasses.replace(
        world.base,
        now=now,
        cluster=Cluster(
            gpus=tuple(gpus),
            server_labels=world.base.cluster.server_labels,
            server_capacity=world.base.cluster.server_capacity,
        ),
        jobs=tuple(views),
    )


ForecastPass = SchedulingPass[Snapshot, Candidates, list[Decision], list[Decision]]
"""The tick's scheduling pass as the forecast runs it: GPUs by count on a virtual cluster."""


def forecast_pass(
    policy: Policy,
    quota: Mapping[str, int] | None,
    waits_for: Mapping[str, frozenset[str]] | None = None,
    type_quota: Mapping[str, Mapping[str, int]] | None = None,
) -> ForecastPass:
    """The pass (``scheduler.pipeline``) the forecast runs at each virtual time: the
    dependency hold-back (``waits_for``), the quota hold-back (``quota`` None: none;
    ``type_quota``: tenant -> GPU type -> GPUs, the live tick's quotas per type beside
    the totals), the policy placing by count, the quota check and the preemptions
    within a tenant's quota, binding by count (migrations left out)."""
    hold_back = DependencyHoldBack(QuotaHoldBack(quota, type_quota), waits_for or {})
    return snapshot_pass(hold_back, PolicyDecide(policy), CountBind())


def _decide(world: _World, t: float, scheduling: ForecastPass) -> list[Decision]:
    """The tick's pass at ``t`` on the virtual cluster: the decisions to apply."""
    return scheduling.run(_snapshot_at(world, t)).bound[0]


def _apply(world: _World, decisions: list[Decision], t: float) -> bool:
    """Bind a pass's decisions in the virtual cluster; True when anything changed."""
    changed = False
    for decision in decisions:
        p = world.jobs.get(decision.job)
        if p is None:
            continue
        if isinstance(decision, Preempt):
            p.gpus = ()
        elif isinstance(decision, Start | Scale):
            p.gpus = tuple(decision.gpus)
            if p.started is None:
                p.started = t
        changed = True
    return changed


def _advance(world: _World, dt: float, t_next: float) -> bool:
    """Progress every running job by ``dt``; True when one finished."""
    finished = False
    for p in world.jobs.values():
        if not p.gpus or p.finished is not None:
            continue
        if not math.isinf(p.remaining):
            p.remaining -= dt * p.rate(len(p.gpus))
        p.attained += len(p.gpus) * dt
        if p.remaining <= 1e-6:
            p.remaining = 0.0
            p.finished = t_next
            p.gpus = ()
            finished = True
    return finished


_Saved = dict[str, tuple[float, float, tuple[int, ...]]]


def _save(world: _World) -> _Saved:
    """What moving the clock changes: each running job's remaining work, service, GPUs."""
    return {
        job: (p.remaining, p.attained, p.gpus)
        for job, p in world.jobs.items()
        if p.gpus and p.finished is None
    }


def _move_to(world: _World, saved: _Saved, t: float, to: float) -> None:
    """Put the running jobs back where they were at ``t`` (``saved``), then on to ``to``."""
    for job, (remaining, attained, gpus) in saved.items():
        p = world.jobs[job]
        p.remaining, p.attained, p.gpus, p.finished = remaining, attained, gpus, None
    _advance(world, to - t, to)


def _first_change(
    world: _World,
    saved: _Saved,
    t: float,
    hi: float,
    decisions: list[Decision],
    scheduling: ForecastPass,
) -> tuple[float, list[Decision], int]:
    """Bisect (t, hi] for the first time a pass decides something; no finish lies inside.

    ``decisions`` are the pass's at ``hi``.  Leaves ``world`` at the time found and
    returns it, that pass's decisions and the passes spent.
    """
    lo, passes = t, 0
    while hi - lo > RESOLUTION_S:
        mid = (lo + hi) / 2
        _move_to(world, saved, t, mid)
        found = _decide(world, mid, scheduling)
        passes += 1
        if found:
            hi, decisions = mid, found
        else:
            lo = mid
    _move_to(world, saved, t, hi)
    return hi, decisions, passes


def forecast(
    snapshot: Snapshot,
    policy: Policy,
    *,
    quota: Mapping[str, int] | None = None,
    waits_for: Mapping[str, frozenset[str]] | None = None,
    type_quota: Mapping[str, Mapping[str, int]] | None = None,
    step_s: float = DEFAULT_STEP_S,
    max_step_s: float = DEFAULT_MAX_STEP_S,
    horizon_s: float = DEFAULT_HORIZON_S,
    max_passes: int = DEFAULT_MAX_PASSES,
) -> Forecast:
    """Run ``policy`` forward from ``snapshot``; each job's predicted start and finish.

    ``quota`` maps tenant to its GPU quota (None: no quota rule); queued jobs
    of the snapshot are all given, including those the tick holds back now.
    ``type_quota`` maps tenant to its quota per GPU type (``scheduler.quota``: a job
    capped by its type's quota starts when a job holding that type's quota ends, as
    on the tick).  ``waits_for`` maps a job to the jobs it waits for: held back until
    they finish.
    """
    if step_s <= 0 or max_step_s < step_s or horizon_s <= 0 or max_passes < 1:
        raise ValueError("forecast needs 0 < step_s <= max_step_s, horizon_s > 0, max_passes >= 1")
    world = _start_world(snapshot)
    t = snapshot.now
    end = snapshot.now + horizon_s
    step = step_s
    passes = 1
    horizon_reached = False
    scheduling = forecast_pass(policy, quota, waits_for, type_quota)
    decisions = _decide(world, t, scheduling)
    while True:
        changed = _apply(world, decisions, t)
        step = step_s if changed else min(step * 2, max_step_s)
        active = [p for p in world.jobs.values() if p.finished is None]
        waiting = any(not p.gpus for p in active)
        if not changed and not any(p.gpus for p in active):
            break  # free GPUs and no taker: no later pass decides otherwise
        t_finish = min((t + p.finish_after() for p in active if p.gpus), default=math.inf)
        t_next = min(t_finish, t + step) if waiting else t_finish
        if math.isinf(t_next) and waiting and any(p.gpus for p in active):
            t_next = t + step  # only unknown-work jobs run: the policy's clock may still move
        if math.isinf(t_next):
            break
        if t_next > end or passes >= max_passes:
            horizon_reached = True
            break
        saved = _save(world)
        _advance(world, t_next - t, t_next)
        decisions = _decide(world, t_next, scheduling)
        passes += 1
        # Did the policy's own clock (a demotion) move something before t_next?  At a
        # finish, one probe just before it tells; then the change is found to a second.
        hi, found = t_next, decisions
        if t_next >= t_finish:
            found = []
            if waiting and t_next - t > RESOLUTION_S:
                hi = t_next - RESOLUTION_S / 2
                _move_to(world, saved, t, hi)
                found = _decide(world, hi, scheduling)
                passes += 1
                if not found:
                    _move_to(world, saved, t, t_next)  # nothing before the finish
        if found:
            t_next, decisions, probes = _first_change(world, saved, t, hi, found, scheduling)
            passes += probes
        t = t_next
    return _result(world, snapshot, policy, passes, horizon_reached)


def _result(
    world: _World, snapshot: Snapshot, policy: Policy, passes: int, horizon_reached: bool
) -> Forecast:
    up = snapshot.cluster.total_gpus
    unknown_holds = any(
        math.isinf(p.remaining) and p.gpus and p.finished is None for p in world.jobs.values()
    )
    estimates: dict[str, Estimate] = {}
    for job, p in world.jobs.items():
        queued = not p.view.running
        start = p.started - snapshot.now if queued and p.started is not None else None
        finish = None if p.finished is None else p.finished - snapshot.now
        reason = ""
        if queued and p.started is None:
            if (p.view.min_gpus or p.view.requested_gpus) > up:
                reason = NEVER_FITS
            elif unknown_holds:
                reason = WAITS_ON_UNKNOWN
            else:
                reason = BEYOND_HORIZON
        elif finish is None:
            reason = UNKNOWN_WORK if math.isinf(p.remaining) else BEYOND_HORIZON
        estimates[job] = Estimate(job=job, start=start, finish=finish, reason=reason)
    return Forecast(
        estimates=estimates,
        order=queue_order(snapshot, policy),
        passes=passes,
        horizon_reached=horizon_reached,
    )


def steady(
    published: float | None,
    new: float | None,
    now: float,
    *,
    steady_s: float = STEADY_S,
    tolerance: float = TOLERANCE,
) -> float | None:
    """The estimate to publish (seconds on one clock): ``published`` while ``new`` lies
    within ``steady_s`` of it or within ``tolerance`` of the time still to go to it,
    otherwise ``new`` (and ``new`` when either is None: appearing or vanishing is news)."""
    if published is None or new is None:
        return new
    ahead = max(0.0, published - now)
    return published if abs(new - published) < max(steady_s, tolerance * ahead) else new


def queue_order(snapshot: Snapshot, policy: Policy) -> tuple[str, ...]:
    """The queued jobs in the order the policy considers them: position 1 first.

    The policy's own order (``Policy.queue_order``: class, LAS queue, tenant
    fair share, then submission), not the predicted start: a job that fits the
    free GPUs may start before one ahead of it that does not (first fit).
    """
    return tuple(policy.queue_order(snapshot))
