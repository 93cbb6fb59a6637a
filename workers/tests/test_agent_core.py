"""The agent's core in-process, against the real Redis and the runtime's JobControl.

Reports are collected in a list instead of going through Celery (the Celery
path has its own end-to-end test in test_agent_celery.py).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from workers.agent import service
from workers.agent.agent import Agent
from workers.agent.config import AgentConfig, AgentConfigError, detect_slots
from workers.agent.launch import worker_argv
from workers.agent.programs import builtin_env
from workers.agent.redis_acl import (
    delete_job_user,
    ensure_job_user,
    job_user,
    job_user_exists,
    url_for,
)
from workers.agent.reports import report_from_event
from workers.agent.store import AgentStore, WorkerRecord
from workers.clock import ManualClock
from workers.elastic.cli import parse_options
from workers.elastic.control import JobControl, publish
from workers.protocol import (
    ArtifactStored,
    CheckpointSkipped,
    Command,
    Finished,
    Heartbeat,
    Metrics,
    ProfileDone,
    Progress,
    ProtocolError,
    Rejected,
    Report,
    ScaleDone,
    StartWorkers,
    Stopped,
    WorkerExited,
)
from workers.runtime_events import FinishedEvent, ProgressEvent, finite_or_none


class Collected:
    """The reports an agent sent, in order."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.reports.append(report)

    def of(self, kind: type[Report]) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind)]


@pytest.fixture
def redis_url() -> str:
    return str(settings.REDIS_URL)


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


@pytest.fixture
def node() -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    cleanup = redis.Redis.from_url(str(settings.REDIS_URL), decode_responses=True)
    for key in cleanup.scan_iter(match=f"agent:{name}:*"):
        cleanup.delete(key)


@pytest.fixture
def job(redis_url: str) -> Iterator[str]:
    name = f"job-{uuid.uuid4().hex[:8]}"
    yield name
    JobControl(redis_url, name).cleanup()
    cleanup = redis.Redis.from_url(redis_url, decode_responses=True)
    for key in cleanup.scan_iter(match=f"agent:forwarded:{name}:*"):
        cleanup.delete(key)


def make_agent(
    node: str, redis_url: str, tmp_path: Path, slots: int = 2
) -> tuple[Agent, Collected]:
    config = AgentConfig(
        node=node, device="cpu", slots=slots, redis_url=redis_url, data_dir=tmp_path
    )
    sent = Collected()
    return Agent(config, AgentStore.from_url(redis_url, node), send=sent), sent


def start_payload(job: str, command_id: str, slots: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "type": "start_workers",
        "job": job,
        "command_id": command_id,
        "workload": "mlp-digits",
        "args": {"epochs": 1},
        "batch_size": 32,
        "recovery": "consistent",
        "checkpoint_every": 0,
        "workers": [{"worker_id": f"w{s}", "slot": s} for s in slots],
        "initial_world": len(slots),
        **extra,
    }


def test_malformed_command_is_rejected_and_changes_nothing(
    node: str, redis_url: str, tmp_path: Path, client: redis.Redis
) -> None:
    agent, sent = make_agent(node, redis_url, tmp_path)
    payload = start_payload("job-x", "cmd-bad", [0], batch_size=-3)
    assert agent.receive(payload) == "rejected"
    [rejected] = sent.of(Rejected)
    assert "batch_size must be at least 1" in rejected.error
    assert rejected.command_id == "cmd-bad" and rejected.job == "job-x"
    assert agent.running() == []
    assert not agent.store.was_applied("cmd-bad")
    assert list(client.scan_iter(match=f"agent:{node}:*")) == []


def test_impossible_start_is_rejected_before_anything_starts(
    node: str, redis_url: str, tmp_path: Path, job: str
) -> None:
    agent, sent = make_agent(node, redis_url, tmp_path, slots=2)
    # Slot 5 does not exist: the valid worker on slot 0 must not start either.
    assert agent.receive(start_payload(job, "c1", [0, 5])) == "rejected"
    assert "slot 5 does not exist" in sent.of(Rejected)[0].error
    assert agent.running() == []
    assert not agent.store.was_applied("c1")


