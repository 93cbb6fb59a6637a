"""Where a straggling worker may go (``control.straggler_moves``): pure, on the allocator.

The demo fabric: 2 leaves of 4 GPUs (2 servers of 2), 2 spines::

    leaf 0: g0 g1 | g2 g3        leaf 1: g4 g5 | g6 g7
"""

from __future__ import annotations

import pytest

from control.straggler_moves import one_worker_move
from fabric.allocator import Allocation, VClosAllocator
from fabric.topology import FabricSpec

SPEC = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)


def state(allocator: VClosAllocator) -> tuple[object, ...]:
    """Everything a move must leave as it was."""
    allocations = {job: (a.gpus, a.leaves, a.uplinks) for job, a in allocator.allocations().items()}
    return (allocations, allocator.unavailable_gpus(), allocator.free_gpu_count())


def placed(allocator: VClosAllocator, job: str, gpus: int) -> Allocation:
    return allocator.allocate(job, gpus)


def test_a_worker_moves_to_a_free_gpu_of_its_own_leaf_and_keeps_the_others_ranks() -> None:
    allocator = VClosAllocator(SPEC)
    job = placed(allocator, "job-1", 3)
    assert job.gpus == (0, 1, 2) and job.uplinks == ()
    before = state(allocator)
    moved = one_worker_move(SPEC, allocator, job, 1)
    assert isinstance(moved, Allocation)
    assert moved.gpus == (0, 3, 2)  # the newcomer takes the leaver's rank
    assert moved.leaves == (0,) and moved.uplinks == () and not moved.routes
    assert state(allocator) == before  # the allocator is left as it was
    # The new shape is one the allocator accepts once the old one is gone.
    allocator.release("job-1")
    allocator.reserve(moved)


def test_a_gpu_on_a_server_the_job_uses_comes_first() -> None:
    allocator = VClosAllocator(SPEC)
    job = Allocation("job-1", (1, 2), (0,))  # one GPU on each server of leaf 0
    allocator.restore([job])
    moved = one_worker_move(SPEC, allocator, job, 2)
    assert isinstance(moved, Allocation)
    assert moved.gpus == (1, 0)  # g0 shares g1's server; g3 would open the other one again


def test_a_full_leaf_keeps_its_straggler_and_says_why() -> None:
    allocator = VClosAllocator(SPEC)
    job = placed(allocator, "job-1", 4)  # leaf 0, whole
    assert set(job.gpus) == {0, 1, 2, 3}
    before = state(allocator)
    why = one_worker_move(SPEC, allocator, job, 2)
    assert isinstance(why, str)
    assert "no free GPU of an allowed shape" in why and "leaf 0" in why
    assert "spine links" in why  # leaf 1 is free, but the job reserved no cable to reach it
    assert state(allocator) == before


def test_unavailable_and_avoided_gpus_are_never_the_target() -> None:
    allocator = VClosAllocator(SPEC)
    job = placed(allocator, "job-1", 2)
    assert job.gpus == (0, 1)
    allocator.set_unavailable([2])  # suspect, say
    moved = one_worker_move(SPEC, allocator, job, 1, avoid={3})
    assert isinstance(moved, str)
    assert one_worker_move(SPEC, allocator, job, 1) != moved  # without avoid: g3
    assert isinstance(one_worker_move(SPEC, allocator, job, 1), Allocation)


def two_by_two(allocator: VClosAllocator) -> Allocation:
    """A 4-GPU job forced across both leaves: 2 GPUs and 2 reserved cables on each."""
    allocator.set_unavailable([0, 1, 4, 5])
    job = placed(allocator, "job-1", 4)
    assert job.leaves == (0, 1) and len(job.uplinks) == 2, job
    return job


def test_a_vclos_worker_moves_within_its_leaf_on_the_same_cables() -> None:
    allocator = VClosAllocator(SPEC)
    job = two_by_two(allocator)
    slow = job.gpus[1]  # leaf 0
    allocator.set_available([0, 1])
    moved = one_worker_move(SPEC, allocator, job, slow)
    assert isinstance(moved, Allocation)
    (target,) = set(moved.gpus) - set(job.gpus)
    assert SPEC.leaf_of(target) == 0 and moved.gpus.index(target) == job.gpus.index(slow)
    assert moved.uplinks == job.uplinks and moved.cables() == job.cables()
    # Source routes follow the GPUs: the newcomer's port leaves by the leaver's uplink.
    assert moved.routes[0][SPEC.port_of(target)] == job.routes[0][SPEC.port_of(slow)]
    assert SPEC.port_of(slow) not in moved.routes[0]
    allocator.release("job-1")
    allocator.reserve(moved)


def test_a_vclos_that_lost_a_gpu_may_move_a_worker_to_its_other_leaf() -> None:
    allocator = VClosAllocator(SPEC)
    job = two_by_two(allocator)
    allocator.release("job-1")
    shrunk = Allocation(
        job.job_id, job.gpus[1:], job.leaves, job.spines, job.links, {}, job.uplinks
    )  # lost its first GPU (leaf 0): leaf 0 holds 1 of its 2 cables' worth
    allocator.restore([shrunk])
    allocator.set_available([0, 1, 4, 5])
    blocker = Allocation("job-2", (4, 5), (1,))  # leaf 1's other GPUs are taken
    allocator.reserve(blocker)
    slow = shrunk.gpus[-1]  # on leaf 1, which is full now
    moved = one_worker_move(SPEC, allocator, shrunk, slow)
    assert isinstance(moved, Allocation)
    (target,) = set(moved.gpus) - set(shrunk.gpus)
    assert SPEC.leaf_of(target) == 0 and moved.uplinks == shrunk.uplinks
    assert [SPEC.leaf_of(g) for g in moved.gpus] == [0, 0, 1]  # ranks stay leaf by leaf
    allocator.release("job-1")
    allocator.reserve(moved)


def test_a_full_vclos_never_puts_more_gpus_on_a_leaf_than_its_cables() -> None:
    allocator = VClosAllocator(SPEC)
    job = two_by_two(allocator)
    slow = job.gpus[0]  # leaf 0, whose other free GPUs are unavailable
    allocator.set_available([4, 5])  # free GPUs on leaf 1 only: 3 there would need 3 cables
    why = one_worker_move(SPEC, allocator, job, slow)
    assert isinstance(why, str) and "reserved cables" in why


@pytest.mark.parametrize("gpu", [5, 99])
def test_a_gpu_the_job_does_not_hold_is_refused(gpu: int) -> None:
    allocator = VClosAllocator(SPEC)
    job = placed(allocator, "job-1", 2)
    assert one_worker_move(SPEC, allocator, job, gpu) == f"the job does not hold GPU {gpu}"
