"""Binding policy decisions to vClos allocations (pure: no database)."""

from __future__ import annotations

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.binding import bind
from scheduler.types import Preempt, Scale, Start

SPEC = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)


def test_start_shrink_grow_preempt_keep_workers_in_place() -> None:
    allocator = VClosAllocator(SPEC)
    bound, refused = bind(SPEC, allocator, [Start("a", (0, 1)), Start("b", (0,) * 8)])
    assert [b.job for b in bound] == ["a"] and refused[0].job == "b"  # 8 more do not fit
    a = bound[0].new_gpus
    # Growing under the same leaf keeps the two running workers where they are.
    [grow] = bind(SPEC, allocator, [Scale("a", (0,) * 4)])[0]
    assert grow.new_gpus[:2] == a and len({SPEC.leaf_of(g) for g in grow.new_gpus}) == 1
    # Shrinking keeps a prefix; preempting frees everything.
    [shrink] = bind(SPEC, allocator, [Scale("a", (0,))])[0]
    assert shrink.new_gpus == a[:1]
    [gone] = bind(SPEC, allocator, [Preempt("a")])[0]
    assert gone.new_gpus == () and allocator.free_gpu_count() == 8


def test_cross_leaf_job_gets_cables_and_shrinks_onto_one_leaf() -> None:
    allocator = VClosAllocator(SPEC)
    [big], _ = bind(SPEC, allocator, [Start("big", (0,) * 8)])
    assert big.allocation is not None and len(big.allocation.cables()) == 8
    [small], _ = bind(SPEC, allocator, [Scale("big", (0,) * 3)])
    assert small.allocation is not None and small.allocation.cables() == ()
    assert len({SPEC.leaf_of(g) for g in small.new_gpus}) == 1
    assert set(small.new_gpus) <= set(big.new_gpus)


def test_refused_resize_leaves_the_job_where_it_was() -> None:
    allocator = VClosAllocator(SPEC)
    bind(SPEC, allocator, [Start("a", (0,) * 4), Start("b", (0,) * 4)])
    before = dict(allocator.allocations())
    bound, refused = bind(SPEC, allocator, [Scale("a", (0,) * 6)])
    assert bound == [] and refused[0].job == "a"
    assert dict(allocator.allocations()) == before
