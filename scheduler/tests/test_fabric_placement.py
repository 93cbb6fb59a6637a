"""vClos versus ECMP placement on a small leaf-spine fabric."""

from __future__ import annotations

import json

import pytest

from scheduler.cli import main
from scheduler.fabric_placement import fabric_spec_for, simulate_fabric_trace
from scheduler.traces import TraceJob, vclos_workload


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
