"""vClos versus ECMP placement on a small leaf-spine fabric, through the one simulator loop."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pytest

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.cli import main
from scheduler.fabric_placement import VClosPlacement, fabric_spec_for
from scheduler.policies import get_policy
from scheduler.simulator import SimConfig, SimResult, simulate
from scheduler.traces import TraceJob, vclos_workload
from scheduler.types import Cluster, GpuState, JobState, JobView, Preempt, Snapshot, Start


def simulate_fabric_trace(
    trace: Sequence[TraceJob], spec: FabricSpec, mode: str, policy: str = "fifo", **kw: object
) -> SimResult:
    """The vClos paper's FIFO runs (or another policy) on ``spec`` with placement ``mode``."""
    cfg = SimConfig(
        total_gpus=spec.total_gpus,
        gpus_per_server=spec.gpus_per_server,
        placement=mode,
        fabric=spec,
        **kw,  # type: ignore[arg-type]
    )
    return simulate(trace, get_policy(policy), cfg)


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
    # Every policy runs with fabric-aware placement now (it used to be FIFO only).
    assert main([*argv[:-3], "--policy", "elastic-tiresias", "--placement", "vclos", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "elastic-tiresias+vclos" and out["jobs"] == 40


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_cli_bad_placement_is_one_line_and_exit_2(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--trace-format", "poisson", "--servers", "2", "--gpus-per-server", "4"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--placement", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "nope" in err
    assert main([*argv, "--placement", "vclos", "--leaves", "3"]) == 2  # 2 servers on 3 leaves
    assert "leaves" in capsys.readouterr().err


def test_compare_runs_every_policy_on_a_fabric(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "--trace-format", "vclos-synthetic", "--jobs", "30", "--servers", "16",
            "--gpus-per-server", "4", "--leaves", "4", "--placement", "ecmp",
            "--policies", "fifo,srtf,tiresias,dlas,elastic-tiresias", "--json"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["policy"] for r in results] == [
        f"{p}+ecmp" for p in ("fifo", "srtf", "tiresias", "dlas", "elastic-tiresias")
    ]
    assert all(r["jobs"] == 30 and r["mean_max_slowdown"] >= 1.0 for r in results)
    assert main([*argv[:-1]]) == 0  # the human summary
    assert "mean worst slowdown" in capsys.readouterr().out


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


# The old fabric-only loop's figures (docs/results.md, section 4, load 0.5, seed 1):
# the shared loop reproduces them with FIFO.
FABRIC_GOLDEN = {"vclos": (2872.3932, 1.0), "ecmp": (3018.6435, 1.3682)}


@pytest.mark.parametrize("mode", list(FABRIC_GOLDEN))
def test_golden_fifo_on_a_fabric(mode: str) -> None:
    spec = fabric_spec_for(256, 4, 8)
    trace = vclos_workload(jobs=400, total_gpus=256, load=0.5, seed=1).jobs
    s = simulate_fabric_trace(trace, spec, mode, seed=1).summary
    assert (s["avg_jct"], s["mean_max_slowdown"]) == pytest.approx(FABRIC_GOLDEN[mode], rel=1e-6)


@pytest.mark.parametrize("policy", ["fifo", "srtf", "tiresias", "dlas", "elastic-tiresias"])
@pytest.mark.parametrize("mode", ["consolidated", "vclos", "ecmp"])
def test_every_policy_finishes_everything_with_every_placement(policy: str, mode: str) -> None:
    spec = fabric_spec_for(64, 4, 4)
    trace = vclos_workload(
        jobs=60, total_gpus=64, load=0.9, sizes=(4, 8, 12, 16), size_weights=(1, 1, 1, 1), seed=5
    ).jobs
    res = simulate_fabric_trace(trace, spec, mode, policy, sample_every=0.0)
    assert res.summary["jobs"] == 60 and res.summary["unfinished"] == 0
    assert res.summary["policy"] == f"{get_policy(policy).name}+{mode}"
    assert max(res.series["busy"]) <= 64
    if mode != "ecmp":
        assert set(res.series["slowdown"]) == {1.0}


def test_placement_by_count_is_the_default_and_adds_nothing() -> None:
    trace = vclos_workload(jobs=40, total_gpus=64, load=0.9, seed=2).jobs
    plain = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=64, gpus_per_server=4))
    packed = simulate_fabric_trace(trace, fabric_spec_for(64, 4, 4), "consolidated", "tiresias")
    assert plain.summary["policy"] == "tiresias" and "slowdown" not in plain.series
    # Without link contention, which GPUs a job gets changes nothing.
    assert [(j.id, j.start, j.end) for j in plain.jobs] == [
        (j.id, j.start, j.end) for j in packed.jobs
    ]


# Two leaves of 8 GPUs. "a" (7 GPUs) and "b" (6) leave 1 + 2 GPUs free: by count
# "c" (3) fits, but no vClos shape does (1 x 3 needs 3 on a leaf, 3 x 1 three leaves).
SHAPES = [
    TraceJob("a", 0.0, 7, 100.0, model="resnet50"),
    TraceJob("b", 0.0, 6, 100.0, model="resnet50"),
    TraceJob("c", 1.0, 3, 10.0, model="resnet50"),
    TraceJob("d", 2.0, 1, 10.0, model="resnet50"),
]


def test_a_refused_start_blocks_fifo_and_not_tiresias() -> None:
    spec = fabric_spec_for(16, 4, 2)
    count = {j.id: j.start for j in simulate_fabric_trace(SHAPES, spec, "consolidated").jobs}
    assert count["c"] == 1.0 and count["d"] == 11.0  # by count c fits (and fills the cluster)
    fifo = {j.id: j.start for j in simulate_fabric_trace(SHAPES, spec, "vclos").jobs}
    assert fifo["c"] == fifo["d"] == pytest.approx(100.0)  # head-of-line blocking
    las = {j.id: j.start for j in simulate_fabric_trace(SHAPES, spec, "vclos", "tiresias").jobs}
    assert las["c"] == pytest.approx(100.0) and las["d"] == 2.0  # first fit goes around it


def test_vclos_simulation_binds_through_the_production_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import scheduler.binding
    import scheduler.fabric_placement

    calls: list[str] = []
    real = scheduler.binding.bind

    def spy(spec, allocator, decisions, shrunk=None):  # type: ignore[no-untyped-def]
        decisions = list(decisions)
        calls.extend(type(d).__name__ for d in decisions)
        return real(spec, allocator, decisions, shrunk)

    monkeypatch.setattr(scheduler.fabric_placement, "bind", spy)
    simulate_fabric_trace(SHAPES, fabric_spec_for(16, 4, 2), "vclos", "tiresias")
    assert calls.count("Start") >= 4  # every start, refused ones included
