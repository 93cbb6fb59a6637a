"""Binding policy decisions to vClos allocations (pure: no database)."""

from __future__ import annotations

import pytest

from fabric.allocator import Allocation, VClosAllocator
from fabric.errors import PlacementError
from fabric.topology import FabricSpec
from scheduler.binding import bind
from scheduler.fabric_placement import VClosBinder
from scheduler.placement import CountPlacement
from scheduler.policies import get_policy
from scheduler.tests.builders import cluster, queued, running, snapshot
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


def _holding(job: str, gpus: tuple[int, ...]) -> Allocation:
    """GPUs ``job`` holds under one leaf (no cables), as a running job's row restores them."""
    leaf = SPEC.leaf_of(gpus[0])
    return Allocation(
        job_id=job, gpus=gpus, leaves=(leaf,), spines=(), links=(), routes={}, uplinks=()
    )


def _split_gap() -> VClosAllocator:
    """The 19:40 run at 138.8 s on its fabric: 3 GPUs free, 2 on leaf 0 and 1 on leaf 1.

    "a" holds GPUs 0-1 (leaf 0) and "b" GPUs 4-6 (leaf 1), each under its own leaf.
    """
    allocator = VClosAllocator(SPEC)
    allocator.restore([_holding("a", (0, 1)), _holding("b", (4, 5, 6))])
    assert allocator.free_gpus_on_leaf(0) == (2, 3) and allocator.free_gpus_on_leaf(1) == (7,)
    return allocator


def test_an_elastic_start_whose_extras_fit_no_shape_starts_on_its_base() -> None:
    # j14 at 138.8 s: planned on 3 (its 2 and an idle GPU as an extra); no 3-GPU shape
    # is free, but leaf 0's two free GPUs are a shape for its base.
    allocator = _split_gap()
    bound, refused = bind(SPEC, allocator, [Start("j14", (2, 3, 7), base=2)])
    assert refused == []
    [start] = bound
    assert start.new_gpus == (2, 3) and start.planned == 3
    assert start.allocation is not None and start.allocation.leaves == (0,)
    assert allocator.allocations()["j14"] == start.allocation  # the allocator holds the base
    assert allocator.free_gpus_on_leaf(1) == (7,)


def test_the_live_ticks_policy_and_binder_start_j14_on_its_base() -> None:
    # As the tick does: elastic-tiresias over a count placement, then bind.  j14 asks 2
    # (1 to 4) and its curve still rises, so the policy adds the idle third GPU.
    clu = cluster(4, 2, busy={0: "a", 1: "a", 4: "b", 5: "b", 6: "b"})
    rising = {1: 10.0, 2: 19.0, 3: 27.0, 4: 34.0}
    views = (
        running("a", (0, 1), remaining_work=1e4),
        running("b", (4, 5, 6), remaining_work=1e4),
        queued("j14", 2, submit=130.0, min_gpus=1, max_gpus=4, throughput=rising),
    )
    decisions = get_policy("elastic-tiresias").schedule(
        snapshot(138.8, clu, *views), placement=CountPlacement()
    )
    [start] = decisions
    assert isinstance(start, Start) and (len(start.gpus), start.base) == (3, 2)
    [bound], refused = bind(SPEC, _split_gap(), decisions)
    assert refused == [] and bound.new_gpus == (2, 3) and bound.planned == 3


def test_a_start_without_extras_has_no_base() -> None:
    clu = cluster(4, 2)
    [start] = get_policy("tiresias").schedule(snapshot(0.0, clu, queued("j", 3)))
    assert isinstance(start, Start) and (len(start.gpus), start.base) == (3, 0)


@pytest.mark.parametrize("base", [0, 3])
def test_a_start_without_a_smaller_base_is_refused_whole(base: int) -> None:
    allocator = _split_gap()
    before = dict(allocator.allocations())
    bound, refused = bind(SPEC, allocator, [Start("j14", (2, 3, 7), base=base)])
    assert bound == [] and [r.job for r in refused] == ["j14"]
    assert "3 GPUs are free in total but no shape" in refused[0].reason
    assert dict(allocator.allocations()) == before


