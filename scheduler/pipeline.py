"""One scheduling pass, the same for the live tick, the forecast and the simulator (pure).

The steps, each a small class behind a Protocol, composed in one place
(:meth:`SchedulingPass.run`)::

    the caller's state       the tick's assembled snapshot, the forecast's virtual
    │                        cluster at t, the simulator's core at an event
    ▼
    1. HoldBack              which jobs are candidates, and why the others wait: over
    │                        their tenant's quota (the rule: scheduler.quota), set aside
    │                        (switching, profiling), shown capped (about to end), waiting
    │                        for other jobs to end (DependencyHoldBack)
    ▼
 ┌► 2. Decide                the policy's decisions on the candidates
 │  ▼
 │  3. QuotaCheck            starts and growth that would put a tenant over its quota
 │  │                        are cut to the size that fits, or dropped
 │  ▼
 │  4. WithinQuota           a held-back job of a higher class stops its own tenant's
 │  │                        lower-class jobs to fit (their decisions are replaced)
 │  ▼
 │  5. Bind                  the caller's: the fabric allocator (tick), GPU counts
 │  │                        (forecast), the simulator's placement; refusals said
 │  ▼
 └─ 6. Retry                 go around the refused jobs once more? (the simulator's
    │                        second pass; the tick and the forecast never do; asked
    │                        only when binding refused)
    ▼
    PassResult               what was bound, waits by job with why, preemptions with why

What differs between the callers (the clock, where progress comes from, how
long a switch takes, whether there are quotas) is in the step objects they
compose, never a flag inside the pass.  Deciding is pure; only ``Bind`` has
effects (the allocator, the simulator's books), and it undoes what it refuses.

The steps over a :class:`~scheduler.types.Snapshot` that the tick and the
forecast share are here too; the simulator's steps work on its policy core
(:mod:`scheduler.simulation`), its quota steps through these, with its records
shown as job views.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, NamedTuple, Protocol, TypeVar

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.binding import Bound, Refused, bind, bind_typed
from scheduler.curves import SpeedTables
from scheduler.gpu_types import split_by_type
from scheduler.packing import Packing, packing_for
from scheduler.placement import CountPlacement, Placement
from scheduler.policies.base import Policy
from scheduler.quota import (
    Blocked,
    QuotaBook,
    enforce_quotas,
    quota_need,
    within_quota_preemptions,
)
from scheduler.types import Decision, JobView, Migrate, Snapshot

Waits = Mapping[str, str]
"""Job name -> why it waits (or, for preemptions, why it was stopped)."""

NO_WAITS: Waits = MappingProxyType({})
"""The waits of a step that has none (shared: no dict per pass)."""

State = TypeVar("State")
Candidates_ = TypeVar("Candidates_")
Decisions = TypeVar("Decisions")
Outcome = TypeVar("Outcome")
State_contra = TypeVar("State_contra", contravariant=True)
Candidates_co = TypeVar("Candidates_co", covariant=True)
Candidates_contra = TypeVar("Candidates_contra", contravariant=True)
Decisions_co = TypeVar("Decisions_co", covariant=True)
Decisions_contra = TypeVar("Decisions_contra", contravariant=True)
Outcome_co = TypeVar("Outcome_co", covariant=True)
Outcome_contra = TypeVar("Outcome_contra", contravariant=True)


class HoldBack(Protocol[State_contra, Candidates_co]):
    """Step 1: the candidates the policy may decide on, and why each job left out waits."""

    def hold_back(self, state: State_contra) -> tuple[Candidates_co, Waits]:
        """The candidates in ``state`` and the waits of the jobs held back."""
        ...


class Decide(Protocol[Candidates_contra, Decisions_co]):
    """Step 2: the policy's decisions on the candidates."""

    def decide(self, candidates: Candidates_contra) -> Decisions_co:
        """What the policy would change now."""
        ...


