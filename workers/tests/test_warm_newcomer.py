"""Warm worker processes (``workers.elastic.warm``) and the start-up phase log.

A warm process has imported torch and built the workload before it knows its
job; handed a command line, it joins a running job as any newcomer does and
the job's result stays exactly the single-process reference.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.elastic import REPO, JobRun, check_samples, max_difference, reference_model
from workers.elastic import phases
from workers.elastic.sampler import ElasticSampler
from workers.elastic.warm import read_assignment

TOLERANCE = 1e-6


@pytest.fixture
def job(redis_url: str, tmp_path: Path) -> Iterator[JobRun]:
    run = JobRun(redis_url, f"t{uuid.uuid4().hex[:8]}", tmp_path)
    yield run
    run.terminate()
    run.control.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("build_ahead", [True, False])
def test_a_warm_newcomer_joins_and_the_model_is_exact(job: JobRun, build_ahead: bool) -> None:
    """2 -> 3 with a warm process: every phase logged in order, samples and model exact."""
    job.start_initial(2)
    job.start_warm("w2", build_ahead=build_ahead)
    job.wait_warm("w2")
    job.wait_step(10, timeout=300)
    assert job.procs["w2"].poll() is None, "a warm process waits for its assignment"
    job.assign("w2")
    grown = job.wait_event("scale_done", 90)
    assert grown["joiners"] == ["w2"] and grown["world"] == 3
    job.wait_step(grown["step"] + 5)
    seen = job.phases("w2")
    order = ["warm", "assigned", "registered", "communicator", "ready", "state_loaded"]
    order.append("first_batch")
    assert [p for p in sorted(seen, key=seen.__getitem__) if p in order] == order, seen
    assert "imported" not in seen, "a warm process imported before it was assigned"
    assert "prepared" in seen and seen["prepared"] >= seen["assigned"]
    cold = job.phases("w0")
    assert cold["python_up"] < cold["imported"] < cold["prepared"] < cold["first_batch"]

    stopped = job.stop_and_wait()
    codes = job.wait_exit()
    assert all(code == 0 for code in codes.values()), (codes, job.tail())
    sampler = ElasticSampler(1797, job.batch_size, job.args["seed"])
    check_samples(job.step_records(), sampler, stopped)
    expected = reference_model(job.args, job.batch_size, stopped)
    assert max_difference(job.final_model(), expected) < TOLERANCE


def run_warm(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "workers.elastic.warm", *args],
        input=stdin,
        cwd=REPO,
        capture_output=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )


def test_a_warm_process_whose_pipe_closes_exits_cleanly() -> None:
    assert run_warm(b"").returncode == 0


@pytest.mark.parametrize(
    "assignment, error",
    [
        (b"not json\n", "error"),
        (b'{"job": "x"}\n', "must be a JSON list"),
        (b'["--job", 3]\n', "must be a JSON list"),
        (json.dumps(["--job", "j", "--worker", "w"]).encode() + b"\n", "required"),
        (
            json.dumps(
                ["--job", "j", "--worker", "w", "--workload", "mlp-digits", "--batch-size", "0",
                 "--store-url", "/tmp/x", "--redis-url", "redis://127.0.0.1:1/0"]
            ).encode() + b"\n",
            "--batch-size must be >= 1",
        ),
    ],
)  # fmt: skip
def test_a_bad_assignment_is_refused_with_status_2(assignment: bytes, error: str) -> None:
    result = run_warm(assignment)
    assert result.returncode == 2, result.stderr.decode()
    assert error in result.stderr.decode()


def test_a_warm_process_refuses_bad_ahead_arguments() -> None:
    result = run_warm(b"", "--workload", "mlp-digits", "--args", '{"hidden": -1}')
    assert result.returncode == 2 and "cannot build mlp-digits ahead" in result.stderr.decode()


def test_read_assignment() -> None:
    assert read_assignment(io.StringIO('["--job", "j"]\n')) == ["--job", "j"]
    assert read_assignment(io.StringIO("")) is None
    assert read_assignment(io.StringIO("\n")) is None
    with pytest.raises(ValueError):
        read_assignment(io.StringIO("[1]\n"))


def test_phase_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "phases.jsonl"
    phases.mark("imported")  # no variable: nothing written anywhere
    monkeypatch.setenv(phases.PHASE_LOG_ENV, str(path))
    phases.mark("python_up")
    phases.mark("imported")
    phases.mark("python_up")  # a repeat keeps the first time
    times = phases.read(str(path))
    assert list(times) == ["python_up", "imported"] and times["python_up"] <= times["imported"]
    monkeypatch.setenv(phases.PHASE_LOG_ENV, str(tmp_path / "missing-dir" / "p.jsonl"))
    phases.mark("ready")  # an unwritable log never fails the worker
    assert phases.read(str(tmp_path / "none.jsonl")) == {}