def test_a_start_whose_base_fits_no_shape_either_is_refused_with_the_base_reason() -> None:
    # One GPU is free: neither the planned 3 nor the base 2 has a shape.
    allocator = _split_gap()
    allocator.reserve(_holding("c", (2, 3)))
    before = dict(allocator.allocations())
    base = allocator.try_allocate("probe", 2)
    assert isinstance(base, PlacementError)
    bound, refused = bind(SPEC, allocator, [Start("j", (2, 3, 7), base=2)])
    assert bound == [] and [r.job for r in refused] == ["j"]
    assert refused[0].reason == base.reason == "2 GPUs requested, 1 free"  # why its base waits
    assert dict(allocator.allocations()) == before


def test_a_resize_never_falls_back() -> None:
    # Only a Start has a base: a Scale that finds no shape keeps the job where it is.
    allocator = _split_gap()
    bound, refused = bind(SPEC, allocator, [Scale("a", (0, 1, 2, 3, 7))])
    assert bound == [] and [r.job for r in refused] == ["a"]
    assert allocator.allocations()["a"].gpus == (0, 1)


def _split_reclaim() -> VClosAllocator:
    """The 21:57 run at 231.7 s: j17 holds 2, 3 (leaf 0) and 7 (leaf 1), GPU 6 is suspect.

    j16 holds 4-5; GPUs 0-1 are free.  The policy shrinks j17 to 2 to start j18 on 3.
    """
    allocator = VClosAllocator(SPEC)
    allocator.restore([_holding("j16", (4, 5)), Allocation("j17", (2, 3, 7), (0, 1), (), (), {})])
    allocator.set_unavailable([6])
    return allocator


def test_a_reclaim_keeps_the_freed_gpus_where_the_waiting_job_fits() -> None:
    # Kept in place, j17 keeps 2-3 and frees 7: 0-1 and 7 are no shape for 3.  Asked
    # first, the allocator puts j18 under leaf 0 and j17 goes on across the leaves.
    allocator = _split_reclaim()
    bound, refused = bind(SPEC, allocator, [Scale("j17", (0, 0)), Start("j18", (0,) * 3)])
    assert refused == []
    shrink, start = bound
    assert shrink.job == "j17" and shrink.old_gpus == (2, 3, 7) and len(shrink.new_gpus) == 2
    assert start.job == "j18" and start.allocation is not None and start.allocation.leaves == (0,)
    assert not set(shrink.new_gpus) & set(start.new_gpus)
    assert 7 in shrink.new_gpus  # a worker of j17 stays where it was
    assert dict(allocator.allocations()) == {
        "j16": allocator.allocations()["j16"],
        "j17": shrink.allocation,
        "j18": start.allocation,
    }
    assert shrink.allocation is not None and len(shrink.allocation.cables()) == 2  # isolated


def test_a_reclaim_no_shape_serves_changes_nothing_but_the_shrink() -> None:
    # With GPU 7's leaf-mates all busy and no free plane, j18 still has no shape:
    # j17 shrinks in place as before and j18 is refused with the allocator's reason.
    allocator = _split_reclaim()
    allocator.set_unavailable([1])
    bound, refused = bind(SPEC, allocator, [Scale("j17", (0, 0)), Start("j18", (0,) * 3)])
    assert [b.job for b in bound] == ["j17"] and [r.job for r in refused] == ["j18"]
    assert bound[0].new_gpus == (2, 3)
    assert set(allocator.allocations()) == {"j16", "j17"}
    assert allocator.allocations()["j17"].gpus == (2, 3)


def test_the_simulators_binder_reshapes_within_a_pass_only() -> None:
    # The simulator binds one decision at a time: the pass's shrinks are remembered
    # until the next pass, so it finds what the live round finds, and no more.
    for new_pass, started in ((False, True), (True, False)):
        binder = VClosBinder(SPEC)
        binder.allocator = _split_reclaim()
        binder.begin_pass()
        assert binder.place("j17", 2) == (2, 3)
        if new_pass:
            binder.begin_pass()
        gpus = binder.place("j18", 3)
        assert (gpus is not None) is started
        if started:
            assert gpus is not None and {SPEC.leaf_of(g) for g in gpus} == {0}
            assert 7 in binder.allocator.allocations()["j17"].gpus


def test_the_simulators_binder_can_keep_every_shrink_in_place() -> None:
    # reshape=False: the binder the runs saved before 2026-12-04 were made with.
    binder = VClosBinder(SPEC, reshape=False)
    binder.allocator = _split_reclaim()
    binder.begin_pass()
    assert binder.place("j17", 2) == (2, 3)
    assert binder.place("j18", 3) is None
    assert binder.allocator.allocations()["j17"].gpus == (2, 3)