class QuotaCheck(Protocol[Candidates_contra, Decisions]):
    """Step 3: the decisions that fit their tenant's quota (some cut down to fit); why the
    others were dropped or held from growing."""

    def check(self, candidates: Candidates_contra, decisions: Decisions) -> tuple[Decisions, Waits]:
        """The decisions kept and the waits of the jobs whose start or growth was dropped
        or cut."""
        ...


class WithinQuota(Protocol[Candidates_contra, Decisions]):
    """Step 4: preemptions that make room under a tenant's quota for its higher class."""

    def make_room(
        self, candidates: Candidates_contra, decisions: Decisions
    ) -> tuple[Decisions, Waits, Waits]:
        """The decisions with the preemptions in, why each held job served still waits,
        and why each stopped job was stopped."""
        ...


class Bind(Protocol[Candidates_contra, Decisions_contra, Outcome_co]):
    """Step 5: put the decisions on real (or virtual) GPUs; the caller's own step."""

    def bind(
        self, candidates: Candidates_contra, decisions: Decisions_contra
    ) -> tuple[Outcome_co, Waits]:
        """What was bound (and refused), and why each refused job waits."""
        ...


class Retry(Protocol[Candidates_contra, Outcome_contra]):
    """Step 6: whether the pass decides once more around what binding refused (asked only
    when binding refused something: said why a job waits)."""

    def again(self, candidates: Candidates_contra, outcome: Outcome_contra, rounds: int) -> bool:
        """True to decide and bind once more (``rounds``: the rounds already retried)."""
        ...


class PassResult(NamedTuple, Generic[Candidates_, Decisions, Outcome]):
    """What one pass did (a named tuple: the simulator makes one per event).

    ``decisions`` are the last round's, as handed to binding; ``bound`` has one
    outcome per round; ``waits`` are the held-back jobs' and the last round's
    (a later step's reason wins); ``stopped`` the preempted jobs' reasons.
    """

    candidates: Candidates_
    decisions: Decisions
    bound: tuple[Outcome, ...]
    waits: Waits
    stopped: Waits


PassParts = tuple[Candidates_, Decisions, tuple[Outcome, ...], Waits, Waits]
"""What one pass did as a plain tuple, in :class:`PassResult`'s order."""


@dataclass(frozen=True, slots=True)
class SchedulingPass(Generic[State, Candidates_, Decisions, Outcome]):
    """The steps of one pass, composed by :meth:`run` (in :meth:`run_parts`, the only
    place they are).

    A caller without a step leaves it out (None) rather than composing a no-op:
    ``hold_back`` None takes the state as the candidates and holds nothing back (State
    is then Candidates_), the simulator without quotas (``SimConfig.quota`` None)
    leaves ``quota_check`` and ``within_quota`` out, and ``retry`` None binds once, as the tick and the forecast do.
    """

    hold_back: HoldBack[State, Candidates_] | None
    decide: Decide[Candidates_, Decisions]
    quota_check: QuotaCheck[Candidates_, Decisions] | None
    within_quota: WithinQuota[Candidates_, Decisions] | None
    bind: Bind[Candidates_, Decisions, Outcome]
    retry: Retry[Candidates_, Outcome] | None = None

    def run(self, state: State) -> PassResult[Candidates_, Decisions, Outcome]:
        """One pass over ``state``: hold back, then decide, check, make room and bind,
        once more while the retry step asks for it; what it did."""
        # tuple.__new__ skips the named tuple's own __new__ (a Python frame).
        return _new_result(PassResult, self.run_parts(state))

    def run_parts(self, state: State) -> PassParts[Candidates_, Decisions, Outcome]:
        """:meth:`run`, its result as a plain tuple in :class:`PassResult`'s order.

        For a caller whose steps keep what it needs and that runs a pass at every
        event (the simulator): a named result costs more to build than an empty pass.
        """
        # Steps left out cost a test, not a call, and a pass of one round builds
        # nothing but its result.
        candidates: Candidates_
        if self.hold_back is None:  # State is Candidates_ (see the class)
            candidates, held = state, NO_WAITS  # type: ignore[assignment]
        else:
            candidates, held = self.hold_back.hold_back(state)
        over_quota = making_room = stopped = NO_WAITS
        outcomes: tuple[Outcome, ...] = ()
        while True:
            decisions = self.decide.decide(candidates)
            if self.quota_check is not None:
                decisions, over_quota = self.quota_check.check(candidates, decisions)
            if self.within_quota is not None:
                decisions, making_room, stopped = self.within_quota.make_room(candidates, decisions)
            outcome, refused = self.bind.bind(candidates, decisions)
            if (
                not refused
                or self.retry is None
                or not self.retry.again(candidates, outcome, len(outcomes))
            ):
                break
            outcomes = (*outcomes, outcome)
        waits = held
        if over_quota or making_room or refused:  # a later step's reason wins
            waits = {**held, **over_quota, **making_room, **refused}
        outcomes = (*outcomes, outcome) if outcomes else (outcome,)
        return candidates, decisions, outcomes, waits, stopped


