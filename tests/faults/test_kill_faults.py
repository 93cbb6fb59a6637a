"""SIGKILL each process of a running stack, restart its Redis: every job still finishes right.

One stack (``runstack`` on a Redis server of the module's own) takes the faults
in turn, each while tiny jobs train:

    training worker  SIGKILL one worker of a job     the runtime recovers, the job goes on
    leader worker    SIGKILL the leader of a job     a new leader, the job goes on
    agent            SIGKILL the node agent          runstack restarts it; its job finishes
    Celery worker    SIGKILL its main process while  runstack restarts it; the next tick
                     a tick holds the tick lock      repairs what the killed one left
    beat             SIGKILL celery beat             runstack restarts it; ticks go on
    Redis            restart the server              the append-only file keeps the queues

After each: every job completed, each step committed once over its own batch
(the step logs), the final model equals one process trained over the same
batches, no GPU row is left, and the monitor never saw a GPU held twice or by
a job with no process for longer than the reconcile allowance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.faults.processes import sigkill, training_processes, wait_for_replacement
from tests.faults.services import RedisServer
from tests.faults.stack import (
    ALLOWANCES,
    REDIS_DB,
    FaultStack,
    boot,
    stack_env,
    throwaway_database,
)
from tests.faults.steplog import attempts_after, read_step_logs

pytestmark = [pytest.mark.stack, pytest.mark.slow]
LONG_EPOCHS = 150
TICK_RECOVERY_S = 30  # a restarted Celery worker boots, then ticks within a second
TICK_LOCK_KEY = "portal:scheduler-tick"  # control.tick.LOCK_KEY, held while a tick runs


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, own_redis: RedisServer) -> Iterator[FaultStack]:
    root = Path(tmp_path_factory.mktemp("kill-stack"))
    with throwaway_database() as database_url:
        env = stack_env(root, redis_url=own_redis.url(REDIS_DB), database_url=database_url)
        running = boot(root, env)
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture(autouse=True)
def one_scenario(stack: FaultStack) -> Iterator[None]:
    """Each scenario is judged on its own, and a failed one leaves no job behind."""
    if stack.monitor is not None:
        stack.monitor.violations.clear()
    before = len(stack.submitted)
    yield
    stack.cancel_unfinished(stack.submitted[before:])


def processes_of(stack: FaultStack, job_id: int) -> dict[str, int]:
    """The job's live training processes: worker id -> pid."""
    return {p.worker: p.pid for p in training_processes(stack.step_dir) if p.job == f"job-{job_id}"}


def leader_of(stack: FaultStack, job_id: int) -> str:
    """The worker id that holds the job's leader lease now."""
    value = redis.Redis.from_url(stack.env["REDIS_URL"]).get(f"edl:job-{job_id}:leader")
    assert value is not None, f"job {job_id} has no leader"
    return value.decode()


def assert_survived(stack: FaultStack, job_ids: list[int], fault_at: float) -> None:
    """The fault landed mid-run, and every promise held afterwards."""
    stack.wait_completed(job_ids)
    stack.wait_processes_gone(job_ids)
    for job_id in job_ids:
        records = read_step_logs(stack.step_dir, f"job-{job_id}")
        assert attempts_after(records, fault_at) > 0, f"job {job_id} had finished before the fault"
        stack.assert_trained_once(job_id)
    stack.assert_no_gpu_held()
    assert stack.proc.poll() is None, f"runstack stopped:\n{stack.log_tail()}"


def assert_dead_gpu_freed(stack: FaultStack, job_id: int, dead: str) -> None:
    """While the job trains on without it, the dead worker's GPU comes free or gets a process.

    Checked as soon as the job reports its recovery, not at its end: however fast
    the machine, the job trains on long after (LONG_EPOCHS), so this cannot pass
    by the job's end freeing everything.
    """
    gpu = int(dead.removeprefix("w"))
    stack.wait_for(
        f"job {job_id} to recover",
        lambda: any(e["kind"] == "recovered" for e in stack.events(job_id)),
        timeout=60,
    )
    deadline = time.monotonic() + ALLOWANCES.held_by_the_dead
    while time.monotonic() < deadline:
        held = {h.gpu for h in stack.db.held() if h.job_id == job_id}
        if gpu not in held or dead in processes_of(stack, job_id):
            return
        time.sleep(0.5)
    raise AssertionError(
        f"gpu {gpu} of dead worker {dead} is still held by job {job_id} "
        f"({stack.job(job_id)['state']}) with no process, {ALLOWANCES.held_by_the_dead:.0f} s "
        "after the job recovered without it"
    )


