"""vClos binding within one GPU type (issue 38): on a fabric whose leaves mix types, every
job's shape is of its own type and no two jobs share a leaf-spine link, whatever their types."""

from __future__ import annotations

import random

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.binding import bind_typed
from scheduler.gpu_types import cluster_types
from scheduler.pipeline import (
    AllocatorBind,
    PolicyDecide,
    QuotaHoldBack,
    TypeHoldBack,
    snapshot_pass,
)
from scheduler.policies import get_policy
from scheduler.tests.builders import queued, snapshot
from scheduler.types import Cluster, Decision, Preempt, Start

#: 4 leaves x 2 servers x 2 GPUs; servers 0-2 are A100 (GPUs 0-5), 3-7 H100 (6-15):
#: leaf 1 holds one server of each type.
SPEC = FabricSpec(leaves=4, spines=2, servers_per_leaf=2, gpus_per_server=2)
CLUSTER = Cluster.mixed((("a100", 3), ("h100", 5)), 2, servers_per_leaf=2)
TYPES = {g.id: g.gpu_type for g in CLUSTER.gpus}
IDS = {name: [g for g, t in TYPES.items() if t == name] for name in cluster_types(CLUSTER)}


def _check(allocator: VClosAllocator, typed: dict[str, str]) -> None:
    cables: set[tuple[int, int]] = set()
    gpus: set[int] = set()
    for job, allocation in allocator.allocations().items():
        assert {TYPES[g] for g in allocation.gpus} == {typed[job]}, job
        assert not gpus & set(allocation.gpus)
        assert not cables & set(allocation.cables()), "two jobs share a link"
        gpus |= set(allocation.gpus)
        cables |= set(allocation.cables())
    assert allocator.unavailable_gpus() == ()  # the other types' GPUs came back


def test_random_starts_and_stops_bind_within_their_type_with_isolated_links() -> None:
    rng = random.Random(38)
    allocator = VClosAllocator(SPEC)
    typed: dict[str, str] = {}
    placed = crossed = 0
    for step in range(300):
        running = list(allocator.allocations())
        decisions: list[Decision] = []
        if running and rng.random() < 0.4:
            decisions.append(Preempt(rng.choice(running)))
        for k in range(rng.randint(1, 3)):
            name = rng.choice(sorted(IDS))
            size = rng.choice((1, 2, 4, 6, 8))
            job = f"j{step}-{k}"
            typed[job] = name
            decisions.append(Start(job, tuple(IDS[name][:size])))
        bound, _ = bind_typed(SPEC, allocator, decisions, TYPES)
        placed += sum(1 for b in bound if b.allocation is not None)
        crossed += sum(1 for b in bound if b.allocation is not None and b.allocation.cables())
        _check(allocator, typed)
    assert placed > 100 and crossed > 5  # many jobs placed, some across leaves


def test_an_h100_job_too_big_for_the_h100s_is_refused_though_a100s_are_free() -> None:
    allocator = VClosAllocator(SPEC)
    bound, refused = bind_typed(SPEC, allocator, [Start("h", tuple(IDS["h100"][:1]) * 12)], TYPES)
    assert bound == [] and [r.job for r in refused] == ["h"]
    assert allocator.allocations() == {} and allocator.unavailable_gpus() == ()


def test_the_pass_binds_each_job_on_its_type_through_the_allocator() -> None:
    allocator = VClosAllocator(SPEC)
    run = snapshot_pass(
        TypeHoldBack(QuotaHoldBack(None)),
        PolicyDecide(get_policy("tiresias")),
        AllocatorBind(SPEC, allocator, TYPES),
    )
    views = (
        queued("h", 8, gpu_types=("h100",)),
        queued("a", 4, submit=1, gpu_types=("a100",)),
        queued("x", 2, submit=2, gpu_types=("v100",)),
    )
    result = run.run(snapshot(0, CLUSTER, *views))
    _check(allocator, {"h": "h100", "a": "a100"})
    assert set(allocator.allocations()) == {"h", "a"}
    assert result.waits["x"] == "no server has GPUs of v100"


def test_a_selecting_job_binds_only_on_the_servers_its_selector_matches() -> None:
    # Servers 6 and 7 (GPUs 12-15, H100, leaf 3) carry rack=r4; the first H100 job fills
    # leaf 2 (GPUs 8-11), the selecting one must land on 12-15 whatever the allocator prefers.
    labels = {6: (("rack", "r4"),), 7: (("rack", "r4"),)}
    clu = Cluster(gpus=CLUSTER.gpus, server_labels=labels)
    allocator = VClosAllocator(SPEC)
    run = snapshot_pass(
        TypeHoldBack(QuotaHoldBack(None)),
        PolicyDecide(get_policy("fifo")),
        AllocatorBind(SPEC, allocator, TYPES),
    )
    views = (
        queued("s", 2, gpu_types=("h100",), selector=(("rack", "r4"),)),
        queued("h", 2, submit=1, gpu_types=("h100",)),
        queued("a", 2, submit=2, selector=(("rack", "r4"),)),
    )
    run.run(snapshot(0, clu, *views))
    allocations = allocator.allocations()
    assert set(allocations["s"].gpus) <= {12, 13, 14, 15}
    assert set(allocations["a"].gpus) <= {12, 13, 14, 15}
    assert {TYPES[g] for g in allocations["h"].gpus} == {"h100"}
    _check(allocator, {"s": "h100", "h": "h100", "a": "h100"})
