"""The Philly mapping of the vClos studies: multi-GPU jobs only, sizes scaled (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.traces import TraceError, load_philly

ROWS = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:00:00,100.0,1,100.0,a
2017-10-09 07:00:10,200.0,2,400.0,a
2017-10-09 07:00:20,300.0,8,2400.0,b
2017-10-09 07:00:30,400.0,128,51200.0,b
"""


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "philly.csv"
    path.write_text(ROWS)
    return path


def test_min_gpus_keeps_multi_gpu_jobs_and_scale_multiplies(trace: Path) -> None:
    plain = load_philly(trace)
    assert [j.gpus for j in plain.jobs] == [1, 2, 8, 128]
    multi = load_philly(trace, min_gpus=2, gpu_scale=4)
    assert [j.gpus for j in multi.jobs] == [8, 32, 512]
    assert multi.skipped == {}  # a filter, not a bad row
    assert multi.jobs[0].submit == 0.0  # times start at the first kept job
    capped = load_philly(trace, min_gpus=2, gpu_scale=4, max_gpus=256)
    assert [j.gpus for j in capped.jobs] == [8, 32]
    assert capped.skipped == {"larger than the cluster": 1}


@pytest.mark.parametrize(("low", "scale"), [(0, 1), (1, 0), (2, -2)])
def test_bad_mapping_is_refused(trace: Path, low: int, scale: int) -> None:
    with pytest.raises(TraceError, match="at least 1"):
        load_philly(trace, min_gpus=low, gpu_scale=scale)


def test_cli_mapping(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(trace), "--trace-format", "philly", "--servers", "64",
            "--gpus-per-server", "8", "--policy", "tiresias", "--json"]  # fmt: skip
    assert main([*argv, "--min-gpus", "2", "--gpu-scale", "4"]) == 0
    assert '"jobs": 3' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv, "--gpu-scale", "0"])
    assert "--gpu-scale" in capsys.readouterr().err
