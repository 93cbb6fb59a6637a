"""vClos allocator: shapes, best-fit, reasons, release, restore, availability."""

from __future__ import annotations

import pytest

from fabric.allocator import Allocation, VClosAllocator, clos_shapes, find_biclique
from fabric.errors import AllocationConflictError, PlacementError, UnknownJobError
from fabric.topology import FabricSpec


def spec_2048() -> FabricSpec:
    return FabricSpec(leaves=64, spines=32, servers_per_leaf=8, gpus_per_server=4)


def test_shapes_follow_the_odd_part_rule() -> None:
    spec = spec_2048()
    assert clos_shapes(spec, 96) == [(3, 32), (6, 16), (12, 8), (24, 4), (48, 2)]
    assert clos_shapes(spec, 64)[0] == (2, 32)
    assert clos_shapes(spec, 40)[0] == (5, 8)
    assert clos_shapes(spec, 67) == []  # prime above the number of leaves


def test_single_leaf_best_fit_picks_the_fullest_leaf() -> None:
    alloc = VClosAllocator(spec_2048())
    alloc.allocate("a", 20)
    b = alloc.allocate("b", 8)
    assert b.leaves == (0,)  # leaf 0 has 12 free, the fullest that fits
    assert b.spines == () and b.links == () and dict(b.routes) == {}
    assert [g // 4 for g in b.gpus] == [5, 5, 5, 5, 6, 6, 6, 6]  # whole servers


def test_multi_leaf_allocation_is_a_consistent_clos() -> None:
    spec = spec_2048()
    alloc = VClosAllocator(spec)
    a = alloc.allocate("a", 96)
    assert len(a.leaves) == 3 and len(a.spines) == 32 and len(a.links) == 96
    assert list(a.gpus) == sorted(a.gpus)
    for leaf in a.leaves:
        assert sorted(a.routes[leaf]) == list(range(32))
        assert sorted(a.routes[leaf].values()) == list(range(32))


def test_reasons() -> None:
    spec = FabricSpec(leaves=3, spines=2, servers_per_leaf=1, gpus_per_server=2)
    alloc = VClosAllocator(spec)
    err = alloc.try_allocate("x", 7)
    assert isinstance(err, PlacementError) and err.code == "too_large"
    alloc.set_unavailable([0, 2])
    # 4 free GPUs but only leaf 2 has two free; 4 = 2x2 needs two such leaves.
    err = alloc.try_allocate("y", 4)
    assert isinstance(err, PlacementError) and err.code == "fragmentation"
    err = alloc.try_allocate("z", 6)
    assert isinstance(err, PlacementError) and err.code == "insufficient_gpus"
    with pytest.raises(PlacementError):
        alloc.allocate("z", 6)
    assert alloc.allocations() == {}


def test_no_links_when_free_gpus_share_no_free_uplink() -> None:
    spec = FabricSpec(leaves=3, spines=2, servers_per_leaf=2, gpus_per_server=1)
    alloc = VClosAllocator(spec)
    x = Allocation(job_id="x", gpus=(0, 2), leaves=(0, 1), uplinks=(0,))
    y = Allocation(job_id="y", gpus=(3, 5), leaves=(1, 2), uplinks=(1,))
    alloc.restore([x, y])
    # Leaf 0: GPU 1 free, uplink 1 free. Leaf 2: GPU 4 free, uplink 0 free.
    err = alloc.try_allocate("z", 2)
    assert isinstance(err, PlacementError) and err.code == "no_links"
    alloc.release("y")
    assert alloc.allocate("z", 2).leaves == (2,)  # leaf 2 is whole again: single leaf


def test_release_returns_what_was_taken_and_restore_rebuilds() -> None:
    spec = spec_2048()
    alloc = VClosAllocator(spec)
    a = alloc.allocate("a", 128)
    b = alloc.allocate("b", 24)
    before = alloc.free_gpu_count()
    assert alloc.release("a") == a
    assert alloc.free_gpu_count() == before + 128
    with pytest.raises(UnknownJobError):
        alloc.release("a")
    other = VClosAllocator(spec)
    other.restore([Allocation.from_dict(b.to_dict())])
    assert other.allocations()["b"] == b
    assert other.free_gpu_count() == alloc.free_gpu_count()
    with pytest.raises(AllocationConflictError):
        other.restore([b, Allocation(job_id="c", gpus=b.gpus[:1], leaves=b.leaves)])
    assert dict(other.allocations()) == {"b": b}


def test_unavailable_gpus_are_never_handed_out() -> None:
    spec = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)
    alloc = VClosAllocator(spec)
    alloc.set_unavailable(spec.gpus_of_server(0))
    assert alloc.free_gpu_count() == 6
    a = alloc.allocate("a", 4)
    assert set(a.gpus).isdisjoint({0, 1})
    assert not alloc.can_place(3)
    alloc.set_available([0, 1])
    assert alloc.can_place(3)


