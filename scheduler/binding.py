"""Binding: turn a policy's decisions into concrete vClos allocations (pure, no ORM).

The policy (``scheduler``) decides *how many* GPUs each job gets; binding asks
the vClos allocator (``fabric``) *which* GPUs and cables, so that no two jobs
ever share a leaf-spine link.  A job whose new size fits inside what it holds
on one leaf keeps its GPUs (no migration); any other resize gets a fresh
``m x n`` shape and, where the GPUs change, becomes one stop-free membership
switch (EDL's migration = scale-in + scale-out merged).

An elastic start may carry extras (idle GPUs above the job's base size).  When
no shape fits the planned size but one fits the base (``Start.base``), the job
starts on its base now, as EDL does, and a later tick scales it out; it does
not wait whole for a shape of the planned size.

Binding works on a scratch copy of the allocator state: decisions are bound in
order (shrinks and preemptions first, so their GPUs are free for the rest),
and a decision that cannot be placed is refused with the allocator's reason
(for a start with a base: the base's reason); nothing is half-applied.

A shrink keeps its GPUs in place without knowing what its freed GPUs are for,
so a reclaim by count can leave them where no shape of the waiting job fits
(two on one leaf, one on the other).  When a start finds no shape and jobs
shrank earlier in the same round, :func:`reshape_around` asks the
allocator for the newcomer's shape first, with the shrunk jobs' GPUs free, and
then places each shrunk job again at its new size: on its own GPUs of one leaf
when they are still free, else on a fresh shape (a migration, stop-free like
any switch).  If any of them then fits nowhere, everything goes back as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fabric.allocator import Allocation, VClosAllocator
from fabric.errors import PlacementError
from fabric.topology import FabricSpec
from scheduler.types import Decision, Migrate, Preempt, Scale, Start


@dataclass(frozen=True)
class Bound:
    """A decision with its placement: ``allocation`` is None for a preemption.

    ``planned`` is the size the decision asked for when the job was placed on
    fewer GPUs (a start on its base because no shape fitted its extras); 0
    when it got what it asked for.
    """

    job: str
    old_gpus: tuple[int, ...]
    allocation: Allocation | None
    planned: int = 0

    @property
    def new_gpus(self) -> tuple[int, ...]:
        """GPUs in rank order after the change (empty when preempted)."""
        return self.allocation.gpus if self.allocation else ()


@dataclass(frozen=True)
class Refused:
    """A decision that could not be placed now, and why."""

    job: str
    reason: str


def _single_leaf(spec: FabricSpec, job: str, gpus: Sequence[int]) -> Allocation:
    leaf = spec.leaf_of(gpus[0])
    return Allocation(
        job_id=job,
        gpus=tuple(gpus),
        leaves=(leaf,),
        spines=(),
        links=(),
        routes={},
        uplinks=(),
    )


def _keep_in_place(
    spec: FabricSpec, allocator: VClosAllocator, old: Allocation, size: int
) -> tuple[int, ...] | None:
    """GPUs for a resize that leave the job's current workers where they are, if any.

    Shrinking keeps the GPUs the job has on one of its leaves; growing a job
    that lives under one leaf adds free GPUs of that same leaf.  Either way the
    result sits under a single leaf and needs no spine link.  (``old`` has been
    released on ``allocator``, so its GPUs count as free here.)
    """
    by_leaf: dict[int, list[int]] = {}
    for gpu in old.gpus:
        by_leaf.setdefault(spec.leaf_of(gpu), []).append(gpu)
    if size <= len(old.gpus):
        for gpus in sorted(by_leaf.values(), key=len, reverse=True):
            if len(gpus) >= size:
                return tuple(gpus[:size])
        return None
    if len(by_leaf) != 1:
        return None
    (leaf,) = by_leaf
    extra = [g for g in allocator.free_gpus_on_leaf(leaf) if g not in set(old.gpus)]
    if len(old.gpus) + len(extra) < size:
        return None
    return tuple(old.gpus) + tuple(extra[: size - len(old.gpus)])


def _kept_on_one_leaf(
    spec: FabricSpec, allocator: VClosAllocator, gpus: Sequence[int], size: int
) -> tuple[int, ...] | None:
    """``size`` of ``gpus`` that are free and under one leaf (the leaf with most of them)."""
    by_leaf: dict[int, list[int]] = {}
    for gpu in gpus:
        by_leaf.setdefault(spec.leaf_of(gpu), []).append(gpu)
    for leaf, mine in sorted(by_leaf.items(), key=lambda item: -len(item[1])):
        free = set(allocator.free_gpus_on_leaf(leaf))
        kept = [g for g in mine if g in free]
        if len(kept) >= size:
            return tuple(kept[:size])
    return None


def _place_shrunk(
    spec: FabricSpec, allocator: VClosAllocator, shrunk: Bound
) -> Allocation | PlacementError:
    """Place a job shrunk this round again at its new size, on its own GPUs where it can."""
    size = len(shrunk.new_gpus)
    kept = _kept_on_one_leaf(spec, allocator, shrunk.old_gpus, size)
    if kept is not None:
        allocation = _single_leaf(spec, shrunk.job, kept)
        allocator.reserve(allocation)
        return allocation
    return allocator.try_allocate(shrunk.job, size)


def reshape_around(
    spec: FabricSpec,
    allocator: VClosAllocator,
    job: str,
    sizes: Sequence[int],
    shrunk: Sequence[Bound],
) -> tuple[Allocation, list[Bound]] | None:
    """Place ``job`` (the first of ``sizes`` that fits) before the jobs shrunk this round.

    The shrunk jobs' current allocations are released, ``job`` gets a shape,
    and each shrunk job is placed again at its new size (:func:`_place_shrunk`).
    Returns ``job``'s allocation and the shrunk jobs' new bindings; None, with
    ``allocator`` as it was, when no size of ``job`` leaves room for all of them.
    ``job`` must hold nothing on ``allocator``.
    """
    if not shrunk or not sizes:
        return None
    for bound in shrunk:
        allocator.release(bound.job)
    for size in sizes:
        result = allocator.try_allocate(job, size)
        if isinstance(result, PlacementError):
            continue
        again: list[Bound] = []
        for bound in shrunk:
            placed = _place_shrunk(spec, allocator, bound)
            if isinstance(placed, PlacementError):
                break
            again.append(Bound(bound.job, bound.old_gpus, placed, bound.planned))
        if len(again) == len(shrunk):
            return result, again
        for bound in again:
            allocator.release(bound.job)
        allocator.release(job)
    for bound in shrunk:
        assert bound.allocation is not None  # a shrink to zero is a preemption, not a shrink
        allocator.reserve(bound.allocation)
    return None


def _target_size(decision: Decision, current: Mapping[str, Allocation]) -> int:
    if isinstance(decision, Preempt):
        return 0
    return len(decision.gpus)


def _fallback_size(decision: Decision, size: int) -> int:
    """The smaller size to try when ``size`` finds no shape: a start's base, else 0 (none)."""
    if isinstance(decision, Start) and 0 < decision.base < size:
        return decision.base
    return 0