def test_scale_in_replay_is_a_no_op(
    node: str, redis_url: str, tmp_path: Path, job: str, client: redis.Redis
) -> None:
    agent, _ = make_agent(node, redis_url, tmp_path)
    command = {"type": "scale_in", "job": job, "command_id": "s1", "worker_ids": ["w1"]}
    assert agent.receive(command) == "applied"
    assert agent.receive(command) == "replayed"
    control = JobControl(redis_url, job)
    requests: Any = client.xrange(control.keys.control)
    assert len(requests) == 1
    assert requests[0][1]["kind"] == "scale_in"


def test_applied_ids_survive_an_agent_restart(
    node: str, redis_url: str, tmp_path: Path, job: str, client: redis.Redis
) -> None:
    first, _ = make_agent(node, redis_url, tmp_path)
    command = {
        "type": "profile",
        "job": job,
        "command_id": "p1",
        "min_workers": 1,
        "max_workers": 2,
    }
    assert first.receive(command) == "applied"
    second, _ = make_agent(node, redis_url, tmp_path)  # a new process of the same node
    second.restore()
    assert second.receive(command) == "replayed"
    assert client.xlen(JobControl(redis_url, job).keys.control) == 1


def test_stop_of_a_job_with_nothing_here_reports_stopped(
    node: str, redis_url: str, tmp_path: Path, job: str, client: redis.Redis
) -> None:
    agent, sent = make_agent(node, redis_url, tmp_path)
    assert agent.receive({"type": "stop_job", "job": job, "command_id": "st1"}) == "applied"
    agent.tick()
    [stopped] = sent.of(Stopped)
    assert stopped.job == job and stopped.command_id == "st1"
    requests: Any = client.xrange(JobControl(redis_url, job).keys.control)
    assert requests[0][1]["kind"] == "stop"
    assert agent.store.stops() == {}


