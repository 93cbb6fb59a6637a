"""The assembled snapshot carries what packing and per-type curves need (issue 38): each job's
CPU and memory per GPU, the servers' capacities, and each job's curve per GPU type where the
cluster's types differ in speed (pure: rows in, snapshot out)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from control import assembly
from control.assembly import JobRow, TenantRow, assemble_snapshot
from control.gpu_speeds import gpu_type_speeds
from fabric.topology import FabricSpec
from scheduler.packing import PerGpu, packing_for
from scheduler.throughput import curve_on_type, curves_by_type, type_speedup
from scheduler.types import Gpu as GpuView
from scheduler.types import ServerCapacity, TenantShare

SPEC = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=4)  # 16 GPUs
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
A100, H100 = "a100-40g", "h100-80g"
TENANTS = {1: TenantRow("acme", 16, False, 1.0)}


class Held:
    """The cluster as the assembly reads it: leaf 0 of A100s, leaf 1 of H100s."""

    def __init__(self) -> None:
        self.spec = SPEC
        self.holdings: dict[int, list[int]] = {}
        self.gpu_types = {g: A100 if g < 8 else H100 for g in range(SPEC.total_gpus)}
        self.server_labels: dict[int, tuple[tuple[str, str], ...]] = {}


@pytest.fixture(autouse=True)
def weights_without_usage(monkeypatch: Any) -> None:
    """Fair share's weights as they are (the usage would be read from the database)."""

    def shares(weights: Mapping[str, float], now: datetime) -> dict[str, TenantShare]:
        return {slug: TenantShare(weight, 0.0) for slug, weight in weights.items()}

    monkeypatch.setattr(assembly, "tenant_shares", shares)


def _row(job_id: int, **fields: Any) -> JobRow:
    values: dict[str, Any] = {
        "id": job_id,
        "state": "queued",
        "parallelism": 0,
        "tenant_id": 1,
        "submitted_at": NOW,
        "gpus": 2,
        "min_gpus": 1,
        "max_gpus": 4,
        "attained_gpu_seconds": 0.0,
        "priority": 50,
        "profiled": {},
        "measured": {},
        "profile_state": "",
    }
    values.update(fields)
    return JobRow(**values)


def _gpus(held: Held) -> tuple[GpuView, ...]:
    return tuple(
        GpuView(g, SPEC.server_of(g), SPEC.leaf_of(g), gpu_type=held.gpu_types[g])
        for g in range(SPEC.total_gpus)
    )


def test_views_carry_cpu_and_memory_and_the_cluster_its_servers_capacity() -> None:
    held = Held()
    rows = [_row(1, cpus_per_gpu=4, mem_per_gpu_mib=8192), _row(2)]
    capacity = {s: ServerCapacity(cpus=16, mem_mib=65536) for s in range(4)}
    view = assemble_snapshot(
        held, _gpus(held), rows, TENANTS, (), {}, NOW, server_capacity=capacity
    )
    asking, plain = view.snapshot.jobs
    assert (asking.cpus_per_gpu, asking.mem_per_gpu_mib) == (4, 8192)
    assert (plain.cpus_per_gpu, plain.mem_per_gpu_mib) == (0, 0)
    assert view.snapshot.cluster.server_capacity == capacity
    packing = packing_for(view.snapshot)
    assert packing is not None and packing.requests == {asking.id: PerGpu(4, 8192)}
    # Without capacities (a caller that passes none): nothing to pack by.
    bare = assemble_snapshot(held, _gpus(held), rows, TENANTS, (), {}, NOW)
    assert packing_for(bare.snapshot) is None


def test_curves_per_type_where_the_types_differ_in_speed() -> None:
    held = Held()
    measured = {1: 100.0, 2: 190.0, 4: 340.0}
    rows = [_row(1, measured=measured, ran_on_type=A100, workload="resnet50")]
    speeds = {H100: 2.0}
    view = assemble_snapshot(held, _gpus(held), rows, TENANTS, (), {}, NOW, type_speeds=speeds)
    [job] = view.snapshot.jobs
    assert job.throughput_by_type is not None
    on_a100, on_h100 = job.throughput_by_type[A100], job.throughput_by_type[H100]
    assert on_a100 == job.throughput  # measured there: its own curve
    for n in (1, 2, 4):
        assert on_h100[n] == pytest.approx(job.throughput[n] * type_speedup("resnet50", n, 4, 2.0))
    one, four = on_h100[1] / on_a100[1], on_h100[4] / on_a100[4]
    assert 1.9 < one <= 2.0  # one GPU: about the type's speed
    assert four < one  # more GPUs: communication, which the speed leaves alone, weighs more
    # One speed for both types (or none named): one curve serves, none per type.
    same = assemble_snapshot(held, _gpus(held), rows, TENANTS, (), {}, NOW, type_speeds={})
    assert same.snapshot.jobs[0].throughput_by_type is None
    even = {A100: 1.5, H100: 1.5}
    flat = assemble_snapshot(held, _gpus(held), rows, TENANTS, (), {}, NOW, type_speeds=even)
    assert flat.snapshot.jobs[0].throughput_by_type is None


def test_a_curve_measured_on_the_faster_type_is_slower_on_the_reference() -> None:
    curve = {1: 200.0, 2: 380.0}
    by_type = curves_by_type(curve, "bert", H100, {A100: 1.0, H100: 2.0}, 8)
    assert by_type is not None
    assert by_type[H100] is curve
    assert by_type[A100][1] == pytest.approx(100.0, rel=0.02)
    assert curve_on_type(curve, "bert", 2.0, 2.0) == curve


def test_gpu_type_speeds_come_from_the_setting(settings: Any) -> None:
    settings.GPU_TYPE_SPEEDS = f"{H100}:2, {A100}:1"
    assert dict(gpu_type_speeds()) == {H100: 2.0, A100: 1.0}
    settings.GPU_TYPE_SPEEDS = ""
    assert dict(gpu_type_speeds()) == {}
    settings.GPU_TYPE_SPEEDS = f"{H100}:0"
    with pytest.raises(ValueError, match="GPU_TYPE_SPEEDS"):
        gpu_type_speeds()