def test_sigkill_a_training_worker_and_a_leader(
    stack: FaultStack, scenario_clock: Callable[[str], None]
) -> None:
    # Long enough to outlast the kill by more than the GPU allowance: a dead worker's GPU
    # must come free (or get a new process) while its job trains on without it.
    worker_job = stack.submit("worker-kill", epochs=LONG_EPOCHS)
    leader_job = stack.submit("leader-kill", epochs=LONG_EPOCHS)
    for job_id in (worker_job, leader_job):
        stack.wait_running_past_checkpoint(job_id)
    scenario_clock("both jobs past a checkpoint")
    leader = leader_of(stack, leader_job)
    plain = next(w for w in processes_of(stack, worker_job) if w != leader_of(stack, worker_job))
    fault_at = time.time()
    sigkill(processes_of(stack, worker_job)[plain])
    sigkill(processes_of(stack, leader_job)[leader])
    assert_dead_gpu_freed(stack, worker_job, plain)
    assert_dead_gpu_freed(stack, leader_job, leader)
    scenario_clock("the dead workers' GPUs freed")
    assert_survived(stack, [worker_job, leader_job], fault_at)
    scenario_clock("both completed")


def test_sigkill_an_agent(stack: FaultStack, scenario_clock: Callable[[str], None]) -> None:
    job_id = stack.submit("agent-kill")
    stack.wait_running_past_checkpoint(job_id)
    parents = {p.ppid for p in training_processes(stack.step_dir) if p.job == f"job-{job_id}"}
    agents = {role: p for role, p in stack.roles().items() if p.pid in parents}
    assert len(agents) == 1, agents
    ((role, agent),) = agents.items()
    fault_at = time.time()
    sigkill(agent.pid)
    wait_for_replacement(stack.proc.pid, role, agent.pid, timeout=30)
    scenario_clock(f"{role} restarted")
    assert_survived(stack, [job_id], fault_at)
    # The new agent adopted the processes: the job was never requeued (which would
    # have started a second run beside the first).
    assert not [e for e in stack.events(job_id) if e["kind"] == "preempted"], stack.events(job_id)


def test_sigkill_the_celery_workers_mid_tick_then_beat(
    stack: FaultStack, scenario_clock: Callable[[str], None]
) -> None:
    # Long enough to train through every restart below: a job that ends while the report
    # worker is down keeps its GPUs until the worker is back (~20 s here), which the
    # monitor rightly calls "held by the dead"; the scenario's pace decides whether a
    # 45-epoch job ends in that window (seen: four runs in a row on 2026-12-02).
    running = stack.submit("tick-kill", epochs=LONG_EPOCHS)
    stack.wait_running_past_checkpoint(running)
    queued = stack.submit("placed-after-kill")  # the tick that would place it is the one killed
    client = redis.Redis.from_url(stack.env["REDIS_URL"])
    ticker = stack.roles()["tick-worker"]  # the tick runs on its own queue and worker
    deadline = time.monotonic() + 30
    while not client.exists(TICK_LOCK_KEY):
        assert time.monotonic() < deadline, "no tick ran for 30 s"
        time.sleep(0.001)
    fault_at = time.time()
    sigkill(ticker.pid)
    wait_for_replacement(stack.proc.pid, "tick-worker", ticker.pid, timeout=30)
    scenario_clock("tick worker restarted")
    # The next tick repairs what the killed one left: it must not wait for the killed
    # tick's lock to time out (then 60 s) before it places the job the killed one did not.
    stack.wait_for(
        "a tick after the restart to place the queued job",
        lambda: stack.job(queued)["state"] != "queued",
        timeout=TICK_RECOVERY_S,
    )
    scenario_clock("the queued job placed")
    # The worker that applies agent reports: while it restarts no heartbeat arrives, which
    # must not look like every agent dying (servers marked down, running jobs requeued).
    reporter = stack.roles()["worker"]
    sigkill(reporter.pid)
    wait_for_replacement(stack.proc.pid, "worker", reporter.pid, timeout=30)
    scenario_clock("report worker restarted")
    beat = stack.roles()["beat"]
    sigkill(beat.pid)
    wait_for_replacement(stack.proc.pid, "beat", beat.pid, timeout=30)
    scenario_clock("beat restarted")
    later = stack.submit("placed-after-beat")  # only a tick places it: ticks go on
    stack.wait_completed([queued, later])
    assert_survived(stack, [running, queued, later], fault_at)


def test_restart_redis(
    stack: FaultStack, own_redis: RedisServer, scenario_clock: Callable[[str], None]
) -> None:
    job_id = stack.submit("redis-restart")
    stack.wait_running_past_checkpoint(job_id)
    fault_at = time.time()
    own_redis.restart()
    scenario_clock("Redis restarted")
    after = stack.submit("submitted-after-restart")
    stack.wait_completed([after])
    assert_survived(stack, [job_id], fault_at)
    stack.assert_trained_once(after)