def test_runtime_events_are_forwarded_once_across_agents(
    redis_url: str, tmp_path: Path, job: str, client: redis.Redis
) -> None:
    nodes = [f"test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    agents = [make_agent(n, redis_url, tmp_path) for n in nodes]
    keys = JobControl(redis_url, job).keys
    history = ProgressEvent(step=1, samples_per_s=1.0, loss=1.0, world=1, generation=0)
    publish(client, keys, history)
    for i, (agent, _) in enumerate(agents):
        # Watching starts at the end of the stream: history is not replayed.
        payload = {"type": "scale_in", "job": job, "command_id": f"x{i}", "worker_ids": ["w9"]}
        agent.receive(payload)
    latest = ProgressEvent(
        step=5, samples_per_s=123.5, loss=finite_or_none(math.nan), world=2, generation=0
    )
    publish(client, keys, latest)
    publish(client, keys, FinishedEvent(step=9, reason="finished"))
    for agent, _ in agents:
        agent.tick()
    progress = [r for _, sent in agents for r in sent.of(Progress)]
    finished = [r for _, sent in agents for r in sent.of(Finished)]
    assert len(progress) == 1 and len(finished) == 1
    assert progress[0].step == 5 and progress[0].samples_per_s == 123.5
    assert progress[0].loss is None  # NaN loss (no batch yet) travels as null
    assert finished[0].step == 9
    for name in nodes:
        for key in client.scan_iter(match=f"agent:{name}:*"):
            client.delete(key)


def test_heartbeat_lists_slots_and_workers(node: str, redis_url: str, tmp_path: Path) -> None:
    agent, sent = make_agent(node, redis_url, tmp_path, slots=3)
    agent.tick()
    [beat] = sent.of(Heartbeat)
    assert beat.node == node and beat.device == "cpu"
    assert beat.slots == 3 and beat.free_slots == (0, 1, 2) and beat.workers == ()


def test_restore_reports_processes_gone_while_the_agent_was_down(
    node: str, redis_url: str, tmp_path: Path, job: str
) -> None:
    store = AgentStore.from_url(redis_url, node)
    log = tmp_path / "w0.log"
    log.write_text("Traceback: something broke\n")
    # pid 0 is never a training process: this one is gone.
    store.save_worker(WorkerRecord(job, "w0", 1, 0, str(log), 0.0))
    agent, sent = make_agent(node, redis_url, tmp_path)
    agent.restore()
    [gone] = sent.of(WorkerExited)
    assert (gone.worker_id, gone.slot, gone.outcome, gone.exit_code) == ("w0", 1, "lost", None)
    assert "something broke" in gone.log_tail
    assert store.workers() == []


def test_worker_command_line_is_accepted_by_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in's command line and environment (``builtin_env``) make its options."""
    config = AgentConfig(
        node="n1", device="cuda", slots=4, redis_url="redis://h:1/0", data_dir=tmp_path
    )
    first = Command.from_dict(start_payload("j1", "c1", [0, 3], max_steps=5, sync_timeout_s=7.5))
    assert isinstance(first, StartWorkers)
    env = builtin_env(config, first, "w3", "redis://edl-j1:pw@h:1/0")
    monkeypatch.setenv("REDIS_URL", env["REDIS_URL"])  # what the process is started with
    argv = worker_argv(config, first, first.workers[1])
    assert "--redis-url" not in argv and not any("redis://" in arg for arg in argv)
    options = parse_options(argv[3:])
    assert (options.job_id, options.worker_id, options.device) == ("j1", "w3", "cuda:3")
    assert options.redis_url == "redis://edl-j1:pw@h:1/0"  # the job's own user
    assert options.initial_world == 2 and options.max_steps == 5
    assert options.sync_timeout_s == 7.5
    assert options.store_url == str(tmp_path / "checkpoints" / "j1")  # no prefix: on the node
    assert options.step_log is None
    assert options.args == {"epochs": 1, "hidden": 128, "lr": 0.05, "seed": 0}
    joiner = Command.from_dict(start_payload("j1", "c2", [1], join=True, checkpoint_dir="/ck"))
    assert isinstance(joiner, StartWorkers)
    options = parse_options(worker_argv(config, joiner, joiner.workers[0])[3:])
    assert options.initial_world is None  # a newcomer is not told a world size
    assert options.store_url == "/ck"
    shared = replace(config, artifact_url="s3://b/p", step_log_dir=tmp_path / "steps")
    placed = Command.from_dict(
        start_payload("j1", "c3", [2], store_prefix="tenants/t/jobs/1", checkpoint_keep=3)
    )
    assert isinstance(placed, StartWorkers)
    options = parse_options(worker_argv(shared, placed, placed.workers[0])[3:])
    assert options.store_url == "s3://b/p/tenants/t/jobs/1" and options.checkpoint_keep == 3
    assert options.step_log == str(tmp_path / "steps" / "j1.w2.jsonl")


def test_report_from_runtime_events() -> None:
    scale = report_from_event(
        "n",
        "j",
        "7-0",
        {
            "kind": "scale_done",
            "generation": 2,
            "world": 3,
            "members": ["a", "b", "c"],
            "joiners": ["c"],
            "leavers": [],
            "pause_s": 0.02,
            "step": 40,
        },
    )
    assert isinstance(scale, ScaleDone)
    assert scale.workers == ("a", "b", "c") and scale.joiners == ("c",) and scale.pause_s == 0.02
    curve = report_from_event(
        "n", "j", "8-0", {"kind": "profile_done", "curve": {"2": 9.5, "1": 5}}
    )
    assert isinstance(curve, ProfileDone)
    assert [(p.workers, p.samples_per_s) for p in curve.curve] == [(1, 5.0), (2, 9.5)]
    assert report_from_event("n", "j", "9-0", {"kind": "something_new"}) is None
    with pytest.raises(ProtocolError, match="lacks field 'ratio'"):
        report_from_event("n", "j", "9-1", {"kind": "straggler", "worker": "w1"})
    with pytest.raises(ProtocolError):
        report_from_event(
            "n", "j", "9-2", {"kind": "progress", "step": 1, "samples_per_s": "x", "world": 1}
        )


def test_reports_of_what_the_runtime_stored() -> None:
    sha = "c" * 64
    saved = report_from_event(
        "n", "j", "10-0",
        {"kind": "checkpoint_saved", "step": 50, "path": "checkpoints/step-000000050.pt",
         "size": 9, "sha256": sha, "final": True, "pruned": ["checkpoints/step-000000040.pt"]},
    )  # fmt: skip
    assert isinstance(saved, ArtifactStored)
    assert (saved.kind, saved.step, saved.name) == ("final", 50, "step-000000050.pt")
    assert saved.pruned == ("checkpoints/step-000000040.pt",)
    user = report_from_event(
        "n", "j", "10-1",
        {"kind": "artifact_saved", "name": "model.onnx", "path": "artifacts/model.onnx",
         "size": 3, "sha256": sha},
    )  # fmt: skip
    assert isinstance(user, ArtifactStored) and user.kind == "user" and user.name == "model.onnx"
    skipped = report_from_event(
        "n", "j", "10-2", {"kind": "checkpoint_skipped", "step": 40, "reason": "sha256 mismatch"}
    )
    assert isinstance(skipped, CheckpointSkipped) and skipped.step == 40
    many = [{"step": i, "values": {"loss": 1.0 / (i + 1)}} for i in range(450)]
    metrics = report_from_event("n", "j", "10-3", {"kind": "metrics", "points": many})
    assert isinstance(metrics, Metrics)
    assert len(metrics.points) <= 200 and metrics.points[0].step == 0
    with pytest.raises(ProtocolError, match=r"artifact_stored\.path"):
        report_from_event(
            "n", "j", "10-4",
            {"kind": "artifact_saved", "name": "x", "path": "../../other/x", "size": 1,
             "sha256": sha},
        )  # fmt: skip


def test_slot_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.agent.config as config_module

    monkeypatch.setattr(config_module, "_cuda_device_count", lambda: 0)
    assert detect_slots(3) == ("cpu", 3)
    assert detect_slots(None)[0] == "cpu"
    monkeypatch.setattr(config_module, "_cuda_device_count", lambda: 8)
    assert detect_slots(None) == ("cuda", 8)
    assert detect_slots(2) == ("cuda", 2)
    assert detect_slots(2, force_cpu=True) == ("cpu", 2)
    with pytest.raises(AgentConfigError, match="only 8 CUDA"):
        detect_slots(9)
    with pytest.raises(AgentConfigError, match="at least 1"):
        detect_slots(0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node", "bad node", "--cpu"], "--node must be"),
        (["--node", "n1", "--gpus", "0", "--cpu"], "--gpus must be at least 1"),
        (["--node", "n1", "--cpu", "--concurrency", "0"], "--concurrency must be at least 1"),
    ],
)
def test_agent_command_line_refuses_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert service.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_manage_py_agent_refuses_bad_input_with_status_2() -> None:
    with pytest.raises(CommandError) as excinfo:
        call_command("agent", node="bad node", cpu=True)
    assert excinfo.value.returncode == 2


