"""End to end: the real agent as a Celery worker, real training processes, real reports.

The agent runs as a subprocess (``python -m workers.agent``) against the test
Redis; commands go to ``agent.<node>`` with ``send_command`` exactly as the
control plane sends them; the reports the agent sends are read off their
queue with kombu (a queue of this test's own, given by ``--reports-queue``).
Every agent gets its key (``AGENT_KEY``) derived from this module's master
secret; commands are signed with it, and the reader checks every report's
signature, as the control plane does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from django.conf import settings

from workers.agent.celery_app import make_app
from workers.agent.client import command_envelope, send_command
from workers.elastic.control import JobControl
from workers.protocol import (
    AGENT_COMMAND_TASK,
    REPORT_TASK,
    Command,
    Failed,
    Finished,
    Heartbeat,
    Migrate,
    Progress,
    Recovered,
    Report,
    ScaleDone,
    ScaleIn,
    Started,
    StartWorkers,
    StopJob,
    Stopped,
    WorkerExited,
    WorkerFailed,
    agent_queue,
)
from workers.signing import key_to_text, node_key, open_envelope

pytestmark = [pytest.mark.slow, pytest.mark.stack]

REPO_ROOT = Path(__file__).resolve().parents[2]
SLOTS = 3
TEST_MASTER = b"test-agent-master-secret"


def key_for(node: str) -> bytes:
    """The key of ``node``'s agent in these tests."""
    return node_key(TEST_MASTER, node)


def send_signed(node: str, command: Command) -> str:
    """Send ``command`` to ``node``'s agent signed with its key, as the control plane does."""
    return send_command(node, command, key=key_for(node))


class ReportReader:
    """Reads the agent's report tasks off their queue and keeps every report seen."""

    def __init__(self, url: str, queue: str) -> None:
        # kombu is only partly typed: its objects are used as Any here.
        broker: Any = kombu
        self.connection = broker.Connection(url)
        # Declared before the agent starts, so that no report is dropped unrouted.
        self.queue = self.connection.SimpleQueue(
            broker.Queue(queue, broker.Exchange(queue, type="direct"), routing_key=queue)
        )
        self.reports: list[Report] = []

    def _read(self, timeout: float) -> None:
        try:
            message = self.queue.get(block=True, timeout=timeout)
        except self.queue.Empty:
            return
        message.ack()
        assert message.headers["task"] == REPORT_TASK
        args, _kwargs, _embed = message.decode()
        signed = open_envelope(args[0], key_for=key_for, now=time.time())
        report = Report.from_dict(signed.body)
        assert report.node == signed.node
        self.reports.append(report)

    def wait_for(
        self, predicate: Callable[[Report], bool], timeout: float, what: str = "report"
    ) -> Report:
        """The first report (seen so far or arriving within ``timeout``) that matches."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for report in self.reports[checked:]:
                if predicate(report):
                    return report
            checked = len(self.reports)
            if time.monotonic() > deadline:
                seen = [r.TYPE for r in self.reports[-30:]]
                raise AssertionError(f"no {what} within {timeout}s; last reports: {seen}")
            self._read(0.5)

    def of(self, kind: type[Any], job: str | None = None) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind) and (job is None or r.job == job)]

    def close(self) -> None:
        with contextlib.suppress(Exception):  # leave no test queue behind in a shared Redis
            self.queue.queue.delete()
        self.queue.close()
        self.connection.release()


class RunningAgent:
    def __init__(self, node: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.node = node
        self.process = process
        self.log = log

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def redis_url() -> str:
    return os.environ.get("REDIS_URL") or str(settings.REDIS_URL)


@pytest.fixture(scope="module")
def reader(redis_url: str) -> Iterator[ReportReader]:
    reports = ReportReader(redis_url, f"test-reports-{uuid.uuid4().hex[:8]}")
    yield reports
    reports.close()


def launch_agent(node: str, data_dir: Path, redis_url: str, reader: ReportReader) -> RunningAgent:
    """Start ``python -m workers.agent`` for ``node`` and wait for its first heartbeat."""
    log = data_dir / f"agent-{time.monotonic_ns()}.log"
    # No Django settings: the agent configures itself from the environment.
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "REDIS_URL": redis_url,
        "PORTAL_DATA_DIR": str(data_dir),
        "AGENT_HEARTBEAT_SECONDS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "AGENT_KEY": key_to_text(key_for(node)),
    }
    argv = [
        sys.executable, "-m", "workers.agent",
        "--node", node,
        "--gpus", str(SLOTS),
        "--cpu",
        "--reports-queue", reader.queue.queue.name,
        "--heartbeats-queue", reader.queue.queue.name,
        "--stop-children-on-exit",
    ]  # fmt: skip
    launched_at = time.time()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    running = RunningAgent(node, process, log)
    try:
        reader.wait_for(
            lambda r: isinstance(r, Heartbeat) and r.node == node and r.at >= launched_at,
            90,
            "first heartbeat",
        )
    except AssertionError:
        sys.stdout.write(running.log_tail() + "\n")
        stop_agent(running)
        raise
    return running


def stop_agent(agent: RunningAgent) -> None:
    """Warm shutdown (SIGTERM): with --stop-children-on-exit it ends its training processes."""
    if agent.process.poll() is None:
        agent.process.send_signal(signal.SIGTERM)
    try:
        agent.process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        agent.process.kill()
        agent.process.wait()


def clean_up(node: str, redis_url: str, reader: ReportReader) -> None:
    """End any training process the tests started that still runs; drop the node's keys."""
    for started in reader.of(Started):
        for worker in started.workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, signal.SIGKILL)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    for key in client.scan_iter(match=f"agent:{node}:*"):
        client.delete(key)