def _order(decisions: Iterable[Decision], current: Mapping[str, Allocation]) -> list[Decision]:
    """Releases first (preempt, shrink), then growth and starts, each in the policy's order."""

    def key(item: tuple[int, Decision]) -> tuple[int, int]:
        index, decision = item
        held = len(current[decision.job].gpus) if decision.job in current else 0
        return (0 if _target_size(decision, current) < held else 1, index)

    return [d for _, d in sorted(enumerate(decisions), key=key)]


def bind(
    spec: FabricSpec,
    allocator: VClosAllocator,
    decisions: Iterable[Decision],
    shrunk: dict[str, Bound] | None = None,
) -> tuple[list[Bound], list[Refused]]:
    """Place every decision on ``allocator`` (mutated: it ends in the bound state).

    Returns the decisions placed, in binding order, and those refused with
    the allocator's reason.  A start whose planned size finds no shape is
    placed on its base size when that fits (``Bound.planned`` says so).

    ``shrunk`` holds the jobs made smaller earlier in the same round, for a
    caller that binds a round one decision at a time (the simulator); bind
    adds this call's shrinks to it and keeps it current when
    :func:`reshape_around` moves one.  A shrunk job moved by this call is also
    replaced in the returned list.
    """
    current = dict(allocator.allocations())
    bound: list[Bound] = []
    refused: list[Refused] = []
    if shrunk is None:
        shrunk = {}
    for decision in _order(decisions, current):
        job = decision.job
        shrunk.pop(job, None)  # its new binding, below, is what a reshape would move
        old = current.get(job)
        old_gpus = old.gpus if old else ()
        size = _target_size(decision, current)
        if isinstance(decision, Preempt) or size == 0:
            if old is not None:
                allocator.release(job)
            bound.append(Bound(job, old_gpus, None))
            continue
        if old is not None:
            allocator.release(job)
        keep = None
        if old is not None and not isinstance(decision, Migrate | Start):
            keep = _keep_in_place(spec, allocator, old, size)
        if keep is not None:
            allocation = _single_leaf(spec, job, keep)
            allocator.reserve(allocation)
            bound.append(Bound(job, old_gpus, allocation))
            if size < len(old_gpus):
                shrunk[job] = bound[-1]
            continue
        result = allocator.try_allocate(job, size)
        planned = 0
        fallback = _fallback_size(decision, size)
        if isinstance(result, PlacementError) and fallback:
            result = allocator.try_allocate(job, fallback)
            planned = size
        if isinstance(result, PlacementError) and shrunk and isinstance(decision, Start):
            sizes = (size, fallback) if fallback else (size,)
            reshaped = reshape_around(spec, allocator, job, sizes, list(shrunk.values()))
            if reshaped is not None:
                result, again = reshaped
                planned = size if len(result.gpus) < size else 0
                for moved in again:
                    shrunk[moved.job] = moved
                    bound[:] = [moved if b.job == moved.job else b for b in bound]
        if isinstance(result, PlacementError):
            if old is not None:  # put the job back where it was
                allocator.reserve(old)
            refused.append(Refused(job, result.reason))
            continue
        if (
            isinstance(decision, Scale | Migrate)
            and old is not None
            and set(result.gpus) == set(old_gpus)
        ):
            result = old  # same GPUs: keep the old rank order, nothing moves
            allocator.release(job)
            allocator.reserve(old)
        bound.append(Bound(job, old_gpus, result, planned))
        if len(result.gpus) < len(old_gpus):
            shrunk[job] = bound[-1]
    return bound, refused


