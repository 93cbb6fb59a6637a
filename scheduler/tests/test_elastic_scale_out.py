"""How far Elastic-Tiresias grows a job: bounded by its throughput curve, and by a multiple cap.

EDL's R2 gives idle GPUs to the largest marginal speedup "until no gain is
positive": ``--max-scale curve`` (``max_scale = 0``) leaves the curve as the
only bound; ``--max-scale K`` also caps a job at ``K`` x its request.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scheduler.cli import build_parser, main
from scheduler.policies import get_policy
from scheduler.policies.elastic import curve_limit
from scheduler.simulator import SimConfig, simulate
from scheduler.tests.builders import cluster, running, snapshot
from scheduler.throughput import get_model, throughput
from scheduler.traces import TraceJob
from scheduler.types import Scale

#: Rises to 5 GPUs, then flat: a sixth GPU gains nothing.
FLAT_AFTER_5 = {1: 100.0, 2: 190.0, 3: 270.0, 4: 330.0, 5: 360.0, 6: 360.0, 7: 360.0, 8: 360.0}


def test_curve_limit_stops_where_the_curve_flattens() -> None:
    assert curve_limit(FLAT_AFTER_5.__getitem__, 1, 8) == 5
    assert curve_limit(FLAT_AFTER_5.__getitem__, 3, 8) == 5
    assert curve_limit(FLAT_AFTER_5.__getitem__, 6, 8) == 6  # already past the peak: stays
    assert curve_limit(FLAT_AFTER_5.__getitem__, 1, 4) == 4  # the cluster binds first


def test_curve_limit_stops_at_a_dip_even_if_the_curve_rises_later() -> None:
    dip = {1: 1.0, 2: 2.0, 3: 1.5, 4: 5.0}
    assert curve_limit(dip.__getitem__, 1, 4) == 2


def test_a_running_job_grows_only_while_its_curve_rises() -> None:
    # 16 idle GPUs and a job allowed 16: it takes 5 and leaves the rest idle.
    clu = cluster(2, busy={0: "a"})
    view = running("a", (0,), throughput=FLAT_AFTER_5, max_gpus=16, remaining_work=1e5)
    decisions = get_policy("elastic-tiresias").schedule(snapshot(0, clu, view))
    assert len(decisions) == 1 and isinstance(decisions[0], Scale)
    assert len(decisions[0].gpus) == 5


def _alone(model: str, max_scale: float, total: int = 64) -> float:
    """JCT of one 1-GPU job of 1,000 s alone on an idle cluster."""
    trace = [TraceJob("a", 0.0, 1, 1000.0, model=model)]
    cfg = SimConfig(total_gpus=total, max_scale=max_scale)
    return simulate(trace, get_policy("elastic-tiresias"), cfg).jobs[0].jct


def _on(model: str, n: int) -> float:
    """JCT of that job on ``n`` GPUs from the start."""
    m = get_model(model)
    return 1000.0 * throughput(m, 1) / throughput(m, n)


@pytest.mark.parametrize("max_scale", [0.0, 16.0])
def test_curve_bound_stops_at_the_server_where_the_ring_would_slow_down(max_scale: float) -> None:
    # resnet50: the 9th GPU leaves the server and the ring loses more than compute gains
    assert _alone("resnet50", max_scale) == pytest.approx(_on("resnet50", 8), rel=1e-6)


def test_curve_bound_grows_past_the_server_while_throughput_rises() -> None:
    # inception3 keeps gaining up to 124 GPUs (throughput module); on 64 it takes them all
    m = get_model("inception3")
    peak = curve_limit(lambda n: throughput(m, n), 1, 1024)
    assert peak > 64
    assert _alone("inception3", 0.0) == pytest.approx(_on("inception3", 64), rel=1e-6)


@pytest.mark.parametrize("cap", [2, 4])
def test_a_multiple_cap_still_binds(cap: int) -> None:
    assert _alone("resnet50", float(cap)) == pytest.approx(_on("resnet50", cap), rel=1e-6)
    assert _alone("inception3", float(cap)) == pytest.approx(_on("inception3", cap), rel=1e-6)


def test_run_time_and_waiting_add_up_to_the_jct() -> None:
    trace = [TraceJob(f"j{i}", float(i), 2, 500.0, model="vgg16") for i in range(6)]
    res = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=4))
    s = res.summary
    assert s["avg_run_time"] == pytest.approx(500.0)
    assert s["avg_waiting"] == pytest.approx(s["avg_jct"] - 500.0, abs=1e-3)
    assert s["avg_waiting"] > 0


@pytest.mark.parametrize(
    ("text", "value"), [("curve", 0.0), ("CURVE", 0.0), ("0", 0.0), ("4", 4.0)]
)
def test_max_scale_option(text: str, value: float) -> None:
    args = build_parser().parse_args(
        ["simulate", "--servers", "1", "--gpus-per-server", "8", "--max-scale", text]
    )
    assert args.max_scale == value


@pytest.mark.parametrize("text", ["0.5", "-2", "nan", "inf", "twice", ""])
def test_bad_max_scale_is_a_one_line_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace-format", "edl-synthetic", "--servers", "4"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--gpus-per-server", "8", "--max-scale", text, "--json"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--max-scale" in err and len(err.splitlines()) == 1


def _cli_summary(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, float]:
    argv = ["simulate", "--trace-format", "poisson", "--jobs", "100", "--load", "0.3", "--servers"]
    assert main([*argv, "4", "--gpus-per-server", "8", "--policy", "elastic-tiresias", "--json",
                 *extra]) == 0  # fmt: skip
    out: dict[str, float] = json.loads(capsys.readouterr().out)
    return out


def test_the_command_lines_default_is_the_curve(capsys: pytest.CaptureFixture[str]) -> None:
    default = _cli_summary(capsys)
    assert default == _cli_summary(capsys, "--max-scale", "curve")
    assert default["avg_jct"] < _cli_summary(capsys, "--max-scale", "2")["avg_jct"]


def test_jobs_csv_splits_each_jct_into_run_time_and_waiting(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    argv = ["simulate", "--trace-format", "edl-synthetic", "--servers", "2", "--gpus-per-server"]
    assert main([*argv, "8", "--policy", "tiresias", "--json", "--jobs-csv", str(path)]) == 0
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 16
    assert all(0 < float(r["run_time"]) <= float(r["jct"]) + 1e-6 for r in rows)
    assert any(float(r["run_time"]) < float(r["jct"]) - 1 for r in rows)  # 16 GPUs, 64 asked
