"""Where a straggling worker can go: one free GPU that keeps the job's vClos shape (pure).

A job at its minimum cannot shrink around a straggler, but it can *move* that
one worker: the runtime's migration (scale-in and scale-out merged in one
communicator switch, no stop) takes the worker off GPU ``g`` and starts one on
``g'``.  The job's new GPU set must still be a shape the vClos allocator
allows, or the contention-free promise breaks::

    job on leaf 0 (no spine link)          a 2 x 2 vClos, cables (leaf, u0/u1) reserved
    leaf 0: [g0 g1 g2*] g3                 leaf 0: [g0 g1*] g2 g3   leaf 1: [g4 g5] g6 g7
    g2 slow → g3 (same leaf): allowed      g1 slow → g2 or g3 (same leaf, same slots and
    g2 slow → leaf 1: needs spine links    cables): allowed; → leaf 1 would put 3 GPUs
                 the job never reserved    behind 2 reserved cables: refused

Candidates, best first:

1. a free GPU under the straggler's own leaf: the job keeps its GPUs per leaf,
   its leaves and its cables, so its shape is unchanged;
2. for a job with reserved cables, a free GPU under another of its leaves where
   it holds fewer GPUs than its cables (a job that lost GPUs): a subset of its
   vClos, which the allocator accepts and which stays contention-free.

Within each, a GPU on a server the job already uses comes first (its traffic
stays on fewer servers and empty servers stay whole), then the lowest id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from types import MappingProxyType

from fabric.allocator import Allocation, VClosAllocator
from fabric.errors import AllocationConflictError
from fabric.topology import FabricSpec


def _with_routes(spec: FabricSpec, allocation: Allocation, gpus: tuple[int, ...]) -> Allocation:
    """``allocation`` on ``gpus`` (rank order), its source routes recomputed.

    Slot ``r`` of a leaf (the ``r``-th of the job's GPUs there, in rank order)
    leaves through uplink ``uplinks[r]``, as the allocator builds them.
    """
    routes: dict[int, MappingProxyType[int, int]] = {}
    if allocation.uplinks:
        per_leaf: dict[int, list[int]] = {}
        for gpu in gpus:
            per_leaf.setdefault(spec.leaf_of(gpu), []).append(gpu)
        for leaf, members in per_leaf.items():
            routes[leaf] = MappingProxyType(
                {
                    spec.port_of(gpu): spec.spine_of_uplink(allocation.uplinks[slot])
                    for slot, gpu in enumerate(members)
                }
            )
    return Allocation(
        job_id=allocation.job_id,
        gpus=gpus,
        leaves=allocation.leaves,
        spines=allocation.spines,
        links=allocation.links,
        routes=MappingProxyType(routes),
        uplinks=allocation.uplinks,
    )


def _moved(spec: FabricSpec, current: Allocation, gpu: int, target: int) -> tuple[int, ...]:
    """``current``'s GPUs in rank order with ``gpu`` replaced by ``target``.

    On the same leaf the newcomer takes the leaver's rank; on another leaf it
    comes after the job's last GPU there (ranks go leaf by leaf).
    """
    if spec.leaf_of(target) == spec.leaf_of(gpu):
        return tuple(target if g == gpu else g for g in current.gpus)
    rest = [g for g in current.gpus if g != gpu]
    leaf = spec.leaf_of(target)
    after = max((i for i, g in enumerate(rest) if spec.leaf_of(g) == leaf), default=-1)
    if after < 0:  # the job has no GPU left there: put it where its leaf comes in order
        order = list(current.leaves)
        after = max(
            (i for i, g in enumerate(rest) if order.index(spec.leaf_of(g)) < order.index(leaf)),
            default=-1,
        )
    return (*rest[: after + 1], target, *rest[after + 1 :])


def _candidates(
    spec: FabricSpec, allocator: VClosAllocator, current: Allocation, gpu: int
) -> list[int]:
    """Free GPUs a worker of ``current`` could move to, best first (see the module)."""
    own_leaf = spec.leaf_of(gpu)
    leaves = [own_leaf]
    if current.uplinks:
        count = Counter(spec.leaf_of(g) for g in current.gpus if g != gpu)
        leaves += [
            leaf
            for leaf in current.leaves
            if leaf != own_leaf and count[leaf] < len(current.uplinks)
        ]
    servers = {spec.server_of(g) for g in current.gpus if g != gpu}
    taken = set(current.gpus)
    found: list[int] = []
    for leaf in leaves:
        free = [g for g in allocator.free_gpus_on_leaf(leaf) if g not in taken]
        found += sorted(free, key=lambda g: (spec.server_of(g) not in servers, g))
    return found


def one_worker_move(
    spec: FabricSpec,
    allocator: VClosAllocator,
    current: Allocation,
    gpu: int,
    avoid: Collection[int] = (),
) -> Allocation | str:
    """``current`` with its worker on ``gpu`` moved to one free GPU of an allowed shape.

    ``allocator`` holds every active job (``current`` among them) and marks
    unavailable every GPU that may not take a new worker (down, draining,
    suspect); ``avoid`` adds more (the straggler's own GPU when no cool-down
    marks it).  It is left as it was.  Returns the new allocation, or why
    there is none, in words for the job's history.
    """
    if gpu not in current.gpus:
        return f"the job does not hold GPU {gpu}"
    blocked = set(avoid) | {gpu}
    allocator.release(current.job_id)
    try:
        for target in _candidates(spec, allocator, current, gpu):
            if target in blocked:
                continue
            moved = _with_routes(spec, current, _moved(spec, current, gpu, target))
            try:
                allocator.reserve(moved)
            except AllocationConflictError:
                continue
            allocator.release(moved.job_id)
            return moved
    finally:
        allocator.reserve(current)
    leaf = spec.leaf_of(gpu)
    if current.uplinks and len(current.leaves) > 1:
        where = f"leaves {list(current.leaves)} (its reserved cables)"
    else:
        where = f"leaf {leaf} (a move to another leaf would need spine links it never reserved)"
    return f"no free GPU of an allowed shape: none free under {where}"
