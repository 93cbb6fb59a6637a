"""CPU and memory packing in binding (issue 38): a job's GPUs on a server take its per-GPU
cores and memory there, and binding never overruns a server (pure: no database)."""

from __future__ import annotations

import random

import pytest

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.binding import bind, bind_typed
from scheduler.fabric_placement import VClosBinder
from scheduler.packing import Packing, PerGpu, packing_for
from scheduler.placement import ConsolidatedPlacement, FreeList
from scheduler.tests.builders import queued, snapshot
from scheduler.types import Cluster, Decision, Gpu, Migrate, Preempt, Scale, ServerCapacity, Start

GIB = 1024


def _spec(servers: int, gpus_per_server: int = 8, leaves: int = 1) -> FabricSpec:
    return FabricSpec(
        leaves=leaves,
        spines=max(1, servers * gpus_per_server // leaves),
        servers_per_leaf=servers // leaves,
        gpus_per_server=gpus_per_server,
    )


def _packing(
    spec: FabricSpec, capacity: ServerCapacity, asks: dict[str, PerGpu], servers: int = 0
) -> Packing:
    count = servers or spec.total_gpus // spec.gpus_per_server
    return Packing(
        capacity=dict.fromkeys(range(count), capacity),
        requests=asks,
        servers={g: spec.server_of(g) for g in range(spec.total_gpus)},
    )


def _servers(spec: FabricSpec, gpus: tuple[int, ...]) -> set[int]:
    return {spec.server_of(g) for g in gpus}


def test_a_16_core_server_holds_one_4_gpu_job_of_4_cores_a_gpu_and_refuses_a_second() -> None:
    spec = _spec(1)
    asks = {"a": PerGpu(cpus=4), "b": PerGpu(cpus=4)}
    packing = _packing(spec, ServerCapacity(cpus=16), asks)
    allocator = VClosAllocator(spec)
    bound, refused = bind(
        spec, allocator, [Start("a", (0,) * 4), Start("b", (0,) * 4)], packing=packing
    )
    assert [b.job for b in bound] == ["a"]
    assert [r.job for r in refused] == ["b"]
    assert "CPU cores" in refused[0].reason and "4 CPU cores" in refused[0].reason
    assert allocator.unavailable_gpus() == ()  # what binding hid is shown again
    # Without packing the same GPUs hold both (the control: the CPU is what refused b).
    _, unpacked = bind(spec, VClosAllocator(spec), [Start("a", (0,) * 4), Start("b", (0,) * 4)])
    assert unpacked == []


def test_two_cpu_heavy_jobs_land_on_different_servers() -> None:
    spec = _spec(2, gpus_per_server=8)
    asks = {"a": PerGpu(cpus=4), "b": PerGpu(cpus=4)}
    packing = _packing(spec, ServerCapacity(cpus=16), asks)
    decisions: list[Decision] = [Start("a", (0,) * 4), Start("b", (0,) * 4)]
    bound, refused = bind(spec, VClosAllocator(spec), decisions, packing=packing)
    assert refused == []
    a, b = (_servers(spec, x.new_gpus) for x in bound)
    assert len(a) == len(b) == 1 and a != b
    plain, _ = bind(spec, VClosAllocator(spec), decisions)
    assert _servers(spec, plain[0].new_gpus) == _servers(spec, plain[1].new_gpus)  # best fit


def test_elastic_scale_out_stops_at_the_cpu_limit() -> None:
    spec = _spec(1)
    packing = _packing(spec, ServerCapacity(cpus=24), {"a": PerGpu(cpus=4)})
    allocator = VClosAllocator(spec)
    bind(spec, allocator, [Start("a", (0,) * 2)], packing=packing)
    [grown], refused = bind(spec, allocator, [Scale("a", (0,) * 8)], packing=packing)
    assert refused == []
    assert len(grown.new_gpus) == 6 and grown.planned == 8  # 24 cores / 4 a GPU
    assert set(grown.old_gpus) <= set(grown.new_gpus)  # its workers stay where they are
    # At the limit, a further scale-out changes nothing: refused, the job as it was.
    _, again = bind(spec, allocator, [Scale("a", (0,) * 8)], packing=packing)
    assert [r.job for r in again] == ["a"]
    assert len(allocator.allocations()["a"].gpus) == 6


def test_memory_packs_like_cpu() -> None:
    spec = _spec(1)
    asks = {"a": PerGpu(mem_mib=16 * GIB), "b": PerGpu(mem_mib=16 * GIB)}
    packing = _packing(spec, ServerCapacity(cpus=64, mem_mib=96 * GIB), asks)
    allocator = VClosAllocator(spec)
    bound, refused = bind(
        spec, allocator, [Start("a", (0,) * 4), Start("b", (0,) * 4)], packing=packing
    )
    assert [b.job for b in bound] == ["a"]
    assert "host memory" in refused[0].reason and "16384 MiB" in refused[0].reason
    [grown], _ = bind(spec, allocator, [Scale("a", (0,) * 8)], packing=packing)
    assert len(grown.new_gpus) == 6  # 96 GiB / 16 GiB
    # A smaller start fits what memory is left: none (6 x 16 = 96); b's 2 GPUs wait.
    _, refused = bind(spec, allocator, [Start("b", (0,) * 2)], packing=packing)
    assert "host memory" in refused[0].reason


def test_a_job_asking_nothing_is_not_bounded_by_the_others_cpu() -> None:
    spec = _spec(1)
    packing = _packing(spec, ServerCapacity(cpus=16), {"a": PerGpu(cpus=4)})
    allocator = VClosAllocator(spec)
    bound, refused = bind(
        spec, allocator, [Start("a", (0,) * 4), Start("free", (0,) * 4)], packing=packing
    )
    assert refused == [] and len(bound) == 2


def test_a_migration_moves_only_to_a_server_with_cores_left() -> None:
    # Three servers of one leaf; a fills server 0's cores; c on server 1 moves (drain).
    spec = _spec(3, gpus_per_server=4)
    asks = {"a": PerGpu(cpus=4), "c": PerGpu(cpus=4)}
    packing = _packing(spec, ServerCapacity(cpus=8), asks)
    allocator = VClosAllocator(spec)
    bind(spec, allocator, [Start("a", (0,) * 2)], packing=packing)
    [c], _ = bind(spec, allocator, [Start("c", (0,) * 2)], packing=packing)
    assert _servers(spec, allocator.allocations()["a"].gpus) == {0}
    assert _servers(spec, c.new_gpus) == {1}
    allocator.set_unavailable(range(4, 8))  # server 1 drains
    [moved], refused = bind(spec, allocator, [Migrate("c", (0,) * 2)], packing=packing)
    assert refused == [] and _servers(spec, moved.new_gpus) == {2}  # server 0: no cores
    # Server 2 down too: the move is refused, c stays where it was, with the reason.
    allocator.set_unavailable(range(8, 12))
    _, refused = bind(spec, allocator, [Migrate("c", (0,) * 2)], packing=packing)
    assert "CPU cores" in refused[0].reason
    assert _servers(spec, allocator.allocations()["c"].gpus) == {2}


def test_a_preemption_frees_its_cores_for_a_start_in_the_same_round() -> None:
    spec = _spec(1)
    asks = {"a": PerGpu(cpus=4), "b": PerGpu(cpus=4)}
    packing = _packing(spec, ServerCapacity(cpus=16), asks)
    allocator = VClosAllocator(spec)
    bind(spec, allocator, [Start("a", (0,) * 4)], packing=packing)
    bound, refused = bind(spec, allocator, [Start("b", (0,) * 4), Preempt("a")], packing=packing)
    assert refused == [] and {b.job for b in bound} == {"a", "b"}


def test_no_request_binds_exactly_as_without_packing() -> None:
    """Random rounds on a two-leaf fabric: a packing whose jobs ask nothing (and one that is
    None) decide GPU for GPU what binding without it decides."""
    spec = _spec(4, gpus_per_server=4, leaves=2)
    rng = random.Random(38)
    plain, packed = VClosAllocator(spec), VClosAllocator(spec)
    packing = _packing(spec, ServerCapacity(cpus=8, mem_mib=GIB), {})
    for step in range(200):
        held = list(plain.allocations())
        decisions: list[Decision] = []
        rng.shuffle(held)
        if held and rng.random() < 0.4:
            decisions.append(Preempt(held.pop()))
        if held and rng.random() < 0.3:
            decisions.append(Scale(held.pop(), (0,) * rng.randint(1, 8)))
        decisions.append(Start(f"j{step}", (0,) * rng.randint(1, 8)))
        assert bind(spec, plain, decisions) == bind(spec, packed, decisions, packing=packing)
        assert plain.allocations() == packed.allocations()


def test_random_rounds_never_overrun_a_server() -> None:
    spec = _spec(4, gpus_per_server=4, leaves=2)
    rng = random.Random(7)
    allocator = VClosAllocator(spec)
    asks = {
        f"j{i}": PerGpu(cpus=rng.choice((0, 1, 2, 3)), mem_mib=rng.choice((0, GIB)))
        for i in range(300)
    }
    packing = _packing(spec, ServerCapacity(cpus=6, mem_mib=3 * GIB), asks)
    types = dict.fromkeys(range(spec.total_gpus), "")
    for step in range(300):
        held = list(allocator.allocations())
        decisions: list[Decision] = []
        rng.shuffle(held)
        if held and rng.random() < 0.3:
            decisions.append(Preempt(held.pop()))
        if held and rng.random() < 0.3:
            decisions.append(Scale(held.pop(), (0,) * rng.randint(1, 8)))
        decisions.append(Start(f"j{step}", (0,) * rng.randint(1, 4)))
        bind_typed(spec, allocator, decisions, types, packing=packing)
        holdings = {j: a.gpus for j, a in allocator.allocations().items()}
        assert packing.over(holdings) == frozenset(), step
        assert allocator.unavailable_gpus() == ()


def test_packing_for_is_none_unless_a_job_asks_and_a_server_is_bounded() -> None:
    gpus = tuple(Gpu(i, i // 4, 0) for i in range(8))
    bounded = Cluster(gpus=gpus, server_capacity={0: ServerCapacity(cpus=8)})
    unknown = Cluster(gpus=gpus, server_capacity={0: ServerCapacity()})
    asking = queued("a", 2, cpus_per_gpu=2)
    assert packing_for(snapshot(0, bounded, queued("b", 2))) is None
    assert packing_for(snapshot(0, unknown, asking)) is None
    packing = packing_for(snapshot(0, bounded, asking, queued("b", 2)))
    assert packing is not None
    assert packing.requests == {"a": PerGpu(cpus=2)}
    assert packing.room("a", {}) == {0: 4}


def test_server_capacity_refuses_bad_figures() -> None:
    with pytest.raises(ValueError, match="cpus"):
        ServerCapacity(cpus=-1)
    with pytest.raises(ValueError, match="mem_mib"):
        ServerCapacity(mem_mib=True)


def test_the_simulators_placers_pack_too() -> None:
    """The free-list placer and the vClos binder of the simulator: a second CPU-heavy job
    of 4 GPUs is refused on a 16-core server (exactly what is asked, or nothing), a job
    asking nothing is not, and a refused growth leaves the job as it was."""
    spec = _spec(1)
    asks = {"a": PerGpu(cpus=4), "b": PerGpu(cpus=4)}
    packing = _packing(spec, ServerCapacity(cpus=16), asks)
    gpus = Cluster.uniform(1, 8).gpus
    for placer in (
        FreeList(ConsolidatedPlacement(), gpus, packing=packing),
        VClosBinder(spec, packing=packing),
    ):
        placed = placer.place("a", 2)
        assert placed is not None and len(placed) == 2
        assert placer.place("a", 6) is None  # 6 x 4 > 16: refused whole
        assert placer.place("a", 4) is not None  # 4 x 4 = 16: fits
        assert placer.place("b", 4) is None
        assert placer.place("free", 4) is not None
    plain = FreeList(ConsolidatedPlacement(), gpus)
    assert plain.place("a", 4) is not None and plain.place("b", 4) is not None
