"""The simulator's traffic mix: each job's collective by its model under ECMP (issue 17)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fabric.contention import ecmp_slowdown
from scheduler.cli import main
from scheduler.fabric_placement import (
    COLLECTIVES,
    MIX_MODELS,
    EcmpContention,
    collective_for,
    fabric_spec_for,
)
from scheduler.policies import get_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.throughput import MODEL_NAMES
from scheduler.traces import TraceJob, vclos_workload


def test_every_model_has_a_collective_and_the_mix_has_all_four() -> None:
    assert set(COLLECTIVES) == set(MODEL_NAMES)
    assert {collective_for(m, "mix") for m in MIX_MODELS} == {"ring", "hring", "hd", "a2a"}
    assert collective_for("moe", "mix") == "a2a"
    assert collective_for("moe", "ring") == "ring"  # ring traffic: everyone rings
    assert collective_for("no-such-model", "mix") == "ring"
    with pytest.raises(ValueError, match="unknown traffic"):
        collective_for("bert", "mesh")


def test_contention_uses_each_jobs_own_collective() -> None:
    spec = fabric_spec_for(64, 4, 4)
    a = tuple(range(0, 64, 2))
    b = tuple(range(1, 64, 2))
    model = EcmpContention(spec, seed=1)
    assert model.slowdowns([a, b]) == ecmp_slowdown(spec, [a, b], "ring", 1)
    assert model.slowdowns([a, b], ["a2a", "hd"]) == ecmp_slowdown(spec, [a, b], ["a2a", "hd"], 1)
    assert model.slowdowns([a, b], ["a2a", "a2a"]) != model.slowdowns([a, b])


def _run(trace: list[TraceJob], traffic: str, seed: int = 1) -> dict[str, Any]:
    spec = fabric_spec_for(64, 4, 4)
    cfg = SimConfig(
        total_gpus=64, gpus_per_server=4, placement="ecmp", fabric=spec, seed=seed, traffic=traffic
    )
    return simulate(trace, get_policy("fifo"), cfg).summary


def test_moe_jobs_slow_down_more_under_the_mix_than_under_ring() -> None:
    # Two all-to-all jobs spread over every leaf, at the same time.
    trace = [
        TraceJob("a", 0.0, 32, 1000.0, model="moe"),
        TraceJob("b", 0.0, 32, 1000.0, model="moe"),
    ]
    ring = _run(trace, "ring")
    mix = _run(trace, "mix")
    assert mix["mean_max_slowdown"] > ring["mean_max_slowdown"]
    assert mix["avg_jct"] > ring["avg_jct"]


def test_ring_traffic_is_the_default_and_changes_nothing() -> None:
    trace = list(vclos_workload(jobs=60, total_gpus=64, load=0.9, seed=2).jobs)
    spec = fabric_spec_for(64, 4, 4)
    default = SimConfig(total_gpus=64, gpus_per_server=4, placement="ecmp", fabric=spec, seed=2)
    plain = simulate(trace, get_policy("fifo"), default).summary
    assert plain == _run(trace, "ring", seed=2)
    assert plain != _run(trace, "mix", seed=2)  # bert and the resnets use other collectives


def test_unknown_traffic_fails_before_the_run() -> None:
    cfg = SimConfig(total_gpus=64, gpus_per_server=4, traffic="mesh")
    with pytest.raises(ValueError, match="unknown traffic"):
        simulate([TraceJob("a", 0.0, 4, 10.0)], get_policy("fifo"), cfg)


ARGV = ["simulate", "--trace-format", "vclos-synthetic", "--jobs", "60", "--load", "0.9",
        "--servers", "16", "--gpus-per-server", "4", "--leaves", "4", "--policy", "fifo",
        "--placement", "ecmp", "--seed", "3", "--json"]  # fmt: skip


def test_cli_traffic_mix_changes_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGV) == 0
    ring = json.loads(capsys.readouterr().out)
    assert main([*ARGV, "--traffic", "ring"]) == 0
    assert json.loads(capsys.readouterr().out) == ring  # ring is the default
    assert main([*ARGV, "--traffic", "mix"]) == 0
    mix = json.loads(capsys.readouterr().out)
    assert mix["jobs"] == ring["jobs"] == 60
    assert mix["avg_jct"] != ring["avg_jct"]


def test_the_mix_workload_has_moe_jobs() -> None:
    ring = vclos_workload(jobs=200, total_gpus=64, load=0.9, seed=3).jobs
    mix = vclos_workload(jobs=200, total_gpus=64, load=0.9, seed=3, models=MIX_MODELS).jobs
    assert "moe" not in {j.model for j in ring}
    assert {j.model for j in mix} == set(MIX_MODELS)


def test_cli_rejects_unknown_traffic(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*ARGV, "--traffic", "mesh"])
    assert exc.value.code == 2
    assert "--traffic" in capsys.readouterr().err


def test_ecmp_reports_each_jobs_slowdown_distribution() -> None:
    trace = list(vclos_workload(jobs=60, total_gpus=64, load=0.9, seed=3).jobs)
    s = _run(trace, "mix", seed=3)
    dist = s["job_slowdown"]
    assert 1.0 <= dist["p50"] <= dist["p95"] <= dist["max"]
    assert dist["max"] > 1.0 and dist["mean"] >= 1.0
    # Each job's average never exceeds the worst any job saw at any time.
    assert dist["max"] <= max(simulate_series(trace)["slowdown"])


def simulate_series(trace: list[TraceJob]) -> dict[str, list[float]]:
    spec = fabric_spec_for(64, 4, 4)
    cfg = SimConfig(
        total_gpus=64, gpus_per_server=4, placement="ecmp", fabric=spec, seed=3, traffic="mix",
        sample_every=0.0,
    )  # fmt: skip
    return simulate(trace, get_policy("fifo"), cfg).series


def test_elastic_growth_refused_for_want_of_a_shape_is_counted() -> None:
    spec = fabric_spec_for(64, 4, 4)
    trace = vclos_workload(
        jobs=80, total_gpus=64, load=0.7, sizes=(4, 8, 12), size_weights=(1, 1, 1), seed=4
    ).jobs
    out = {}
    for mode in ("vclos", "ecmp"):
        cfg = SimConfig(total_gpus=64, gpus_per_server=4, placement=mode, fabric=spec, seed=4)
        out[mode] = simulate(trace, get_policy("elastic-tiresias"), cfg).summary
    v, e = out["vclos"], out["ecmp"]
    assert 0 < v["grow_refused"] <= v["grow_requests"]
    assert e["grow_refused"] == 0 and e["start_extras_refused"] == 0  # any free GPUs do
    assert v["jobs"] == e["jobs"] == 80
    plain = SimConfig(total_gpus=64, gpus_per_server=4, placement="vclos", fabric=spec)
    assert "grow_refused" not in simulate(trace, get_policy("tiresias"), plain).summary