def bind_typed(
    spec: FabricSpec,
    allocator: VClosAllocator,
    decisions: Iterable[Decision],
    gpu_types: Mapping[int, str],
    allowed: Mapping[str, frozenset[int]] | None = None,
) -> tuple[list[Bound], list[Refused]]:
    """:func:`bind` one GPU type at a time, so that every job's shape is of its own type.

    ``gpu_types``: each GPU's type (id -> type).  A decision belongs to the type of the
    GPUs its job holds, else of those the policy chose for it (a typed pass chooses
    them in one type's pool, :mod:`scheduler.gpu_types`).  While one type's decisions
    bind, the other types' GPUs are unavailable on the allocator (and available again
    after, whatever happens); the cables are one fabric's for every type, so no two
    jobs share a leaf-spine link, whatever their types.  ``allowed``: job -> the GPUs
    its node selector lets it hold; such a job's start or resize binds alone, after its
    type's other decisions, with every other GPU unavailable.  One type and no
    selecting job: :func:`bind` itself.
    """
    allowed = allowed or {}
    current = allocator.allocations()
    groups: dict[str, list[Decision]] = {}
    for decision in decisions:
        held = current.get(decision.job)
        ids = held.gpus if held is not None else getattr(decision, "gpus", ())
        groups.setdefault(gpu_types.get(ids[0], "") if ids else "", []).append(decision)
    if len(set(gpu_types.values())) <= 1 and not allowed:
        return bind(spec, allocator, [d for group in groups.values() for d in group])
    down = frozenset(allocator.unavailable_gpus())
    bound: list[Bound] = []
    refused: list[Refused] = []
    for name in sorted(groups):
        own = frozenset(g for g, t in gpu_types.items() if t == name)
        alone = [d for d in groups[name] if d.job in allowed and not isinstance(d, Preempt)]
        rest = [d for d in groups[name] if d not in alone]
        steps = [(own, rest)] + [(own & allowed[d.job], [d]) for d in alone]
        for keep, batch in steps:
            others = [g for g in gpu_types if g not in keep and g not in down]
            allocator.set_unavailable(others)
            try:
                done, failed = bind(spec, allocator, batch)
            finally:
                allocator.set_available(others)
            bound.extend(done)
            refused.extend(failed)
    return bound, refused
