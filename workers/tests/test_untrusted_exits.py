"""An exit the agent saw is a fact: a program that exits without the runtime is not lost for ever.

A program under the ``edl`` launcher that never calls ``edl.run`` exits 0
having told the runtime nothing.  The control plane used to see only "no
process for 15 s", requeue it from step 0 and place it again, without end;
the agent that watched every process exit now fails the job with the reason.
Real processes (unsandboxed: ``SANDBOX=off``), real Redis, the real agent.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from workers.agent.agent import Agent
from workers.agent.config import AgentConfig, SandboxSettings
from workers.agent.store import AgentStore
from workers.elastic.control import JobControl, publish
from workers.protocol import Failed, Rejected, Report, WorkerExited
from workers.runtime_events import FinishedEvent

pytestmark = pytest.mark.timeout(120)

CODE = "ef" * 32


class Collected:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.reports.append(report)

    def of(self, kind: type[Any]) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind)]


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path("/var/tmp") / f"portal-exits-{uuid.uuid4().hex[:8]}"
    (path / "data").mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[str]:
    name = f"exits-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    for key in client.scan_iter(match=f"agent:{name}:*"):
        client.delete(key)


@pytest.fixture
def job() -> Iterator[str]:
    name = f"job-{uuid.uuid4().hex[:8]}"
    yield name
    JobControl(str(settings.REDIS_URL), name).cleanup()


def program_agent(base: Path, node: str, script: str, **settings_: Any) -> tuple[Agent, Collected]:
    code = base / "code" / CODE
    code.mkdir(parents=True)
    (code / "main.py").write_text(script)
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=2,
        redis_url=str(settings.REDIS_URL),
        data_dir=base / "data",
        sandbox=SandboxSettings(mode="off"),
        **settings_,
    )
    sent = Collected()
    agent = Agent(
        config,
        AgentStore.from_url(str(settings.REDIS_URL), node),
        send=sent,
        resolve_code=lambda program: base / "code" / program.code,
    )
    return agent, sent


def start(job: str, workers: int = 2) -> dict[str, Any]:
    return {
        "type": "start_workers",
        "job": job,
        "command_id": "c1",
        "batch_size": 8,
        "recovery": "consistent",
        "checkpoint_every": 0,
        "initial_world": workers,
        "workers": [{"worker_id": f"w{i}", "slot": i, "rank": i} for i in range(workers)],
        "program": {
            "code": CODE,
            "code_path": f"code/{CODE}.tar.gz",
            "entrypoint": ["main.py"],
            "launcher": "edl",
            "world_size": workers,
        },
    }


def run_to_exit(agent: Agent, sent: Collected, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(sent.of(WorkerExited)) < count:
        assert time.monotonic() < deadline, sent.reports
        agent.tick()
        time.sleep(0.05)
    agent.tick()
    agent.processes.release()


def test_an_edl_program_that_never_calls_edl_run_fails_with_the_reason(
    base: Path, node: str, job: str
) -> None:
    agent, sent = program_agent(base, node, "print('training, or so I say')\n")
    assert agent.receive(start(job)) == "applied", sent.reports
    run_to_exit(agent, sent, 2)
    assert [e.outcome for e in sent.of(WorkerExited)] == ["clean", "clean"]
    [failed] = sent.of(Failed)
    assert failed.job == job and failed.event_id is None
    assert failed.error == (
        "the program exited 0 without finishing under the edl launcher: did it call `edl.run`?"
    )


def test_a_program_whose_runtime_finished_is_not_failed(base: Path, node: str, job: str) -> None:
    """The runtime's ``finished`` came before the exits: the job ended well, nothing else said."""
    agent, sent = program_agent(base, node, "print('done')\n")
    agent.events.watch(job)
    publish(
        redis.Redis.from_url(str(settings.REDIS_URL)),
        JobControl(str(settings.REDIS_URL), job).keys,
        FinishedEvent(step=5, reason="finished"),
    )
    assert agent.receive(start(job, workers=1)) == "applied", sent.reports
    run_to_exit(agent, sent, 1)
    assert not sent.of(Failed)


def test_a_start_on_a_busy_slot_is_rejected_naming_what_holds_it(
    base: Path, node: str, job: str
) -> None:
    """The control plane finds the slot's true owner from the agent's own process table."""
    agent, sent = program_agent(base, node, "import time\ntime.sleep(60)\n", slot_wait_seconds=0.2)
    other = f"{job}-b"
    try:
        assert agent.receive(start(job, workers=1)) == "applied", sent.reports
        second = {**start(other, workers=1), "command_id": "c2"}
        assert agent.receive(second) == "rejected"
        [rejected] = sent.of(Rejected)
        assert (rejected.job, rejected.command_type) == (other, "start_workers")
        assert (rejected.busy_slot, rejected.busy_job, rejected.busy_worker) == (0, job, "w0")
    finally:
        agent.close(stop_children=True)
        JobControl(str(settings.REDIS_URL), other).cleanup()


def test_processes_that_outlive_their_finished_event_are_stopped(
    base: Path, node: str, job: str
) -> None:
    """A program writes ``finished`` (the portal frees its GPUs) and trains on: it is stopped."""
    agent, sent = program_agent(base, node, "import time\ntime.sleep(60)\n")
    agent.events.finished_grace_s = 0.5
    try:
        assert agent.receive(start(job, workers=1)) == "applied", sent.reports
        publish(
            redis.Redis.from_url(str(settings.REDIS_URL)),
            JobControl(str(settings.REDIS_URL), job).keys,
            FinishedEvent(step=1, reason="finished"),
        )
        deadline = time.monotonic() + 30
        while not sent.of(WorkerExited):
            assert time.monotonic() < deadline, sent.reports
            agent.tick()
            time.sleep(0.1)
        [exited] = sent.of(WorkerExited)
        assert exited.outcome == "stopped"
    finally:
        agent.close(stop_children=True)