@pytest.fixture(scope="module")
def agent(
    redis_url: str, reader: ReportReader, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningAgent]:
    node = f"test-{uuid.uuid4().hex[:8]}"
    running = launch_agent(node, tmp_path_factory.mktemp("agent-data"), redis_url, reader)
    try:
        yield running
    finally:
        stop_agent(running)
        clean_up(node, redis_url, reader)


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def start_command(job: str, slots: list[int], command_id: str, **extra: Any) -> Command:
    return Command.from_dict(
        {
            "type": "start_workers",
            "job": job,
            "command_id": command_id,
            "workload": "mlp-digits",
            "args": {"epochs": 1000, "hidden": 32},
            "batch_size": 32,
            "recovery": "consistent",
            "checkpoint_every": 0,
            "workers": [{"worker_id": f"w{i}", "slot": s} for i, s in enumerate(slots)],
            "initial_world": len(slots),
            **extra,
        }
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def free_of(reader: ReportReader, agent: RunningAgent, job: str) -> Heartbeat:
    """A heartbeat sent after everything of ``job`` ended on the agent."""
    beat = reader.wait_for(
        lambda r: (
            isinstance(r, Heartbeat)
            and r.node == agent.node
            and all(w.job != job for w in r.workers)
        ),
        30,
        f"a heartbeat without {job}",
    )
    assert isinstance(beat, Heartbeat)
    return beat


def test_training_reports_progress_and_finish_and_replays_are_no_ops(
    agent: RunningAgent, reader: ReportReader, redis_url: str
) -> None:
    job = new_job()
    command = start_command(job, [0, 1], f"start-{job}", max_steps=400)
    send_signed(agent.node, command)
    send_signed(agent.node, command)  # a replay: must not start a second pair

    progress = reader.wait_for(
        lambda r: isinstance(r, Progress) and r.job == job and r.step > 0, 120, "progress"
    )
    assert isinstance(progress, Progress)
    assert progress.samples_per_s > 0 and progress.world == 2 and progress.node == agent.node
    finished = reader.wait_for(lambda r: isinstance(r, Finished) and r.job == job, 120, "finish")
    assert isinstance(finished, Finished) and finished.reason == "finished"
    assert finished.step == 400

    def exit_of(worker: str) -> Callable[[Report], bool]:
        return lambda r: isinstance(r, WorkerExited) and r.job == job and r.worker_id == worker

    exits = [reader.wait_for(exit_of(w), 30, f"exit of {w}") for w in ("w0", "w1")]
    assert all(isinstance(e, WorkerExited) and e.outcome == "clean" for e in exits)
    assert all(e.exit_code == 0 for e in exits)  # type: ignore[attr-defined]

    started = reader.of(Started, job)
    pids = {w.pid for s in started for w in s.workers}
    assert len(pids) == 2, f"the replay started processes: {started}"
    assert {w.slot for w in started[0].workers} == {0, 1}
    assert not any(alive(pid) for pid in pids)

    # A replay after the job finished must not start it again.
    seen = len(reader.reports)
    sent_at = time.time()
    send_signed(agent.node, command)
    reader.wait_for(
        lambda r: isinstance(r, Heartbeat) and r.at > sent_at + 2.5, 30, "later heartbeats"
    )
    late = reader.reports[seen:]
    assert not [r for r in late if isinstance(r, Started) and r.job == job and r.workers]
    assert all(w.job != job for r in late if isinstance(r, Heartbeat) for w in r.workers)
    assert JobControl(redis_url, job).status().state == "finished"


def test_killed_training_process_is_reported_and_the_agent_survives(
    agent: RunningAgent, reader: ReportReader
) -> None:
    job = new_job()
    send_signed(agent.node, start_command(job, [2], f"start-{job}"))
    started = reader.wait_for(lambda r: isinstance(r, Started) and r.job == job, 60, "started")
    assert isinstance(started, Started)
    [worker] = started.workers
    reader.wait_for(lambda r: isinstance(r, Progress) and r.job == job, 120, "progress")

    os.kill(worker.pid, signal.SIGKILL)

    exited = reader.wait_for(
        lambda r: isinstance(r, WorkerExited) and r.job == job, 30, "worker exit"
    )
    assert isinstance(exited, WorkerExited)
    assert (exited.worker_id, exited.slot) == ("w0", 2)
    assert exited.outcome == "crashed" and exited.exit_code == -signal.SIGKILL
    failed = reader.wait_for(lambda r: isinstance(r, Failed) and r.job == job, 30, "failed")
    assert isinstance(failed, Failed) and failed.event_id is None
    assert "code -9" in failed.error
    # The agent lives on: it heartbeats, with slot 2 free again.
    beat = free_of(reader, agent, job)
    assert 2 in beat.free_slots
    assert agent.process.poll() is None


def test_scale_in_then_stop(agent: RunningAgent, reader: ReportReader) -> None:
    job = new_job()
    send_signed(agent.node, start_command(job, [0, 1], f"start-{job}"))
    started = reader.wait_for(lambda r: isinstance(r, Started) and r.job == job, 60, "started")
    assert isinstance(started, Started)
    pids = [w.pid for w in started.workers]
    reader.wait_for(
        lambda r: isinstance(r, Progress) and r.job == job and r.world == 2, 120, "progress"
    )

    send_signed(agent.node, ScaleIn(job=job, command_id=f"in-{job}", worker_ids=("w1",)))
    done = reader.wait_for(lambda r: isinstance(r, ScaleDone) and r.job == job, 60, "scale done")
    assert isinstance(done, ScaleDone)
    assert done.world == 1 and done.workers == ("w0",) and done.leavers == ("w1",)
    left = reader.wait_for(
        lambda r: isinstance(r, WorkerExited) and r.job == job and r.worker_id == "w1",
        30,
        "exit of the leaver",
    )
    assert isinstance(left, WorkerExited) and left.outcome == "clean"

    stop = StopJob(job=job, command_id=f"stop-{job}", reason="test", grace_seconds=30)
    send_signed(agent.node, stop)
    send_signed(agent.node, stop)  # replayed: harmless
    stopped = reader.wait_for(lambda r: isinstance(r, Stopped) and r.job == job, 60, "stopped")
    assert isinstance(stopped, Stopped) and stopped.command_id == stop.command_id
    finished = reader.wait_for(lambda r: isinstance(r, Finished) and r.job == job, 10, "finished")
    assert isinstance(finished, Finished) and finished.reason == "stopped"
    assert len(reader.of(Stopped, job)) == 1
    assert not any(alive(pid) for pid in pids)
    free_of(reader, agent, job)


def test_migration_with_the_leader_leaving(agent: RunningAgent, reader: ReportReader) -> None:
    job = new_job()
    send_signed(agent.node, start_command(job, [0, 1], f"start-{job}"))
    reader.wait_for(lambda r: isinstance(r, Progress) and r.job == job, 120, "progress")

    # w0 (rank 0, the leader) leaves; the newcomer w2 joins in the same switch.
    joining = start_command(
        job, [2], f"unused-{job}", join=True, initial_world=None,
        workers=[{"worker_id": "w2", "slot": 2}],
    )  # fmt: skip
    assert isinstance(joining, StartWorkers)
    move = Migrate(job=job, command_id=f"move-{job}", leaving=("w0",), joining=joining)
    send_signed(agent.node, move)
    moved = reader.wait_for(
        lambda r: isinstance(r, ScaleDone) and r.job == job and "w2" in r.joiners,
        120,
        "migration",
    )
    assert isinstance(moved, ScaleDone)
    assert moved.leavers == ("w0",) and sorted(moved.workers) == ["w1", "w2"]
    assert moved.world == 2
    started = reader.of(Started, job)
    assert [w.worker_id for w in started[-1].workers] == ["w2"]
    assert started[-1].command_id == move.command_id
    left = reader.wait_for(
        lambda r: isinstance(r, WorkerExited) and r.job == job and r.worker_id == "w0",
        30,
        "exit of the leaver",
    )
    assert isinstance(left, WorkerExited) and left.outcome == "clean"
    reader.wait_for(
        lambda r: isinstance(r, Progress) and r.job == job and r.at > left.at and r.world == 2,
        60,
        "progress after the migration",
    )
    send_signed(agent.node, StopJob(job=job, command_id=f"stop-{job}", grace_seconds=30))
    reader.wait_for(lambda r: isinstance(r, Stopped) and r.job == job, 60, "stopped")
    free_of(reader, agent, job)


def test_a_restarted_agent_adopts_its_training_processes(
    redis_url: str, reader: ReportReader, tmp_path: Path
) -> None:
    node = f"test-{uuid.uuid4().hex[:8]}"
    first = launch_agent(node, tmp_path, redis_url, reader)
    try:
        job = new_job()
        send_signed(node, start_command(job, [0], f"start-{job}"))
        started = reader.wait_for(lambda r: isinstance(r, Started) and r.job == job, 60, "started")
        assert isinstance(started, Started)
        [worker] = started.workers
        reader.wait_for(lambda r: isinstance(r, Progress) and r.job == job, 120, "progress")

        first.process.kill()  # the agent dies hard; training goes on
        first.process.wait()
        assert alive(worker.pid)
        restarted_at = time.time()
        second = launch_agent(node, tmp_path, redis_url, reader)
        try:
            beat = reader.wait_for(
                lambda r: isinstance(r, Heartbeat) and r.node == node and r.at > restarted_at,
                30,
                "heartbeat of the new agent",
            )
            assert isinstance(beat, Heartbeat)
            assert [(w.job, w.worker_id, w.pid) for w in beat.workers] == [(job, "w0", worker.pid)]
            assert 0 not in beat.free_slots
            # It still reports the job's progress, and it can stop it.
            reader.wait_for(
                lambda r: isinstance(r, Progress) and r.job == job and r.at > restarted_at,
                60,
                "progress through the new agent",
            )
            send_signed(node, StopJob(job=job, command_id=f"stop-{job}", grace_seconds=30))
            reader.wait_for(lambda r: isinstance(r, Stopped) and r.job == job, 60, "stopped")
            exited = reader.of(WorkerExited, job)
            assert [(e.worker_id, e.outcome) for e in exited] == [("w0", "stopped")]
            assert not alive(worker.pid)
        finally:
            stop_agent(second)
    finally:
        stop_agent(first)
        clean_up(node, redis_url, reader)


def test_runtime_recovery_after_a_crash_is_forwarded(
    agent: RunningAgent, reader: ReportReader
) -> None:
    job = new_job()
    command = start_command(job, [0, 1], f"start-{job}", recovery="approximate", sync_timeout_s=3.0)
    send_signed(agent.node, command)
    started = reader.wait_for(lambda r: isinstance(r, Started) and r.job == job, 60, "started")
    assert isinstance(started, Started)
    victim = next(w for w in started.workers if w.worker_id == "w1")
    reader.wait_for(
        lambda r: isinstance(r, Progress) and r.job == job and r.world == 2, 120, "progress"
    )

    os.kill(victim.pid, signal.SIGKILL)

    crashed = reader.wait_for(
        lambda r: isinstance(r, WorkerExited) and r.job == job, 30, "exit of the victim"
    )
    assert isinstance(crashed, WorkerExited) and crashed.outcome == "crashed"
    failed = reader.wait_for(
        lambda r: isinstance(r, WorkerFailed) and r.job == job, 60, "worker_failed"
    )
    assert isinstance(failed, WorkerFailed) and failed.worker_id == "w1"
    recovered = reader.wait_for(
        lambda r: isinstance(r, Recovered) and r.job == job, 60, "recovered"
    )
    assert isinstance(recovered, Recovered)
    assert recovered.mode == "approximate" and recovered.world == 1 and recovered.dead == ("w1",)
    reader.wait_for(
        lambda r: isinstance(r, Progress) and r.job == job and r.world == 1, 60, "progress"
    )
    assert not reader.of(Failed, job)  # the job lives on: no job failure reported
    send_signed(agent.node, StopJob(job=job, command_id=f"stop-{job}", grace_seconds=30))
    reader.wait_for(lambda r: isinstance(r, Stopped) and r.job == job, 60, "stopped")


def test_forged_commands_are_refused_and_start_nothing(
    agent: RunningAgent, reader: ReportReader
) -> None:
    job = new_job()
    command = start_command(job, [0], f"start-{job}", max_steps=50)
    app = make_app(os.environ.get("REDIS_URL") or str(settings.REDIS_URL))
    other = f"other-{uuid.uuid4().hex[:6]}"
    forged = {
        "unsigned": command.to_dict(),
        "wrong key": command_envelope(agent.node, command, key=node_key(b"guess", agent.node)),
        "another node's key": command_envelope(other, command, key=key_for(other)),
        "stale": command_envelope(
            agent.node, command, key=key_for(agent.node), now=lambda: time.time() - 3600
        ),
    }
    sent_at = time.time()
    for envelope in forged.values():
        app.send_task(
            AGENT_COMMAND_TASK, args=[envelope], queue=agent_queue(agent.node), ignore_result=True
        )
    reader.wait_for(
        lambda r: isinstance(r, Heartbeat) and r.node == agent.node and r.at > sent_at + 2.5,
        30,
        "heartbeats after the forged commands",
    )
    assert not [r for r in reader.reports if getattr(r, "job", None) == job]
    assert all(w.job != job for r in reader.of(Heartbeat) for w in r.workers)
    log = agent.log.read_text(errors="replace")
    assert log.count("refused a command") == len(forged), agent.log_tail()
    for reason in ("unsigned", "bad signature", "wrong node", "stale"):
        assert reason in log, reason

    # The same command, signed with the node's key, runs.
    send_signed(agent.node, command)
    started = reader.wait_for(lambda r: isinstance(r, Started) and r.job == job, 60, "start")
    assert isinstance(started, Started) and len(started.workers) == 1
    reader.wait_for(lambda r: isinstance(r, WorkerExited) and r.job == job, 120, "exit")
