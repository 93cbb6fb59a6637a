"""The simulator's knobs: the cluster, the policy's view of it, and what changes cost.

:class:`SimConfig` is everything :func:`scheduler.simulator.simulate` is told
besides the trace and the policy; :class:`ScalingCost` what an allocation
change and a job's fixed costs take; :class:`Outage` one GPU out of service;
:class:`Fidelity` which of the live tick's rules the loop follows (one named
strategy per rule: :class:`EndingJobs`, :class:`SwitchingJobs`,
:class:`BindingRounds`, :class:`StartBinder`, :class:`LeaversSlots`,
:class:`StartUpScaleIn`; bundles :data:`IDEAL` and :data:`LIVE_TICK`).
Plain frozen values: the loop (:mod:`scheduler.simulation`) only reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from fabric.topology import FabricSpec
from scheduler.fairshare import FAIR_SHARE_HALF_LIFE

_T = TypeVar("_T")


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


# -- fidelity: where the simulator may follow the live control plane's tick ---------------
#
# Each difference between the simulator's own rules and the live tick's is one strategy,
# named for what it models; :class:`Fidelity` bundles one of each.  The loop
# (:mod:`scheduler.simulation`) reads them once, when it composes its steps.


class EndingJobs(Enum):
    """How a running job about to end (``SimConfig.grow_min_left_s``) meets a growth.

    A newcomer would join a job that is finishing, so neither side grows it; they
    differ in who else gets the GPUs in the same pass.
    """

    GROWTH_REFUSED = "growth-refused"
    """The policy grows it; the runtime refuses the growth after the pass, and the GPUs the
    policy gave it stay idle until the next pass."""

    SHOWN_CAPPED = "shown-capped"
    """As the live tick: the policy sees it capped at its size (``max_gpus``), so the idle
    GPUs go to the next job in the same pass (a core that reads ``max_gpus`` at each pass,
    such as ``TickCore``)."""


class SwitchingJobs(Enum):
    """How a job with a switch in flight (``ScalingCost.join_s``/``leave_s``) is shown."""

    RESIZE_REFUSED = "resize-refused"
    """The policy may resize it; the runtime refuses the resize after the pass, and with one
    binding round per tick nothing else gets those GPUs in that pass."""

    SHOWN_PINNED = "shown-pinned"
    """As the live tick, which leaves a job in ``scaling`` out of its snapshot: the policy
    sees it pinned at its size (``min_gpus = max_gpus``) and gives the idle GPUs to the
    others.  An ended job not handed over yet is not pinned: the live snapshot still shows
    it running."""


class BindingRounds(Enum):
    """What a pass does after binding refused part of it (no shape free, the runtime's say)."""

    RETRY_AROUND_REFUSALS = "retry-around-refusals"
    """A second round at the same time decides around the refused jobs (not for a strictly
    ordered queue: FIFO's head-of-line blocking)."""

    ONCE_PER_TICK = "once-per-tick"
    """As the live tick, which binds once: a refused start waits for the next pass, which
    plans it again, while the GPUs it was given stay idle."""


class LeaversSlots(Enum):
    """With shared CPUs (``slot_slowdown``, ``start_slowdown``): when a scale-in's leavers
    stop counting as busy slots.  Their GPUs go to other jobs at once either way."""

    FREE_AT_DECISION = "free-at-decision"
    """The slots stop counting when the scale-in is decided."""

    BUSY_UNTIL_GONE = "busy-until-gone"
    """As on the live cluster: the leavers train until their switch is done
    (``ScalingCost.leave_s`` after the job trains), and the busy count the sharing law was
    fitted from counts them."""


class StartUpScaleIn(Enum):
    """When a scale-in decided during a job's first start is done (``ScalingCost.leave_s``)."""

    DUE_AS_DECIDED = "due-as-decided"
    """``leave_s`` after the start-up's end as it was due at the decision."""

    AFTER_START_UP = "after-start-up"
    """As live, where the leavers stop once the job trains: ``leave_s`` after the start-up's
    end as ``start_slowdown`` stretches it later."""


@dataclass(frozen=True, slots=True)
class StartBinder:
    """How binding treats a start that fits no vClos shape at the size the policy chose.

    The live binder's rule changed twice, so a replay of a live run names the one the
    run was made with (``bench/sim_vs_real_runs/*.json``, ``_meta.binder``): see
    :data:`BINDERS`.  ``starts_on_base``: an elastic start whose extras no shape fits
    starts on its base size (``Start.base``), the extras refused; else it waits whole for
    the next pass.  ``reshapes``: such a start is placed before the jobs the same pass
    shrank, which then go back on their own GPUs or a fresh shape
    (``scheduler.binding.reshape_around``); else a shrink keeps its GPUs in place.
    """

    name: str
    starts_on_base: bool
    reshapes: bool


BASE_THEN_EXTRAS = StartBinder("base-then-extras", starts_on_base=True, reshapes=True)
"""The live binder since 2026-12-04 03:55 (and the simulator's default): base, then the
extras that fit; a start goes before the shrinks made for it."""

BASE_THEN_EXTRAS_SHRINKS_KEPT = StartBinder(
    "base-then-extras-shrinks-kept", starts_on_base=True, reshapes=False
)
"""The live binder from 2026-12-03 21:52 to 2026-12-04 03:55: base, then the extras that
fit; a shrink keeps its GPUs in place."""

WHOLE_START_SHRINKS_KEPT = StartBinder(
    "whole-start-shrinks-kept", starts_on_base=False, reshapes=False
)
"""The live binder before 2026-12-03 21:52: the size the policy chose or nothing; a shrink
keeps its GPUs in place."""

WHOLE_START = StartBinder("whole-start", starts_on_base=False, reshapes=True)
"""Never live: the whole-start rule alone on today's binder (an ablation's row)."""

BINDERS: Mapping[str, StartBinder] = {
    b.name: b
    for b in (
        BASE_THEN_EXTRAS,
        BASE_THEN_EXTRAS_SHRINKS_KEPT,
        WHOLE_START_SHRINKS_KEPT,
        WHOLE_START,
    )
}
"""Every binder by name (a saved run's record, the command line's ``--binder``)."""


def _named(what: str, table: Mapping[str, _T], name: str) -> _T:
    """``table[name]``, or a ValueError naming the known ones."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}") from None


def binder_named(name: str) -> StartBinder:
    """The binder called ``name`` (:data:`BINDERS`); ValueError naming the known ones."""
    return _named("binder", BINDERS, name)


@dataclass(frozen=True, slots=True)
class Fidelity:
    """How closely the simulator follows the live tick: one strategy per difference.

    What differs between the simulator and the tick that is a quantity (the clock, the
    control plane's delays ``arrival_s``/``release_s``, switch times, rates) is an input
    of :class:`SimConfig`; these are the rules.  The default is :data:`IDEAL`.
    """

    ending: EndingJobs = EndingJobs.GROWTH_REFUSED
    switching: SwitchingJobs = SwitchingJobs.RESIZE_REFUSED
    rounds: BindingRounds = BindingRounds.RETRY_AROUND_REFUSALS
    binder: StartBinder = BASE_THEN_EXTRAS
    leavers: LeaversSlots = LeaversSlots.FREE_AT_DECISION
    start_up_scale_in: StartUpScaleIn = StartUpScaleIn.DUE_AS_DECIDED


IDEAL = Fidelity()
"""The simulator's own rules: the runtime refuses after the pass what it owns, a second
round goes around refusals, the live binder of today, leavers' slots free at once."""

LIVE_TICK = Fidelity(
    ending=EndingJobs.SHOWN_CAPPED,
    switching=SwitchingJobs.SHOWN_PINNED,
    rounds=BindingRounds.ONCE_PER_TICK,
    binder=BASE_THEN_EXTRAS,
    leavers=LeaversSlots.BUSY_UNTIL_GONE,
    start_up_scale_in=StartUpScaleIn.AFTER_START_UP,
)
"""The live control plane's tick as it is: what the runtime owns shown to the policy,
one binding round per tick, today's binder, leavers busy until gone."""

FIDELITIES: Mapping[str, Fidelity] = {"ideal": IDEAL, "live-tick": LIVE_TICK}
"""The named bundles (the command line's ``--fidelity``)."""


def fidelity_named(name: str) -> Fidelity:
    """The bundle called ``name`` (:data:`FIDELITIES`); ValueError naming the known ones."""
    return _named("fidelity", FIDELITIES, name)


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
    (``PolicyCore.unplaced``).

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

    ``quota``: each named tenant's GPU quota (``scheduler.quota``: a tenant's
    jobs hold at most that many GPUs of their requests at once); the pass then
    holds back a queued job over its tenant's quota, drops starts that do not
    fit, and lets a higher class stop its own tenant's lower classes to fit, as
    the live tick does.  Tenants not named have no quota.  None: no quotas.

    ``fidelity``: how closely the loop follows the live control plane's tick
    where the two differ (:class:`Fidelity`: one named strategy per difference;
    :data:`IDEAL`, the default, is the simulator's own rules, :data:`LIVE_TICK`
    the tick's).

    ``gpu_speed``: the speed of the cluster's GPU type (:class:`scheduler.gpu_types.GpuType`;
    1.0, the reference type: as before).  A trace's durations are at the job's request on
    the reference type; on this type each is divided by
    :func:`scheduler.throughput.type_speedup` at that request, and an elastic job's curve
    is the typed model's (it flattens sooner).  A mixed cluster runs one loop per type
    (:mod:`scheduler.sim_types`).
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
    fidelity: Fidelity = IDEAL
    quota: Mapping[str, int] | None = None
    gpu_speed: float = 1.0

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
