"""vClos isolation holds for every collective the simulator's traffic mix uses.

The allocator's docstring claims that ring, halving-doubling (any size),
hierarchical ring and all-to-all inside a job put at most one flow on a
directed link per step under the job's source routing. These tests check it
for many jobs at once, each with its own pattern, by the fabric's link
analysis; and that the same GPUs under ECMP hashing do share links (so the
check can fail).
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from fabric.allocator import Allocation, VClosAllocator
from fabric.contention import (
    MAX_DISTINCT_STEPS,
    _max_min_pairs,
    analyze,
    ecmp_slowdown,
    max_min_rates,
)
from fabric.routing import EcmpRouting, SourceRouting
from fabric.topology import FabricSpec
from fabric.traffic import Step, pattern_steps

MIX = ("ring", "hd", "hring", "a2a")


def _fill(spec: FabricSpec, seed: int) -> list[Allocation]:
    """Random vClos jobs (2 GPUs to three leaves' worth), 80 tries with some releases."""
    rng = random.Random(seed)
    alloc = VClosAllocator(spec)
    gpl = spec.gpus_per_leaf
    for k, z in enumerate((2 * gpl, 3 * gpl // 2, 3 * gpl // 4)):  # wide jobs first
        alloc.try_allocate(f"w{k}", z)
    for i in range(80):
        z = rng.randint(2, gpl) if i % 2 else rng.randint(gpl + 1, 3 * gpl)
        alloc.try_allocate(f"j{i}", z)
        if i % 10 == 9 and i < 70:  # some churn: free one of the random jobs
            alloc.release(rng.choice(sorted(j for j in alloc.allocations() if j[0] == "j")))
    return list(alloc.allocations().values())


def _steps(a: Allocation, pattern: str) -> list[Step]:
    return pattern_steps(pattern, a.gpus, 1.0, a.gpus_per_leaf)


def _merged(per_job: list[list[Step]]) -> list[Step]:
    """Step t of every job at once (shorter jobs repeat), as one step of all their flows."""
    runs = [s for s in per_job if s]
    longest = max((len(s) for s in runs), default=0)
    return [Step(tuple(f for s in runs for f in s[t % len(s)].flows)) for t in range(longest)]


SPECS = [
    FabricSpec(leaves=8, spines=8, servers_per_leaf=2, gpus_per_server=4),
    FabricSpec(leaves=6, spines=4, servers_per_leaf=2, gpus_per_server=4),  # 2 cables per pair
    FabricSpec(leaves=12, spines=12, servers_per_leaf=3, gpus_per_server=4),  # odd shapes (x3)
]


@pytest.mark.parametrize("spec", SPECS, ids=["8x8", "6x4", "12x12"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vclos_jobs_share_no_link_for_each_pattern_and_for_the_mix(
    spec: FabricSpec, seed: int
) -> None:
    allocs = _fill(spec, seed)
    assert sum(len(a.leaves) > 1 for a in allocs) >= 2  # the fabric is shared by wide jobs
    router = SourceRouting(spec, allocs)
    for pattern in MIX:
        merged = _merged([_steps(a, pattern) for a in allocs])
        report = analyze(spec, merged, router)
        assert report.max_flows <= 1, pattern
        assert report.slowdown == 1.0
    # Every job its own collective, several assignments.
    rng = random.Random(seed)
    for _ in range(5):
        mixed = _merged([_steps(a, rng.choice(MIX)) for a in allocs])
        assert analyze(spec, mixed, router).max_flows <= 1


def test_the_same_jobs_share_links_under_ecmp() -> None:
    spec = SPECS[0]
    allocs = _fill(spec, 0)
    ecmp = EcmpRouting(spec, seed=0)
    for pattern in ("hd", "a2a"):
        merged = _merged([_steps(a, pattern) for a in allocs])
        assert analyze(spec, merged, ecmp).max_flows > 1, pattern


def test_per_job_patterns_match_single_pattern_calls() -> None:
    spec = SPECS[0]
    scattered = [list(range(0, 64, 4)), list(range(1, 64, 4)), list(range(2, 64, 8))]
    for pattern in MIX:
        assert ecmp_slowdown(spec, scattered, [pattern] * 3, seed=1) == ecmp_slowdown(
            spec, scattered, pattern, seed=1
        )
    mixed = ecmp_slowdown(spec, scattered, ["ring", "a2a", "hd"], seed=1)
    assert len(mixed) == 3 and all(s >= 1.0 for s in mixed)
    with pytest.raises(ValueError, match="2 patterns for 3 jobs"):
        ecmp_slowdown(spec, scattered, ["ring", "hd"])
    with pytest.raises(ValueError, match="unknown pattern"):
        ecmp_slowdown(spec, scattered, ["ring", "hd", "mesh"])


def test_jobs_on_disjoint_leaves_do_not_affect_each_other() -> None:
    spec = SPECS[0]
    gpl = spec.gpus_per_leaf
    left = list(range(4 * gpl))  # leaves 0-3
    right = list(range(4 * gpl, 8 * gpl))  # leaves 4-7
    for pattern in MIX:
        alone_l = ecmp_slowdown(spec, [left], pattern, seed=2)[0]
        alone_r = ecmp_slowdown(spec, [right], pattern, seed=2)[0]
        assert ecmp_slowdown(spec, [left, right], pattern, seed=2) == (alone_l, alone_r)


def test_overlapping_jobs_slow_each_other_down() -> None:
    spec = SPECS[0]
    a = list(range(0, 64, 2))
    b = list(range(1, 64, 2))
    for pattern in ("ring", "a2a"):
        both = ecmp_slowdown(spec, [a, b], pattern, seed=1)
        alone = ecmp_slowdown(spec, [a], pattern, seed=1) + ecmp_slowdown(
            spec, [b], pattern, seed=1
        )
        assert all(x >= y for x, y in zip(both, alone, strict=True))
        assert sum(both) > sum(alone), pattern


def test_large_all_to_all_is_sampled_and_stays_deterministic() -> None:
    spec = FabricSpec(leaves=16, spines=16, servers_per_leaf=4, gpus_per_server=4)
    job = list(range(0, 256, 2))  # 128 ranks on 16 leaves: 127 shifts, 32 analysed
    assert len(pattern_steps("a2a", job, 1.0)) - 1 > MAX_DISTINCT_STEPS
    first = ecmp_slowdown(spec, [job], "a2a", seed=4)
    assert first == ecmp_slowdown(spec, [tuple(job)], "a2a", seed=4)
    assert first[0] > 1.0  # 128 flows hashed onto 16 leaves' uplinks collide


def test_every_pair_of_patterns_on_one_fabric_is_isolated_under_vclos() -> None:
    spec = SPECS[2]
    allocs = _fill(spec, 5)
    router = SourceRouting(spec, allocs)
    wide = [a for a in allocs if len(a.leaves) > 1][:2]
    assert len(wide) == 2
    for p, q in itertools.product(MIX, repeat=2):
        merged = _merged([_steps(wide[0], p), _steps(wide[1], q)])
        assert analyze(spec, merged, router).max_flows <= 1, (p, q)


def test_vectorised_max_min_matches_the_reference() -> None:
    rng = random.Random(7)
    for _ in range(200):
        nlinks = rng.randint(1, 12)
        flows = []
        for _ in range(rng.randint(1, 30)):
            a = rng.randrange(nlinks)
            b = rng.choice([-1, rng.randrange(nlinks)])
            flows.append((a, b if b != a else -1))
        ref = max_min_rates([tuple(x for x in f if x >= 0) for f in flows])
        fast = _max_min_pairs(
            np.array([f[0] for f in flows]), np.array([f[1] for f in flows]), nlinks
        )
        assert fast.tolist() == pytest.approx(ref, rel=1e-12)


def test_independent_problems_filled_side_by_side_match_each_alone() -> None:
    rng = random.Random(8)
    problems = []
    for _ in range(6):
        nlinks = rng.randint(1, 8)
        flows = [
            (rng.randrange(nlinks), rng.choice([-1, rng.randrange(nlinks)])) for _ in range(12)
        ]
        problems.append((nlinks, [(x, y if y != x else -1) for x, y in flows]))
    a: list[int] = []
    b: list[int] = []
    group: list[int] = []
    expected: list[float] = []
    base = 0
    for k, (nlinks, flows) in enumerate(problems):
        expected += max_min_rates([tuple(x for x in f if x >= 0) for f in flows])
        a += [x + base for x, _ in flows]
        b += [y + base if y >= 0 else -1 for _, y in flows]
        group += [k] * nlinks
        base += nlinks
    fast = _max_min_pairs(np.array(a), np.array(b), base, np.array(group))
    assert fast.tolist() == pytest.approx(expected, rel=1e-12)