_new_result = tuple.__new__


# -- steps any caller may use ----------------------------------------------------------------


class NothingHeldBack(Generic[State]):
    """Step 1 as an object where nothing is held back: the state itself is the candidates
    (the same as leaving ``hold_back`` out, which the simulator does unless the runtime's
    say is shown to the policy)."""

    __slots__ = ()

    def hold_back(self, state: State) -> tuple[State, Waits]:
        """``state``, and no waits."""
        return state, NO_WAITS


class NoQuotaCheck(Generic[Decisions]):
    """Step 3 as an object where there are no quotas: every decision stands (the same as
    leaving ``quota_check`` out, which the simulator without quotas does)."""

    __slots__ = ()

    def check(self, candidates: object, decisions: Decisions) -> tuple[Decisions, Waits]:
        """``decisions`` unchanged."""
        return decisions, NO_WAITS


class NoWithinQuota(Generic[Decisions]):
    """Step 4 as an object where there are no quotas: nothing is stopped for one (the same
    as leaving ``within_quota`` out, which the simulator without quotas does)."""

    __slots__ = ()

    def make_room(self, candidates: object, decisions: Decisions) -> tuple[Decisions, Waits, Waits]:
        """``decisions`` unchanged."""
        return decisions, NO_WAITS, NO_WAITS


class NoRetry:
    """Step 6 as an object where a caller wants one: one round; a refused job waits for the
    next pass (the same as leaving ``retry`` out)."""

    __slots__ = ()

    def again(self, candidates: object, outcome: object, rounds: int) -> bool:
        """Never."""
        return False


# -- the steps over a snapshot (the tick and the forecast) -----------------------------------


