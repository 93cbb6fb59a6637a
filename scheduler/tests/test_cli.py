"""The command line: outputs, reports and exit status 2 on bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.traces import shared_trace

TRACE = str(shared_trace("60_job.csv"))
BASE = ["--trace", TRACE, "--servers", "2", "--gpus-per-server", "8"]


def test_simulate_json_matches_the_paper_cell(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", *BASE, "--policy", "tiresias", "--queue-thresholds", "3250,7200",
                 "--tiresias-compat", "--duration-scale", "10", "--json"])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["avg_jct"] == pytest.approx(6700.25, abs=0.006)
    for key in ("jobs", "avg_jct", "median_jct", "p95_jct", "p99_jct", "avg_queueing_delay", "makespan",
                "gpu_utilization", "cluster_efficiency", "scale_events"):  # fmt: skip
        assert key in out


def test_compare_writes_a_self_contained_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.html"
    jobs_csv = tmp_path / "jobs.csv"
    series_csv = tmp_path / "series.csv"
    code = main(["compare", *BASE, "--policies", "fifo,tiresias,elastic-tiresias", "--report", str(report),
                 "--jobs-csv", str(jobs_csv), "--series-csv", str(series_csv)])  # fmt: skip
    assert code == 0
    text = report.read_text()
    assert re.search(r"<script[^>]*\bsrc=", text) is None  # plotly.js is embedded, no CDN
    assert "Plotly.newPlot" in text and len(text) > 1_000_000
    assert len(jobs_csv.read_text().splitlines()) == 1 + 3 * 60
    series = series_csv.read_text().splitlines()
    assert series[0] == "policy,t,busy_gpus,cluster_efficiency,queued,running" and len(series) > 10
    assert "elastic-tiresias" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["simulate", "--trace", "/nonexistent.csv", "--servers", "1", "--gpus-per-server", "4"],
            "cannot open",
        ),
        (["simulate", *BASE, "--servers", "3", "--leaves", "2"], "multiple of --leaves"),
        (["simulate", "--servers", "1", "--gpus-per-server", "4"], "--trace is required"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bad_thresholds_and_policy_exit_2() -> None:
    for extra in (["--queue-thresholds", "7200,3250"], ["--policy", "nope"], ["--servers", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(["simulate", *BASE, *extra])
        assert exc.value.code == 2


def test_fail_mode_rejects_jobs_larger_than_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = ["--trace", TRACE, "--servers", "1", "--gpus-per-server", "4"]
    assert main(["simulate", *small, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == {"larger than the cluster": 10}
    assert main(["simulate", *small, "--on-error", "fail"]) == 2
    assert "larger than the cluster" in capsys.readouterr().err


def test_module_runs_without_django() -> None:
    code = (
        "import sys, scheduler.cli, scheduler.simulator, scheduler.policies.elastic;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('django','celery','channels','torch')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": ""},
                          cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_fidelity_and_binder_are_chosen_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    vclos = ["--placement", "vclos", "--leaves", "2", "--json"]
    for extra in (["--fidelity", "live-tick"], ["--binder", "whole-start-shrinks-kept"]):
        assert main(["simulate", *BASE, *vclos, *extra]) == 0
        assert json.loads(capsys.readouterr().out)["jobs"] > 0
    for flag, name in (("--fidelity", "fast"), ("--binder", "shrinks-in-place")):
        with pytest.raises(SystemExit) as exc:
            main(["simulate", *BASE, flag, name])
        assert exc.value.code == 2
        assert f"unknown {flag[2:]} {name!r}; known:" in capsys.readouterr().err