def test_start_on_a_slot_still_held_by_a_leaving_worker_waits_for_it(
    node: str, redis_url: str, tmp_path: Path, job: str
) -> None:
    import threading

    from workers.elastic.control import JobControl

    agent, sent = make_agent(node, redis_url, tmp_path, slots=1)
    agent.start()
    other = f"{job}-next"
    try:
        assert agent.receive(start_payload(job, "first", [0], args={"epochs": 500})) == "applied"
        results: list[str] = []
        second = threading.Thread(
            target=lambda: results.append(agent.receive(start_payload(other, "second", [0])))
        )
        second.start()  # the slot is busy: the command waits instead of being rejected
        time.sleep(1.0)
        assert results == [] and not sent.of(Rejected)
        stop = {"type": "stop_job", "job": job, "command_id": "stop-first", "grace_seconds": 1.0}
        assert agent.receive(stop) == "applied"
        second.join(timeout=60)
        assert results == ["applied"]
        assert [r.job for r in agent.running()] == [other]
    finally:
        agent.close(stop_children=True)
        JobControl(redis_url, other).cleanup()


def test_heartbeats_follow_the_injected_clock(node: str, redis_url: str, tmp_path: Path) -> None:
    clock = ManualClock()
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=1,
        redis_url=redis_url,
        data_dir=tmp_path,
        heartbeat_seconds=5.0,
    )
    sent = Collected()
    agent = Agent(config, AgentStore.from_url(redis_url, node), send=sent, clock=clock)
    agent.tick()
    agent.tick()
    assert len(sent.of(Heartbeat)) == 1  # the first pass beats, the next waits its interval
    clock.advance(4.9)
    agent.tick()
    assert len(sent.of(Heartbeat)) == 1
    clock.advance(0.1)
    agent.tick()
    assert len(sent.of(Heartbeat)) == 2