@dataclass(frozen=True, slots=True)
class Candidates:
    """What a pass over a snapshot decides on: the candidate jobs' snapshot, and what
    the quota steps read (``book`` None: no quotas; ``blocked``: the jobs held back)."""

    snapshot: Snapshot
    book: QuotaBook | None = None
    blocked: tuple[Blocked, ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaHoldBack:
    """Step 1 from a snapshot of every live job: queued jobs over their tenant's quota are
    left out (:meth:`scheduler.quota.QuotaBook.hold_reason`); ``quota`` None: no quotas.
    ``type_quota`` (tenant -> GPU type -> GPUs) adds quotas per type beside the totals.

    The live tick applies the same rule while it assembles its snapshot
    (``control.state``), where the rows are at hand.
    """

    quota: Mapping[str, int] | None
    type_quota: Mapping[str, Mapping[str, int]] | None = None

    def hold_back(self, state: Snapshot) -> tuple[Candidates, Waits]:
        """The snapshot without the held-back jobs, the quota book, why each waits."""
        if self.quota is None and not self.type_quota:
            return Candidates(state), NO_WAITS
        book = QuotaBook(quota=dict(self.quota or {}))
        if self.type_quota:
            book.type_quota = {t: dict(q) for t, q in self.type_quota.items()}
            book.gpu_types = {g.id: g.gpu_type for g in state.cluster.gpus}
        for view in state.jobs:
            if view.gpus:
                gpu_type = book.gpu_types.get(view.gpus[0], "") if book.gpu_types else ""
                book.count(view.tenant, len(view.gpus), view.requested_gpus, gpu_type)
        kept: list[JobView] = []
        blocked: list[Blocked] = []
        waits: dict[str, str] = {}
        for view in state.jobs:
            need = quota_need(view.min_gpus, view.requested_gpus)
            reason = None if view.gpus else book.hold_reason(view.tenant, need, view.gpu_types)
            if reason is None:
                kept.append(view)
                continue
            waits[view.id] = reason
            blocked.append(Blocked(view.id, view.tenant, view.priority, need))
        if not waits:
            return Candidates(state, book), NO_WAITS
        snapshot = dataclasses.replace(state, jobs=tuple(kept))
        return Candidates(snapshot, book, tuple(blocked)), waits


@dataclass(frozen=True, slots=True)
class TypeHoldBack:
    """Step 1 for typed requests: a queued job no server of the cluster could ever hold
    (:func:`scheduler.gpu_types.never_satisfiable`: no GPUs of a type it accepts on
    servers its selector matches, or too few) is left out with that reason, then
    ``inner`` holds back from the rest.  On an untyped snapshot it is ``inner`` alone.
    """

    inner: HoldBack[Snapshot, Candidates]

    def hold_back(self, state: Snapshot) -> tuple[Candidates, Waits]:
        """The inner step's candidates and waits, without the jobs that could never run."""
        split = split_by_type(state)
        if split is None or not split.waits:
            return self.inner.hold_back(state)
        kept = tuple(view for view in state.jobs if view.id not in split.waits)
        candidates, inner_waits = self.inner.hold_back(dataclasses.replace(state, jobs=kept))
        return candidates, {**split.waits, **inner_waits}


@dataclass(frozen=True, slots=True)
class DependencyHoldBack:
    """Step 1 for jobs that wait for others (``scheduler.dependencies``): a job is left out
    while any job it waits for is still in the state (not ended), then ``inner`` holds back
    from the rest.  ``waits_for``: job -> the jobs it waits for.

    The forecast composes it (a dependent job's start follows its dependencies'
    finish on the virtual clock: a finished job leaves the snapshot).  The live
    tick never sees such a job: it stays pending in the database, outside the
    tick's snapshot, until ``jobs.dependencies`` queues it.
    """

    inner: HoldBack[Snapshot, Candidates]
    waits_for: Mapping[str, frozenset[str]]

    def hold_back(self, state: Snapshot) -> tuple[Candidates, Waits]:
        """The inner step's candidates and waits, over the jobs whose dependencies ended."""
        if not self.waits_for:
            return self.inner.hold_back(state)
        live = {view.id for view in state.jobs}
        waits: dict[str, str] = {}
        for view in state.jobs:
            pending = self.waits_for.get(view.id, frozenset()) & live
            if pending and not view.gpus:
                waits[view.id] = "waits for " + ", ".join(sorted(pending)) + " to end"
        if not waits:
            return self.inner.hold_back(state)
        kept = tuple(view for view in state.jobs if view.id not in waits)
        candidates, inner_waits = self.inner.hold_back(dataclasses.replace(state, jobs=kept))
        return candidates, {**waits, **inner_waits}


@dataclass(frozen=True, slots=True)
class PolicyDecide:
    """Step 2 over a snapshot: ``policy.schedule`` with its placement (by count in the
    tick and the forecast; the fabric is binding's) and the kept speed tables."""

    policy: Policy
    placement: Placement = dataclasses.field(default_factory=CountPlacement)
    speeds: SpeedTables | None = None

    def decide(self, candidates: Candidates) -> list[Decision]:
        """The policy's decisions on the candidates' snapshot."""
        return self.policy.schedule(
            candidates.snapshot, placement=self.placement, speeds=self.speeds
        )


class EnforceQuotas:
    """Step 3 over a snapshot: :func:`scheduler.quota.enforce_quotas` with the candidates' book."""

    __slots__ = ()

    def check(
        self, candidates: Candidates, decisions: list[Decision]
    ) -> tuple[list[Decision], Waits]:
        """The decisions that fit (cut where smaller fits); the dropped or cut jobs' waits."""
        if candidates.book is None:
            return decisions, NO_WAITS
        views = {v.id: v for v in candidates.snapshot.jobs}
        return enforce_quotas(decisions, views, candidates.book)


class PreemptWithinQuota:
    """Step 4 over a snapshot: :func:`scheduler.quota.within_quota_preemptions` for the
    held-back jobs, its preemptions replacing the policy's decisions for their victims."""

    __slots__ = ()

    def make_room(
        self, candidates: Candidates, decisions: list[Decision]
    ) -> tuple[list[Decision], Waits, Waits]:
        """The decisions with the preemptions; the served jobs' waits; the victims' reasons."""
        book = candidates.book
        if book is None or not candidates.blocked:  # the usual pass: nobody over quota
            return decisions, NO_WAITS, NO_WAITS
        running = [v for v in candidates.snapshot.jobs if v.gpus]
        room = within_quota_preemptions(candidates.blocked, running, book)
        if not room.preempts:
            return decisions, NO_WAITS, NO_WAITS
        kept = [d for d in decisions if d.job not in room.stopped_for]
        reasons = {
            victim: f"preempted to make room under its tenant's quota for {blocked}, of a "
            "higher class; it resumes from its latest checkpoint"
            for victim, blocked in room.stopped_for.items()
        }
        return [*kept, *room.preempts], room.waits, reasons


@dataclass(frozen=True, slots=True)
class Binding:
    """What binding on the fabric did: the decisions placed, and those refused."""

    bound: list[Bound]
    refused: list[Refused]


@dataclass(frozen=True, slots=True)
class AllocatorBind:
    """Step 5 of the tick: :func:`scheduler.binding.bind` on the vClos allocator (mutated:
    it ends in the bound state, as the tick then applies it)."""

    spec: FabricSpec
    allocator: VClosAllocator
    gpu_types: Mapping[int, str] | None = None
    """Each GPU's type on a mixed cluster (:func:`scheduler.binding.bind_typed`, with the
    selecting jobs' GPUs from the candidates' snapshot); None: one type, no selectors."""
    packing: Packing | None = None
    """What to pack by when the candidates are no snapshot (the tick's drain moves); with
    a snapshot, its own (:func:`scheduler.packing.packing_for`)."""

    def bind(self, candidates: object, decisions: Sequence[Decision]) -> tuple[Binding, Waits]:
        """The bound and refused decisions; each refused job's wait is the allocator's reason.

        The candidates' jobs that ask for CPU cores or host memory per GPU are packed into
        their servers' capacities (:mod:`scheduler.packing`)."""
        packing = (
            packing_for(candidates.snapshot) if isinstance(candidates, Candidates) else self.packing
        )
        if self.gpu_types:
            split = (
                split_by_type(candidates.snapshot) if isinstance(candidates, Candidates) else None
            )
            allowed = (
                {j: ids for pool in split.pools for j, ids in pool.allowed.items()} if split else {}
            )
            in_play = _in_play(self.spec, self.allocator, decisions, self.gpu_types)
            bound, refused = bind_typed(
                self.spec, self.allocator, decisions, in_play, allowed, packing
            )
        else:
            bound, refused = bind(self.spec, self.allocator, decisions, packing=packing)
        waits = {r.job: r.reason for r in refused} if refused else NO_WAITS
        return Binding(bound, refused), waits


def _in_play(
    spec: FabricSpec,
    allocator: VClosAllocator,
    decisions: Sequence[Decision],
    gpu_types: Mapping[int, str],
) -> Mapping[int, str]:
    """The part of ``gpu_types`` that a typed binding of ``decisions`` can tell from all of
    it: the GPUs free on ``allocator`` now, those the decided jobs hold or are given, and
    one GPU of each type.

    :func:`scheduler.binding.bind_typed` marks every GPU of the other types unavailable
    while one type's decisions bind, and available again after.  Only a GPU that is free
    at some moment of the binding can be placed, so only those marks decide anything:
    the GPUs free now and those the decided jobs release (a busy GPU is never placed,
    marked or not; nothing else frees one during a binding).  One GPU of each type keeps
    the number of types the binding sees (one type takes another path).  At 16,384 GPUs
    marking every other type's GPU, type after type, was most of a typed tick's binding.
    """
    if not decisions:
        return {}  # nothing binds, nothing is marked: one type's path, which binds nothing
    ids = set(_one_of_each_type(gpu_types).values())
    for leaf in range(spec.leaves):
        ids.update(allocator.free_gpus_on_leaf(leaf))
    current = allocator.allocations()
    for decision in decisions:
        held = current.get(decision.job)
        if held is not None:
            ids.update(held.gpus)
        ids.update(getattr(decision, "gpus", ()))
    return {gpu: gpu_types[gpu] for gpu in ids if gpu in gpu_types}


def _one_of_each_type(gpu_types: Mapping[int, str]) -> Mapping[str, int]:
    """A GPU of each type of ``gpu_types`` (type -> GPU); remembered for the last mapping.

    A cluster's mapping is made once and then only replaced (the tick's kept state
    keeps one while the servers do not change), so the tick's typed bindings look at
    its 16,384 entries once, not every tick.
    """
    last = _last_types
    if last is not None and last[0] is gpu_types:
        return last[1]
    found = {name: gpu for gpu, name in gpu_types.items()}
    _remember_types((gpu_types, found))
    return found


_last_types: tuple[Mapping[int, str], Mapping[str, int]] | None = None


def _remember_types(entry: tuple[Mapping[int, str], Mapping[str, int]]) -> None:
    """Keep ``entry`` as the last mapping's types (one assignment: safe beside a thread)."""
    global _last_types
    _last_types = entry


class CountBind:
    """Step 5 of the forecast: GPUs by count, as the policy chose them; a migration (same
    size) changes nothing by count and is left out."""

    __slots__ = ()

    def bind(self, candidates: object, decisions: list[Decision]) -> tuple[list[Decision], Waits]:
        """The decisions to apply to the virtual cluster."""
        return [d for d in decisions if not isinstance(d, Migrate)], NO_WAITS


def snapshot_pass(
    hold_back: HoldBack[State, Candidates],
    decide: Decide[Candidates, list[Decision]],
    bind: Bind[Candidates, list[Decision], Outcome],
) -> SchedulingPass[State, Candidates, list[Decision], Outcome]:
    """The pass the tick and the forecast run: their hold-back, decide and bind steps
    between the quota check and the within-quota preemptions, one round."""
    return SchedulingPass(
        hold_back=hold_back,
        decide=decide,
        quota_check=EnforceQuotas(),
        within_quota=PreemptWithinQuota(),
        bind=bind,
    )


__all__ = [
    "NO_WAITS",
    "AllocatorBind",
    "Bind",
    "Binding",
    "Candidates",
    "CountBind",
    "Decide",
    "DependencyHoldBack",
    "EnforceQuotas",
    "HoldBack",
    "NoQuotaCheck",
    "NoRetry",
    "NoWithinQuota",
    "NothingHeldBack",
    "PassResult",
    "PolicyDecide",
    "PreemptWithinQuota",
    "QuotaCheck",
    "QuotaHoldBack",
    "Retry",
    "SchedulingPass",
    "TypeHoldBack",
    "Waits",
    "WithinQuota",
    "snapshot_pass",
]
