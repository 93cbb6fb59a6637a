"""Property tests: random fabrics, random arrivals/releases/outages, every invariant checked."""

from __future__ import annotations

import functools
import itertools
import operator
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fabric.allocator import Allocation, VClosAllocator, clos_shapes, find_biclique
from fabric.contention import analyze
from fabric.errors import PlacementError
from fabric.routing import SourceRouting
from fabric.topology import FabricSpec
from fabric.traffic import Step, halving_doubling, hierarchical_ring, ring_allreduce

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fabrics(draw: st.DrawFn) -> FabricSpec:
    servers = draw(st.integers(1, 4))
    gps = draw(st.integers(1, 4))
    gpl = servers * gps
    spines = draw(st.sampled_from([d for d in range(1, gpl + 1) if gpl % d == 0]))
    return FabricSpec(
        leaves=draw(st.integers(1, 7)), spines=spines, servers_per_leaf=servers, gpus_per_server=gps
    )


def shape_exists(alloc: VClosAllocator, z: int) -> bool:
    """Brute force: could any single leaf or m x n shape take z GPUs now?"""
    spec = alloc.spec
    gpl = spec.gpus_per_leaf
    free = {leaf: len(alloc.free_gpus_on_leaf(leaf)) for leaf in range(spec.leaves)}
    if z <= gpl and any(c >= z for c in free.values()):
        return True
    for m, n in clos_shapes(spec, z):
        leaves = [leaf for leaf in range(spec.leaves) if free[leaf] >= n]
        for combo in itertools.combinations(leaves, m):
            common = set(range(gpl))
            for leaf in combo:
                common &= set(alloc.free_uplinks_on_leaf(leaf))
            if len(common) >= n:
                return True
    return False


def check_invariants(alloc: VClosAllocator) -> None:
    spec = alloc.spec
    gpl = spec.gpus_per_leaf
    allocs = list(alloc.allocations().values())
    gpu_owner: Counter[int] = Counter(g for a in allocs for g in a.gpus)
    assert all(c == 1 for c in gpu_owner.values()), "a GPU is shared"
    cables: Counter[tuple[int, int]] = Counter(c for a in allocs for c in a.cables())
    assert all(c == 1 for c in cables.values()), "a leaf-spine cable is shared"
    down = set(alloc.unavailable_gpus())
    assert alloc.free_gpu_count() == spec.total_gpus - len(set(gpu_owner) | down)
    for a in allocs:
        per_leaf = Counter(g // gpl for g in a.gpus)
        assert sorted(per_leaf) == list(a.leaves)
        assert len(set(per_leaf.values())) == 1
        n = a.gpus_per_leaf
        assert list(a.gpus) == sorted(a.gpus)  # leaf by leaf, slot order within a leaf
        if len(a.leaves) > 1:
            assert len(a.uplinks) == n and n & (n - 1) == 0  # n is a power of two
            for leaf in a.leaves:
                ports = sorted(g % gpl for g in a.gpus if g // gpl == leaf)
                assert dict(a.routes[leaf]) == {
                    p: spec.spine_of_uplink(u) for p, u in zip(ports, a.uplinks, strict=True)
                }
            for leaf in a.leaves:
                assert not set(alloc.free_uplinks_on_leaf(leaf)) & set(a.uplinks)
        else:
            assert a.uplinks == () and a.links == ()
    # Contention-free: inside each job and for all jobs together, for ring, HD and
    # hierarchical ring, under the allocations' source routing.
    router = SourceRouting(spec, allocs)
    for make in (ring_allreduce, halving_doubling):
        together: list[list[Step]] = []
        for a in allocs:
            steps = make(a.gpus, 1.0)
            assert analyze(spec, steps, router).max_flows <= 1
            together.append(steps)
        longest = max((len(s) for s in together), default=0)
        merged = [
            Step(tuple(f for s in together if s for f in s[t % len(s)].flows))
            for t in range(longest)
        ]
        assert analyze(spec, merged, router).max_flows <= 1
    for a in allocs:
        assert analyze(spec, hierarchical_ring(a.gpus, 1.0, a.gpus_per_leaf), router).max_flows <= 1


ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 10_000)),
        st.tuples(st.just("arrive"), st.integers(0, 10_000)),
        st.tuples(st.just("release"), st.integers(0, 1000)),
        st.tuples(st.just("down"), st.integers(0, 10_000)),
        st.tuples(st.just("up"), st.integers(0, 10_000)),
    ),
    min_size=1,
    max_size=60,
)


