"""Traffic patterns, routing and link-load analysis; the ECMP vs. vClos contrast."""

from __future__ import annotations

import pytest

from fabric.allocator import VClosAllocator
from fabric.collisions import measure
from fabric.contention import analyze, ecmp_slowdown, max_min_rates
from fabric.routing import EcmpRouting, LinkIds, SourceRouting
from fabric.topology import FabricSpec
from fabric.traffic import (
    Flow,
    Step,
    all_to_all,
    halving_doubling,
    hierarchical_ring,
    pipeline,
    ring_allreduce,
)

SPEC = FabricSpec(leaves=4, spines=16, servers_per_leaf=4, gpus_per_server=4)


def test_ring_moves_the_right_bytes() -> None:
    steps = ring_allreduce([5, 7, 9], 300.0)
    assert len(steps) == 4
    assert {(f.src, f.dst) for f in steps[0].flows} == {(5, 7), (7, 9), (9, 5)}
    assert all(f.nbytes == 100.0 for s in steps for f in s.flows)
    assert ring_allreduce([1], 1.0) == []


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 12])
def test_halving_doubling_pairs_and_extra_ranks(n: int) -> None:
    steps = halving_doubling(list(range(n)), 64.0)
    p = 1 << (n.bit_length() - 1)
    core = [s for s in steps if s.label.startswith(("reduce", "all"))]
    assert len(core) == 2 * (p.bit_length() - 1)
    for s in core:
        srcs = [f.src for f in s.flows]
        assert len(srcs) == len(set(srcs)) == p  # every core rank sends exactly once
        assert len({f.src ^ f.dst for f in s.flows}) == 1 and all(
            f.src < p and f.dst < p for f in s.flows
        )
    if n != p:
        assert steps[0].label == "pre-reduce" and {(f.src, f.dst) for f in steps[0].flows} == {
            (p + i, i) for i in range(n - p)
        }
        assert steps[-1].label == "post-broadcast"


def test_other_patterns_shapes() -> None:
    h = hierarchical_ring(list(range(8)), 8.0, 4)
    assert any("inter" in s.label for s in h)
    assert all(len({f.src for f in s.flows}) == len(s.flows) for s in h)
    a = all_to_all(list(range(4)), 4.0)
    assert len(a) == 3 and all(len(s.flows) == 4 for s in a)
    p = pipeline([0, 1, 2], 1.0, microbatches=2)
    assert [s.label for s in p] == ["forward", "backward"] * 2
    with pytest.raises(ValueError):
        hierarchical_ring(list(range(6)), 1.0, 4)


def test_max_min_fair_rates() -> None:
    # Two flows share link 1; a third flow alone on link 2 gets the full rate.
    assert max_min_rates([(1,), (1, 3), (2,)]) == [0.5, 0.5, 1.0]
    # Flow 0 bottlenecked at 1/3 on link 5; flow 3 then gets the rest of link 6.
    rates = max_min_rates([(5, 6), (5,), (5,), (6,)])
    assert rates[:3] == pytest.approx([1 / 3] * 3) and rates[3] == pytest.approx(2 / 3)


def test_analyze_reports_contended_links_and_slowdown() -> None:
    router = SourceRouting(SPEC)  # identity map: port i leaves on uplink i
    ids = LinkIds(SPEC)
    # GPU 0 and GPU 16 sit on port 0 of leaves 0 and 1: both use uplink 0 to leaf 2.
    step = Step((Flow(0, 32, 1.0), Flow(16, 33, 1.0)))
    report = analyze(SPEC, [step], router)
    assert report.max_flows == 2 and report.contended_steps == 1
    assert ids.describe(report.steps[0].contended[0]) == "spine0->leaf2:u0"
    assert report.slowdown == pytest.approx(2.0)


def test_ecmp_paths_are_deterministic_and_seeded() -> None:
    a, b = EcmpRouting(SPEC, seed=1), EcmpRouting(SPEC, seed=1)
    pairs = [
        (s, d)
        for s in range(0, 64, 3)
        for d in range(1, 64, 7)
        if SPEC.leaf_of(s) != SPEC.leaf_of(d)
    ]
    assert [a.path(s, d) for s, d in pairs] == [b.path(s, d) for s, d in pairs]
    other = EcmpRouting(SPEC, seed=2)
    assert [a.path(s, d) for s, d in pairs] != [other.path(s, d) for s, d in pairs]
    with pytest.raises(ValueError):
        EcmpRouting(SPEC, sport_range=(10, 5))


def test_ecmp_slowdown_for_the_simulator() -> None:
    alloc = VClosAllocator(SPEC)
    jobs = [list(alloc.allocate(f"j{i}", 32).gpus) for i in range(2)]
    ring = ecmp_slowdown(SPEC, jobs, "ring", seed=0)
    assert len(ring) == 2 and all(f >= 1.0 for f in ring)
    hd = ecmp_slowdown(SPEC, jobs, "hd", seed=0)
    assert max(hd) > 1.0  # hashing collides where vClos source routing does not
    assert ecmp_slowdown(SPEC, jobs, "hd", seed=0) == hd  # memoised, same answer
    scattered = [list(range(0, 64, 4)), list(range(1, 64, 4))]
    assert max(ecmp_slowdown(SPEC, scattered, "ring", seed=3)) > 1.0


# Numbers from docs/fabric.md (python -m fabric collisions, seed 0); the runs are deterministic.


def test_ecmp_collides_at_the_documented_rate_for_random_placement() -> None:
    stats = measure(SPEC, 16, 200, seed=0, placement="random", routing="ecmp", pattern="ring")
    assert stats.p_contention == pytest.approx(0.78, abs=0.03)
    assert stats.slowed_job_fraction == pytest.approx(0.511, abs=0.03)
    assert dict(stats.worst_link_hist) == {1: 44, 2: 148, 3: 8}


def test_same_vclos_jobs_collide_under_ecmp_but_not_under_source_routing() -> None:
    spec = FabricSpec(leaves=8, spines=16, servers_per_leaf=4, gpus_per_server=4)
    ecmp = measure(spec, 64, 30, seed=0, placement="vclos", routing="ecmp", pattern="hd")
    source = measure(spec, 64, 30, seed=0, placement="vclos", routing="source", pattern="hd")
    assert ecmp.jobs == source.jobs == 2
    assert ecmp.p_contention == 1.0 and ecmp.p_worst_at_least(4) > 0.5
    assert ecmp.mean_slowdown > 1.05
    assert source.p_contention == 0.0 and source.mean_slowdown == 1.0
    assert dict(source.worst_link_hist) == {1: 30}


def test_ecmp_slowdown_edge_cases() -> None:
    assert ecmp_slowdown(SPEC, [], "ring") == ()
    assert ecmp_slowdown(SPEC, [[3], []], "hring") == (1.0, 1.0)
    with pytest.raises(ValueError, match="unknown pattern"):
        ecmp_slowdown(SPEC, [[0, 20]], "butterfly")
    with pytest.raises(ValueError):
        ecmp_slowdown(SPEC, [[0, 99_999]], "ring")