def test_duplicate_job_and_bad_size_are_value_errors() -> None:
    alloc = VClosAllocator(spec_2048())
    alloc.allocate("a", 1)
    with pytest.raises(ValueError, match="already"):
        alloc.allocate("a", 1)
    with pytest.raises(ValueError, match="positive"):
        alloc.allocate("b", 0)


def test_biclique_search_is_exact_on_a_hard_case() -> None:
    # Four leaves each missing a different plane among 0..3; three leaves x two planes exist
    # only as {leaf0, leaf1, leaf2} over planes missing none of them: planes 3,4.
    full = 0b11111
    masks = {i: full & ~(1 << i) for i in range(4)}
    found = find_biclique(masks, 3, 2, range(4))
    assert found is not None and found[0].bit_count() >= 2
    assert find_biclique(masks, 4, 2, range(4)) is None  # only plane 4 is common to all
    assert find_biclique({0: 0b011, 1: 0b110, 2: 0b101}, 2, 2, range(3)) is None


def test_restore_accepts_a_shrunk_vclos_and_plain_reservations() -> None:
    spec = spec_2048()
    alloc = VClosAllocator(spec)
    a = alloc.allocate("a", 96)
    survivors = Allocation(
        job_id="a",
        gpus=a.gpus[:40],  # lost every GPU of its last leaf and some of the second
        leaves=a.leaves,
        spines=a.spines,
        links=a.links,
        routes=a.routes,
        uplinks=a.uplinks,
    )
    plain = Allocation(job_id="p", gpus=(2000, 2040), leaves=(62,))  # spans leaves 62 and 63
    other = VClosAllocator(spec)
    other.restore([survivors, plain])
    assert other.free_gpu_count() == spec.total_gpus - 42
    for leaf in a.leaves:  # the cables stay reserved for the job
        assert not set(other.free_uplinks_on_leaf(leaf)) & set(a.uplinks)
    assert other.release("a") == survivors
    assert all(set(other.free_uplinks_on_leaf(leaf)) >= set(a.uplinks) for leaf in a.leaves)
    too_many = Allocation(job_id="t", gpus=a.gpus[:33], leaves=a.leaves, uplinks=a.uplinks[:1])
    with pytest.raises(AllocationConflictError):
        other.restore([too_many])


def test_search_agrees_with_the_cpsat_oracle() -> None:
    import random

    from fabric.oracle import OracleAllocator, solve_biclique_cpsat

    rng = random.Random(7)
    for _ in range(25):
        leaves, planes = rng.randint(2, 12), rng.randint(1, 8)
        density = rng.choice([0.4, 0.6, 0.8])
        masks = {
            leaf: sum(1 << p for p in range(planes) if rng.random() < density)
            for leaf in range(leaves)
        }
        m, n = rng.randint(1, leaves), rng.randint(1, planes)
        fast = find_biclique(masks, m, n, list(masks))
        exact = solve_biclique_cpsat(masks, m, n, planes, time_limit_s=10.0)
        assert (fast is None) == (exact is None), (masks, m, n)
    # The oracle-backed allocator makes the same kind of placements through the same API.
    spec = FabricSpec(leaves=4, spines=4, servers_per_leaf=2, gpus_per_server=2)
    for alloc in (VClosAllocator(spec), OracleAllocator(spec)):
        alloc.allocate("a", 3)
        b = alloc.allocate("b", 8)
        assert len(b.leaves) == 2 and len(b.uplinks) == 4


def test_reserve_adds_one_allocation_or_refuses_an_overlap() -> None:
    from fabric.errors import AllocationConflictError

    spec = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)
    allocator = VClosAllocator(spec)
    taken = allocator.allocate("a", 8)
    allocator.release("a")
    allocator.reserve(taken)
    assert allocator.free_gpu_count() == 0 and dict(allocator.allocations()) == {"a": taken}
    with pytest.raises(AllocationConflictError):
        allocator.reserve(taken)
    assert dict(allocator.allocations()) == {"a": taken}