@SETTINGS
@given(spec=fabrics(), seq=ops)
def test_random_churn_keeps_every_invariant(spec: FabricSpec, seq: list[tuple[str, int]]) -> None:
    alloc = VClosAllocator(spec)
    next_id = 0
    for op, arg in seq:
        if op == "arrive":
            # Half the sizes up to two leaves' worth, half up to the whole fabric.
            gpl = spec.gpus_per_leaf
            z = 1 + arg // 2 % (2 * gpl) if arg % 2 else 1 + arg // 2 % spec.total_gpus
            held = {g for a in alloc.allocations().values() for g in a.gpus} | set(
                alloc.unavailable_gpus()
            )
            before = alloc.free_gpu_count()
            possible = shape_exists(alloc, z)
            res = alloc.try_allocate(f"j{next_id}", z)
            next_id += 1
            event(
                "refused: " + res.code
                if isinstance(res, PlacementError)
                else ("placed on several leaves" if len(res.leaves) > 1 else "placed on one leaf")
            )
            if isinstance(res, PlacementError):
                assert not possible, f"refused {z} ({res.code}) but a shape exists"
                assert alloc.free_gpu_count() == before
                if res.code == "insufficient_gpus":
                    assert before < z
                if res.code in ("fragmentation", "no_links"):
                    assert before >= z
            else:
                assert possible
                assert len(res.gpus) == z
                assert not set(res.gpus) & held, "allocated a GPU that was not free"
                assert alloc.free_gpu_count() == before - z
        elif op == "release" and alloc.allocations():
            jobs = sorted(alloc.allocations())
            job = jobs[arg % len(jobs)]
            taken = alloc.allocations()[job]
            before = alloc.free_gpu_count()
            down = set(alloc.unavailable_gpus())
            assert alloc.release(job) == taken
            assert alloc.free_gpu_count() == before + len(set(taken.gpus) - down)
        elif op in ("down", "up"):
            gpu = arg % spec.total_gpus
            (alloc.set_unavailable if op == "down" else alloc.set_available)([gpu])
        check_invariants(alloc)
    # restore() from persisted dicts rebuilds the same state
    copy = VClosAllocator(spec)
    copy.restore([Allocation.from_dict(a.to_dict()) for a in alloc.allocations().values()])
    assert dict(copy.allocations()) == dict(alloc.allocations())
    assert [copy.free_uplinks_on_leaf(leaf) for leaf in range(spec.leaves)] == [
        alloc.free_uplinks_on_leaf(leaf) for leaf in range(spec.leaves)
    ]


@SETTINGS
@given(
    masks=st.lists(st.integers(0, 2**8 - 1), min_size=1, max_size=9),
    m=st.integers(1, 9),
    n=st.integers(1, 8),
)
def test_biclique_search_is_exact(masks: list[int], m: int, n: int) -> None:
    table = dict(enumerate(masks))
    found = find_biclique(table, m, n, list(table))
    brute = any(
        functools.reduce(operator.and_, (table[i] for i in combo)).bit_count() >= n
        for combo in itertools.combinations(table, m)
    )
    assert (found is not None) == brute
    if found is not None:
        common, count = found
        assert count >= m
        assert common.bit_count() >= n
        assert sum(1 for mk in masks if mk & common == common) >= m
