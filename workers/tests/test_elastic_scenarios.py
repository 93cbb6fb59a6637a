"""Multi-process elastic training on the CPU (gloo) against a real Redis.

Each scenario runs real worker processes, changes the membership while they
train, stops the job gracefully, then checks that every step ran over exactly
its global batch (so each sample once per epoch) and that the final model
equals a single-process run of the same global batches.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.elastic import JobRun, check_samples, max_difference, reference_model
from workers.elastic.sampler import ElasticSampler
from workers.tests.conftest import JobDevice

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOLERANCE = 1e-6  # float64 workers: float32 runs diverge chaotically after ~1000 steps


@pytest.fixture
def job(redis_url: str, tmp_path: Path, job_device: JobDevice) -> Iterator[JobRun]:
    run = JobRun(
        redis_url,
        f"t{uuid.uuid4().hex[:8]}",
        tmp_path,
        device=job_device.device,
        comm=job_device.comm,
    )
    yield run
    run.terminate()
    run.control.cleanup()


def finish_and_check(job: JobRun, killed: bool = False) -> int:
    """Stop the job, then check samples and the model against the reference."""
    stopped = job.stop_and_wait()
    codes = job.wait_exit()
    assert all(code == 0 for w, code in codes.items() if code != -9), (codes, job.tail())
    sampler = ElasticSampler(1797, job.batch_size, job.args["seed"])
    check_samples(job.step_records(), sampler, stopped, killed)
    expected = reference_model(job.args, job.batch_size, stopped)
    assert max_difference(job.final_model(), expected) < TOLERANCE
    return stopped


def test_scale_out_scale_in_and_migration_in_one_job(job: JobRun) -> None:
    """2 -> 3 -> 4 by newcomers, 4 -> 2 removing the leader, then a migration 2 -> 2."""
    job.start_initial(2)
    job.wait_step(20)
    job.start("w2")
    first = job.wait_event("scale_done", 90)
    assert first["world"] == 3 and first["joiners"] == ["w2"]
    job.start("w3")
    second = job.wait_event("scale_done", 90)
    assert second["world"] == 4 and sorted(second["members"]) == ["w0", "w1", "w2", "w3"]
    job.wait_step(second["step"] + 10)

    leader = job.control.status().leader
    assert leader is not None
    other = next(w for w in ("w3", "w2") if w != leader)
    job.control.request_scale_in([leader, other], "test")
    shrunk = job.wait_event("scale_done", 60)
    assert shrunk["world"] == 2 and set(shrunk["leavers"]) == {leader, other}
    assert shrunk["new_leader"] in shrunk["members"]
    assert job.procs[leader].wait(timeout=30) == 0 and job.procs[other].wait(timeout=30) == 0
    job.wait_step(shrunk["step"] + 10)
    assert job.control.status().leader == shrunk["new_leader"]

    moving = next(w for w in shrunk["members"] if w != shrunk["new_leader"])
    job.control.request_migration([moving], "move", joiners=1)
    job.start("w4")
    moved = job.wait_event("scale_done", 90)
    assert moved["leavers"] == [moving] and moved["joiners"] == ["w4"] and moved["world"] == 2
    assert job.procs[moving].wait(timeout=30) == 0
    job.wait_step(moved["step"] + 10)
    finish_and_check(job)


def test_migration_that_moves_every_worker(job: JobRun) -> None:
    """2 -> 2 on other slots: nobody stays, so the leaving leader leaves the state in Redis."""
    job.start_initial(2)
    job.wait_step(20)
    job.control.request_migration(["w0", "w1"], "drain", joiners=2)
    job.start("w2")
    job.start("w3")
    moved = job.wait_event("scale_done", 90)
    assert sorted(moved["members"]) == ["w2", "w3"] and sorted(moved["leavers"]) == ["w0", "w1"]
    assert moved["new_leader"] in ("w2", "w3")
    assert job.procs["w0"].wait(timeout=30) == 0 and job.procs["w1"].wait(timeout=30) == 0
    job.wait_step(moved["step"] + 10)
    finish_and_check(job)


@pytest.mark.parametrize("mode", ["consistent", "approximate"])
def test_sigkill_of_a_worker_then_of_the_leader(job: JobRun, mode: str) -> None:
    job.recovery = mode
    job.start_initial(4)
    for round_ in range(2):
        job.wait_step(25 + 40 * round_)
        leader = job.control.status().leader
        assert leader is not None
        alive = [w for w, p in job.procs.items() if p.poll() is None]
        target = leader if round_ == 1 else next(w for w in reversed(alive) if w != leader)
        job.kill(target)
        failed = job.wait_event("worker_failed", 60)
        assert failed["worker"] == target
        recovered = job.wait_event("recovered", 60)
        assert recovered["mode"] == mode and recovered["world"] == 3 - round_
        if mode == "consistent":
            # the survivors went back to the checkpoint: a multiple of --checkpoint-every
            assert recovered["restored_step"] % job.checkpoint_every == 0
        job.wait_step(recovered["step"] + 10)
    assert job.control.status().leader not in (None, leader)
    finish_and_check(job, killed=True)


def test_a_frozen_then_a_killed_leader_are_noticed_in_seconds(job: JobRun) -> None:
    """Survivors notice a lost peer by its liveness key, not by the (60 s) sync timeout.

    A frozen worker (SIGSTOP: its connections stay open, as a hung node's do)
    and then a killed leader: every survivor abandons the all-reduce once the
    lost peer's key lapses (3 s) and recovers; the job trains on well before
    the sync timeout.
    """
    job.sync_timeout_s = 60.0
    job.start_initial(4)
    job.wait_step(25)
    leader = job.control.status().leader
    assert leader is not None
    frozen = next(w for w in ("w3", "w2") if w != leader)
    for victim, sig in ((frozen, signal.SIGSTOP), (leader, signal.SIGKILL)):
        t0 = time.monotonic()
        job.procs[victim].send_signal(sig)
        failed = job.wait_event("worker_failed", 20)
        recovered = job.wait_event("recovered", 20)
        job.wait_step(recovered["step"] + 1, 20)
        assert failed["worker"] == victim
        assert time.monotonic() - t0 < 12.0, "a survivor waited out the sync timeout"
    job.kill(frozen)
    assert job.procs[frozen].wait(timeout=10) == -signal.SIGKILL
    finish_and_check(job, killed=True)


def test_straggler_detected_and_removed(job: JobRun) -> None:
    job.extra += ["--drop-stragglers"]
    job.start_initial(3, extra={"w2": ["--slow-ms", "40"]})
    straggler = job.wait_event("straggler", 60)
    assert straggler["worker"] == "w2" and straggler["ratio"] > 1.2
    done = job.wait_event("scale_done", 60)
    assert done["leavers"] == ["w2"]
    assert job.procs["w2"].wait(timeout=30) == 0
    job.wait_step(done["step"] + 5)
    finish_and_check(job)


def test_profile_1_to_4(job: JobRun) -> None:
    job.start_initial(4)
    job.wait_step(10)
    job.control.request_profile(1, 4, batches_per_level=8)
    profile = job.wait_event("profile_done", 120)
    curve = {int(k): v for k, v in profile["curve"].items()}
    assert sorted(curve) == [1, 2, 3, 4] and all(v > 0 for v in curve.values())
    assert job.control.status().throughput_curve == curve
    finish_and_check(job)


def test_a_newcomer_the_job_finishes_without_exits_cleanly(job: JobRun) -> None:
    """The leader prepares the newcomer's generation, then the last step comes first.

    The members exit while the newcomer builds its group or waits for the state: a
    closed connection there is the job's end, not a failure (it crashed with code 1,
    2026-12-04 12:03). Started late enough that the switch cannot happen before the end
    (2 s of 100 ms steps left); a newcomer that registers after the end exits the same way.
    """
    job.args = {**job.args, "epochs": 2}  # 58 steps
    slow = ["--slow-ms", "100"]
    job.start_initial(2, extra={"w0": slow, "w1": slow})
    job.wait_step(38)
    job.start("late")
    codes = job.wait_exit(timeout=60)
    assert codes == {"w0": 0, "w1": 0, "late": 0}, job.tail()
    job.poll_events()
    assert not {e["kind"] for _id, e in job.events} & {"failed", "worker_failed"}
    assert "ended before this worker could join" in (job.workdir / "logs" / "late.out").read_text()


def test_a_worker_that_joins_a_job_that_ended_exits_cleanly(job: JobRun) -> None:
    """A scale-out decided just before the end: the newcomer leaves, nothing failed."""
    job.start_initial(2)
    job.wait_step(5)
    job.stop_and_wait()
    job.start("late")  # no world size: a newcomer, registering with a leader that is gone
    codes = job.wait_exit(timeout=30)
    assert codes["late"] == 0, job.tail()
    job.poll_events()
    assert not {e["kind"] for _id, e in job.events} & {"failed", "worker_failed"}
    assert "ended before this worker could join" in (job.workdir / "logs" / "late.out").read_text()
