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

With a :class:`~scheduler.packing.Packing` (jobs ask for CPU cores or host memory
per GPU, and servers' capacities are known), each asking job is placed with the
free GPUs its servers have no cores or memory left for hidden from the allocator
(:meth:`Packing.hidden`): a start, a migration and a scale-out alike never put a
GPU of it on a server whose cores or memory would go negative.  A scale-out that
does not fit whole grows as far as the servers allow; a start or a move that does
not fit waits with the resource named.  Without one, binding is as above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from fabric.allocator import Allocation, VClosAllocator
from fabric.errors import PlacementError
from fabric.topology import FabricSpec
from scheduler.packing import CPU, MEMORY, Packing
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
    fits: Callable[[], bool] | None = None,
) -> tuple[Allocation, list[Bound]] | None:
    """Place ``job`` (the first of ``sizes`` that fits) before the jobs shrunk this round.

    The shrunk jobs' current allocations are released, ``job`` gets a shape,
    and each shrunk job is placed again at its new size (:func:`_place_shrunk`).
    Returns ``job``'s allocation and the shrunk jobs' new bindings; None, with
    ``allocator`` as it was, when no size of ``job`` leaves room for all of them.
    ``job`` must hold nothing on ``allocator``.  ``fits``: asked once all are placed
    again, False refuses that size as if one of them fitted nowhere (CPU and memory
    packing: the shrunk jobs' new places must leave their servers' cores and memory).
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
        if len(again) == len(shrunk) and (fits is None or fits()):
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
    packing: Packing | None = None,
) -> tuple[list[Bound], list[Refused]]:
    """Place every decision on ``allocator`` (mutated: it ends in the bound state).

    Returns the decisions placed, in binding order, and those refused with
    the allocator's reason.  A start whose planned size finds no shape is
    placed on its base size when that fits (``Bound.planned`` says so).

    ``shrunk`` holds the jobs made smaller earlier in the same round, for a
    caller that binds a round one decision at a time (the simulator); bind
    adds this call's shrinks to it and keeps it current when
    :func:`reshape_around` moves one.  A shrunk job moved by this call is also
    replaced in the returned list.  ``packing``: the servers' CPU cores and
    memory and what each job asks of them (the module); None: GPUs alone.
    """
    current = dict(allocator.allocations())
    bound: list[Bound] = []
    refused: list[Refused] = []
    if shrunk is None:
        shrunk = {}
    # What the asking jobs take on each bounded server, kept as this call moves them.
    use = packing.used(_holdings(allocator)) if packing is not None else None
    for decision in _order(decisions, current):
        job = decision.job
        shrunk.pop(job, None)  # its new binding, below, is what a reshape would move
        old = current.get(job)
        old_gpus = old.gpus if old else ()
        size = _target_size(decision, current)
        if old is not None:
            allocator.release(job)
            if packing is not None and use is not None:
                packing.account(use, job, old_gpus, -1)
        if isinstance(decision, Preempt) or size == 0:
            bound.append(Bound(job, old_gpus, None))
            continue
        hidden: list[int] = []
        if packing is not None and use is not None and job in packing.requests:
            hidden = _hidden(spec, allocator, packing, use, job, old_gpus)
            allocator.set_unavailable(hidden)
        assert not isinstance(decision, Preempt)  # a preemption was bound above
        try:
            reshaped = _bind_one(
                spec, allocator, decision, old, size, shrunk, bound, refused, packing, hidden
            )
        finally:
            if hidden:
                allocator.set_available(hidden)
        if packing is not None and use is not None:
            if reshaped:  # the jobs shrunk earlier moved too: count everything again
                use = packing.used(_holdings(allocator))
            elif (held := allocator.allocations().get(job)) is not None:
                packing.account(use, job, held.gpus, 1)
    return bound, refused


def _bind_one(
    spec: FabricSpec,
    allocator: VClosAllocator,
    decision: Start | Scale | Migrate,
    old: Allocation | None,
    size: int,
    shrunk: dict[str, Bound],
    bound: list[Bound],
    refused: list[Refused],
    packing: Packing | None,
    hidden: Sequence[int],
) -> bool:
    """Place one start, resize or move of ``size`` GPUs (its old allocation released, the
    GPUs ``hidden`` for packing unavailable), and add it to ``bound`` or ``refused``:
    :func:`bind`'s body, one decision.  True when the jobs shrunk earlier were placed
    again around it (:func:`reshape_around`)."""
    job = decision.job
    old_gpus = old.gpus if old else ()
    keep = None
    if old is not None and not isinstance(decision, Migrate | Start):
        keep = _keep_in_place(spec, allocator, old, size)
    if keep is not None:
        allocation = _single_leaf(spec, job, keep)
        allocator.reserve(allocation)
        bound.append(Bound(job, old_gpus, allocation))
        if size < len(old_gpus):
            shrunk[job] = bound[-1]
        return False
    result = allocator.try_allocate(job, size)
    planned = 0
    around = None
    fallback = _fallback_size(decision, size)
    if isinstance(result, PlacementError) and fallback:
        result = allocator.try_allocate(job, fallback)
        planned = size
    if isinstance(result, PlacementError) and hidden and isinstance(decision, Scale):
        for smaller in range(size - 1, len(old_gpus), -1):  # grow as far as the servers allow
            result = allocator.try_allocate(job, smaller)
            if not isinstance(result, PlacementError):
                planned = size
                break
    if isinstance(result, PlacementError) and shrunk and isinstance(decision, Start):
        sizes = (size, fallback) if fallback else (size,)
        fits = _fits_check(allocator, packing) if packing is not None else None
        around = reshape_around(spec, allocator, job, sizes, list(shrunk.values()), fits)
        if around is not None:
            result, again = around
            planned = size if len(result.gpus) < size else 0
            for moved in again:
                shrunk[moved.job] = moved
                bound[:] = [moved if b.job == moved.job else b for b in bound]
    if isinstance(result, PlacementError):
        reason = result.reason
        if packing is not None and hidden:
            why = _packing_reason(spec, allocator, packing, job, fallback or size, hidden)
            reason = why or reason
        if old is not None:  # put the job back where it was
            allocator.reserve(old)
        refused.append(Refused(job, reason))
        return False
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
    return around is not None


def _holdings(allocator: VClosAllocator) -> dict[str, tuple[int, ...]]:
    return {job: a.gpus for job, a in allocator.allocations().items()}


def _free(spec: FabricSpec, allocator: VClosAllocator) -> list[int]:
    return [g for leaf in range(spec.leaves) for g in allocator.free_gpus_on_leaf(leaf)]


def _hidden(
    spec: FabricSpec,
    allocator: VClosAllocator,
    packing: Packing,
    use: Mapping[int, tuple[int, int]],
    job: str,
    keep: Sequence[int],
) -> list[int]:
    """The free GPUs ``job`` may not take now, beside ``use`` (:meth:`Packing.hide`; its own
    GPUs ``keep`` first kept).  Only the servers with room for fewer of its GPUs than they
    have are looked at (a handful on a cluster that is not short of cores), their free
    GPUs read once per leaf."""
    room = packing.room_in(use, packing.requests[job])
    per_server = spec.gpus_per_server
    tight = {server: limit for server, limit in room.items() if limit < per_server}
    if not tight:
        return []
    free_on_leaf: dict[int, tuple[int, ...]] = {}
    free: list[int] = []
    for server in tight:
        leaf = spec.leaf_of(server * per_server)
        if leaf not in free_on_leaf:
            free_on_leaf[leaf] = allocator.free_gpus_on_leaf(leaf)
        free.extend(g for g in free_on_leaf[leaf] if packing.server_of(g) == server)
    return packing.hide(tight, free, keep)


def _fits_check(allocator: VClosAllocator, packing: Packing) -> Callable[[], bool]:
    """A check that no server is overrun by more than it is now (for :func:`reshape_around`)."""
    before = packing.over(_holdings(allocator))
    return lambda: packing.over(_holdings(allocator)) <= before


def _packing_reason(
    spec: FabricSpec,
    allocator: VClosAllocator,
    packing: Packing,
    job: str,
    size: int,
    hidden: Sequence[int],
) -> str | None:
    """Why ``job`` (refused with the GPUs ``hidden`` unavailable) waits, when the CPU cores
    or memory are the cause: it would fit with them shown; None when the fabric refuses it
    anyway.  It leaves the allocator as it found it.
    """
    holdings = _holdings(allocator)
    allocator.set_available(hidden)
    try:
        if not _fits(allocator, job, size):
            return None
        for resource in (CPU, MEMORY):
            shown = _free(spec, allocator)
            only = packing.hidden_by(resource, job, holdings, shown)
            allocator.set_unavailable(only)
            try:
                short = not _fits(allocator, job, size)
            finally:
                allocator.set_available(only)
            if short:
                return packing.waits_for(job, resource, size)
        return packing.waits_for(job, CPU if packing.requests[job].cpus else MEMORY, size)
    finally:
        allocator.set_unavailable(hidden)


def _fits(allocator: VClosAllocator, job: str, size: int) -> bool:
    """Whether ``job`` would get ``size`` GPUs now (the allocator is left as it was)."""
    result = allocator.try_allocate(job, size)
    if isinstance(result, PlacementError):
        return False
    allocator.release(job)
    return True


def bind_typed(
    spec: FabricSpec,
    allocator: VClosAllocator,
    decisions: Iterable[Decision],
    gpu_types: Mapping[int, str],
    allowed: Mapping[str, frozenset[int]] | None = None,
    packing: Packing | None = None,
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
    selecting job: :func:`bind` itself.  ``packing``: :func:`bind`'s, for every type.
    """
    allowed = allowed or {}
    current = allocator.allocations()
    groups: dict[str, list[Decision]] = {}
    for decision in decisions:
        held = current.get(decision.job)
        ids = held.gpus if held is not None else getattr(decision, "gpus", ())
        groups.setdefault(gpu_types.get(ids[0], "") if ids else "", []).append(decision)
    if len(set(gpu_types.values())) <= 1 and not allowed:
        return bind(
            spec, allocator, [d for group in groups.values() for d in group], packing=packing
        )
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
                done, failed = bind(spec, allocator, batch, packing=packing)
            finally:
                allocator.set_available(others)
            bound.extend(done)
            refused.extend(failed)
    return bound, refused