def test_stop_deadline_follows_the_injected_clock(
    node: str, redis_url: str, tmp_path: Path, job: str
) -> None:
    """SIGTERM only once the grace has passed on the clock, SIGKILL after the kill delay."""
    import signal
    import subprocess

    from workers.agent.processes import Child

    clock = ManualClock()
    config = AgentConfig(node=node, device="cpu", slots=1, redis_url=redis_url, data_dir=tmp_path)
    sent = Collected()
    agent = Agent(config, AgentStore.from_url(redis_url, node), send=sent, clock=clock)
    # A stand-in for a training process that ignores SIGTERM (only SIGKILL ends it).
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"], start_new_session=True
    )
    try:
        record = WorkerRecord(job, "w0", 0, proc.pid, str(tmp_path / "w0.log"), clock.now())
        agent.processes.children[(job, "w0")] = Child(record=record, popen=proc)
        stop = {"type": "stop_job", "job": job, "command_id": "s1", "grace_seconds": 20.0}
        assert agent.receive(stop) == "applied"
        clock.advance(19.0)
        agent.tick()
        assert agent.processes.children[(job, "w0")].stop_signal_sent is None
        clock.advance(1.0)
        agent.tick()
        assert agent.processes.children[(job, "w0")].stop_signal_sent == clock.now()
        assert proc.poll() is None  # SIGTERM is ignored
        clock.advance(config.stop_kill_after_seconds + 0.1)
        agent.tick()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        agent.tick()
        [exited] = sent.of(WorkerExited)
        assert exited.outcome == "stopped" and exited.exit_code == -signal.SIGKILL
        [stopped] = sent.of(Stopped)
        assert stopped.command_id == "s1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


def test_a_heartbeat_makes_again_the_job_users_a_restarted_redis_lost(
    node: str, redis_url: str, tmp_path: Path, client: redis.Redis, job: str
) -> None:
    """ACL users made at run time are not in Redis's file: the agent restores its jobs'."""
    clock = ManualClock()
    config = AgentConfig(
        node=node, device="cpu", slots=1, redis_url=redis_url, data_dir=tmp_path,
        heartbeat_seconds=5.0,
    )  # fmt: skip
    agent = Agent(config, AgentStore.from_url(redis_url, node), send=Collected(), clock=clock)
    agent.processes.job_users.add(job)  # a job of this node's, as a start makes it
    try:
        password = ensure_job_user(client, job)
        delete_job_user(client, job)  # what a restart does
        agent.tick()  # the first pass beats
        assert job_user_exists(client, job)
        user = redis.Redis.from_url(url_for(redis_url, job_user(job), password))
        assert user.set(f"edl:{job}:k", "v")  # the same password: the job's processes get in
        agent.tick()  # between heartbeats nothing is asked
    finally:
        delete_job_user(client, job)
