"""vClos versus ECMP placement on a small leaf-spine fabric."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fabric.allocator import VClosAllocator
from scheduler.cli import main
from scheduler.fabric_placement import VClosPlacement, fabric_spec_for, simulate_fabric_trace
from scheduler.policies import get_policy
from scheduler.traces import TraceJob, vclos_workload
from scheduler.types import Cluster, GpuState, JobState, JobView, Preempt, Snapshot, Start


def test_vclos_jobs_never_slow_down_and_ecmp_ones_may() -> None:
    spec = fabric_spec_for(64, 4, 4)
    trace = vclos_workload(
        jobs=60, total_gpus=64, load=0.9, sizes=(4, 8, 16), size_weights=(1, 1, 1), seed=3
    ).jobs
    vclos = simulate_fabric_trace(trace, spec, "vclos")
    ecmp = simulate_fabric_trace(trace, spec, "ecmp")
    assert vclos.summary["jobs"] == ecmp.summary["jobs"] == 60
    assert set(vclos.series["slowdown"]) == {1.0}
    assert max(ecmp.series["slowdown"]) > 1.0
    # An isolated job runs exactly its duration.
    assert all(j.end - j.start == pytest.approx(j.duration) for j in vclos.jobs)


def test_one_job_runs_its_duration_on_either_fabric() -> None:
    spec = fabric_spec_for(32, 4, 2)
    trace = [TraceJob("a", 0.0, 8, 100.0, model="vgg16")]
    for mode in ("vclos", "ecmp"):
        res = simulate_fabric_trace(trace, spec, mode)
        assert res.jobs[0].end == pytest.approx(100.0)


def test_cli_fabric_placement(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace-format", "vclos-synthetic", "--jobs", "40", "--load", "0.7",
            "--servers", "16", "--gpus-per-server", "4", "--leaves", "4", "--policy", "fifo", "--json"]  # fmt: skip
    assert main([*argv, "--placement", "vclos"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "fifo+vclos"
    assert main([*argv, "--placement", "ecmp"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "fifo+ecmp"
    assert main([*argv[:-3], "--policy", "tiresias", "--placement", "vclos"]) == 2


def test_vclos_placement_in_schedule_reserves_isolated_shapes() -> None:
    spec = fabric_spec_for(32, 4, 4)  # 4 leaves x 8 GPUs
    held = VClosAllocator(spec).allocate("old", 8)
    base = Cluster.uniform(8, 4, servers_per_leaf=2)
    gpus = tuple(
        replace(g, state=GpuState.BUSY, job="old") if g.id in held.gpus else g for g in base.gpus
    )
    cluster = Cluster(gpus=gpus, fabric_spec=spec, allocations=(held,))
    snap = Snapshot(
        now=0.0,
        cluster=cluster,
        jobs=(
            JobView(
                "old", 0.0, 8, gpus=tuple(held.gpus), state=JobState.RUNNING, attained_service=1.0
            ),
            JobView("a", 1.0, 16),
            JobView("b", 2.0, 8),
        ),
    )
    decisions = get_policy("fifo").schedule(snap, VClosPlacement.from_snapshot(snap))
    placed = {d.job: d.gpus for d in decisions}  # type: ignore[union-attr]
    assert set(placed) == {"a", "b"}
    assert not set(placed["a"]) & set(placed["b"]) and not set(placed["a"]) & set(held.gpus)
    leaves_a = {g // spec.gpus_per_leaf for g in placed["a"]}
    assert len(leaves_a) * (16 // len(leaves_a)) == 16  # an m x n shape: same GPUs on every leaf


def test_vclos_placement_reuses_a_preempted_jobs_shape() -> None:
    spec = fabric_spec_for(16, 4, 2)  # 2 leaves x 8 GPUs
    held = VClosAllocator(spec).allocate("old", 8)
    base = Cluster.uniform(4, 4, servers_per_leaf=2)
    gpus = tuple(
        replace(g, state=GpuState.BUSY, job="old") if g.id in held.gpus else g for g in base.gpus
    )
    snap = Snapshot(
        now=0.0,
        cluster=Cluster(gpus=gpus, fabric_spec=spec, allocations=(held,)),
        jobs=(
            JobView(
                "old",
                0.0,
                8,
                gpus=tuple(held.gpus),
                state=JobState.RUNNING,
                attained_service=4000.0,
            ),
            JobView("new", 1.0, 16),
        ),
    )
    decisions = get_policy("tiresias").schedule(snap, VClosPlacement.from_snapshot(snap))
    assert decisions == [Preempt("old"), Start("new", tuple(range(16)))]
