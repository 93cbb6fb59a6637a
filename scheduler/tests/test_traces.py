"""Trace loaders: formats, filters, bad rows, seeded model assignment."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.throughput import MODEL_NAMES
from scheduler.traces import (
    TraceError,
    edl_synthetic,
    load_philly,
    load_tiresias,
    poisson_workload,
    shared_dir,
    shared_trace,
)


def test_shared_dir_honours_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PORTAL_SHARED_DIR", str(tmp_path))
    assert shared_dir() == tmp_path


def test_tiresias_trace_loads_sorted() -> None:
    trace = load_tiresias(shared_trace("60_job.csv"))
    assert len(trace.jobs) == 60 and trace.skipped_total == 0
    assert [j.submit for j in trace.jobs] == sorted(j.submit for j in trace.jobs)
    assert trace.jobs[0].model == "vgg19" and trace.jobs[0].duration == 164


def test_bad_rows_are_skipped_and_counted_or_fail(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("job_id,num_gpu,submit_time,duration\n1,1,0,10\n2,1,5,-3\n3,x,1,1\n4,64,2,5\n")
    trace = load_tiresias(p, max_gpus=16)
    assert [j.id for j in trace.jobs] == ["1"]
    assert trace.skipped == {
        "negative time": 1,
        "unparsable number": 1,
        "larger than the cluster": 1,
    }
    with pytest.raises(TraceError, match="negative time"):
        load_tiresias(p, on_error="fail")


def test_missing_columns_raise(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("job_id,num_gpu\n1,1\n")
    with pytest.raises(TraceError, match="missing column"):
        load_tiresias(p)
    with pytest.raises(TraceError, match="missing column"):
        load_philly(p)


def test_philly_filters_and_seeded_models(tmp_path: Path) -> None:
    p = tmp_path / "philly.csv"
    p.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-03 00:00:10,100.0,1,100.0,aa\n"
        "2017-10-02 00:00:00,50.0,2,100.0,aa\n"
        "2017-10-02 00:00:05,50.0,2,100.0,bb\n"
        "2017-10-09 00:00:00,50.0,2,100.0,aa\n"
        "2017-10-04 00:00:00,-5.0,2,100.0,aa\n\n"
    )
    trace = load_philly(p, start="2017-10-01", end="2017-10-08", vc="aa", seed=3)
    assert [j.submit for j in trace.jobs] == [0.0, 86410.0]
    assert trace.skipped == {"negative duration": 1}
    assert all(j.model in MODEL_NAMES for j in trace.jobs)
    again = load_philly(p, start="2017-10-01", end="2017-10-08", vc="aa", seed=3)
    assert [j.model for j in trace.jobs] == [j.model for j in again.jobs]


def test_whole_philly_row_count() -> None:
    trace = load_philly(shared_trace("philly.csv"))
    assert len(trace.jobs) == 82247 and trace.skipped_total == 0


def test_synthetic_workloads() -> None:
    edl = edl_synthetic(seed=1).jobs
    assert len(edl) == 16 and edl[-1].submit == 450 and {j.gpus for j in edl} == {4}
    poi = poisson_workload(jobs=200, total_gpus=64, load=0.5, seed=2).jobs
    assert (
        len(poi) == 200 and poi == poisson_workload(jobs=200, total_gpus=64, load=0.5, seed=2).jobs
    )
