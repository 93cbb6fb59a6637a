"""The agent's warm worker processes (``workers/agent/warm.py``), with real processes.

With ``AGENT_WARM_WORKERS=1`` the agent keeps a warm process per idle slot;
a built-in workload's worker starts in it (same pid, no new interpreter), the
job trains to its end, and the freed slots get warm processes again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from workers.agent.agent import Agent
from workers.agent.config import AgentConfig, SandboxSettings
from workers.agent.store import AgentStore
from workers.agent.warm import (
    WARM_ENV,
    WarmPool,
    assignment,
    enabled_for,
    enabled_from_env,
    warm_argv,
)
from workers.elastic.control import JobControl
from workers.protocol import Report, WorkerExited


class Collected:
    """The reports an agent sent."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.reports.append(report)


@pytest.fixture
def redis_url() -> str:
    return str(settings.REDIS_URL)


@pytest.fixture
def node(redis_url: str) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    cleanup = redis.Redis.from_url(redis_url, decode_responses=True)
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


def config(node: str, redis_url: str, tmp_path: Path, slots: int = 2) -> AgentConfig:
    """An agent whose sandbox is off: the only one that keeps warm processes."""
    return AgentConfig(
        node=node,
        device="cpu",
        slots=slots,
        redis_url=redis_url,
        data_dir=tmp_path,
        sandbox=SandboxSettings(mode="off"),
    )


def test_warm_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not enabled_from_env({})
    assert enabled_from_env({WARM_ENV: "1"}) and enabled_from_env({WARM_ENV: " yes "})
    assert not enabled_from_env({WARM_ENV: "0"}) and not enabled_from_env({WARM_ENV: "maybe"})


def test_a_sandboxed_agent_keeps_no_warm_process(tmp_path: Path) -> None:
    """A warm process starts before its job is known: it cannot get the job's sandbox."""
    off = config("n", "redis://h/0", tmp_path)
    assert enabled_for(off, {WARM_ENV: "1"}) and not enabled_for(off, {})
    sandboxed = replace(off, sandbox=SandboxSettings(mode="on"))
    assert not enabled_for(sandboxed, {WARM_ENV: "1"})


def test_assignment_is_the_worker_arguments(tmp_path: Path) -> None:
    line = assignment(["/usr/bin/python3", "-m", "workers.elastic.worker", "--job", "j"], "r://u")
    assert line == b'["--job", "j", "--redis-url", "r://u"]\n'
    with pytest.raises(ValueError):
        assignment(["/bin/sh", "-c", "anything"], "r://u")
    conf = config("n", "redis://h/0", tmp_path)
    argv = warm_argv(conf, 1, ("mlp-digits", "{}"))
    expected = ["-m", "workers.elastic.warm", "--device", "cpu"]
    assert argv[1:] == [*expected, "--workload", "mlp-digits", "--args", "{}"]


def test_a_disabled_pool_starts_nothing(tmp_path: Path) -> None:
    pool = WarmPool(config("n", "redis://h/0", tmp_path), enabled=False)
    pool.fill((0, 1))
    assert (
        pool.procs == {} and pool.start(0, ["py", "-m", "m"], "r://u", "mlp-digits", "{}") is None
    )


@pytest.mark.timeout(300)
def test_pool_fills_idle_slots_and_closes_cleanly(tmp_path: Path) -> None:
    pool = WarmPool(config("n", "redis://h/0", tmp_path), enabled=True)
    pool.fill((0, 1))
    first = {slot: warm.popen.pid for slot, warm in pool.procs.items()}
    assert set(first) == {0, 1}
    pool.fill((0, 1))  # already warm: the same processes
    assert {slot: warm.popen.pid for slot, warm in pool.procs.items()} == first
    leaving = pool.procs[1].popen
    pool.fill((0,))  # slot 1 was taken by something else: its warm process ends
    assert set(pool.procs) == {0} and leaving.poll() is not None
    # a malformed assignment: the warm process refuses it (status 2) and never trains
    bad = ["python", "-m", "workers.elastic.worker", "--job", "j", "--worker", "w"]
    warm = pool.start(0, bad, "redis://h/0", "mlp-digits", "{}")
    assert warm is not None and warm.popen.wait(timeout=120) == 2
    assert "required" in warm.log_path.read_text()
    pool.fill((0, 1))
    survivors = [w.popen for w in pool.procs.values()]
    pool.close()
    assert pool.procs == {} and all(p.poll() is not None for p in survivors)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_agent_starts_a_job_in_its_warm_processes(
    node: str, redis_url: str, tmp_path: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WARM_ENV, "1")
    sent = Collected()
    agent = Agent(
        config(node, redis_url, tmp_path), AgentStore.from_url(redis_url, node), send=sent
    )
    try:
        agent.tick()
        warm = {slot: w.popen.pid for slot, w in agent.processes.warm.procs.items()}
        assert set(warm) == {0, 1}
        payload = {
            "type": "start_workers", "job": job, "command_id": "c1", "workload": "mlp-digits",
            "args": {"epochs": 1}, "batch_size": 64, "recovery": "consistent",
            "checkpoint_every": 0, "initial_world": 2,
            "workers": [{"worker_id": f"w{s}", "slot": s} for s in (0, 1)],
        }  # fmt: skip
        assert agent.receive(payload) == "applied"
        started = {r.slot: r.pid for r in agent.processes.records()}
        assert started == warm, "the workers run in the warm processes"
        assert agent.processes.warm.procs == {}
        exited: list[WorkerExited] = []

        def both_exited() -> bool:
            agent.tick()
            exited[:] = [r for r in sent.reports if isinstance(r, WorkerExited)]
            return len(exited) == 2

        wait_for(both_exited, 500, "the job did not finish")
        assert {e.outcome for e in exited} == {"clean"}, exited
        assert JobControl(redis_url, job).status().state == "finished"
        log_text = Path(agent.processes.warm.config.log_path("_warm", "x")).parent
        assert any("--- assigned:" in p.read_text() for p in log_text.glob("*.log"))
        agent.tick()  # the slots are idle again: warm processes for them
        assert set(agent.processes.warm.procs) == {0, 1}
        assert not {w.popen.pid for w in agent.processes.warm.procs.values()} & set(warm.values())
    finally:
        agent.processes.end_all()
    assert agent.processes.warm.procs == {}
