"""A job's event stream is the tenant program's to write: the agent treats it as untrusted input.

Each test writes to the stream what a hostile ``edl`` program can write with
its own Redis user (raw ``XADD``), then runs a real agent pass against the
real Redis: the pass never raises, the heartbeat goes out, the bad entry is
dropped and counted, and the good entries after it still reach the portal.
Reports are sealed with the real signing code, as ``send_report`` does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from workers.agent.agent import Agent
from workers.agent.config import AgentConfig
from workers.agent.events import EventForwarder, default_control_factory
from workers.agent.store import AgentStore
from workers.clock import ManualClock
from workers.elastic.control import JobControl
from workers.elastic.keys import JobKeys
from workers.job_events import MAX_EVENT_BYTES, EventBudget
from workers.protocol import Heartbeat, Progress, Report
from workers.signing import seal

KEY = b"k" * 32


class Sealed:
    """The reports an agent sent, each sealed first exactly as ``send_report`` seals it."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        seal(report.to_dict(), node=report.node, key=KEY, now=time.time())
        self.reports.append(report)

    def of(self, kind: type[Report]) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind)]

    def typed(self, name: str) -> list[Any]:
        return [r for r in self.reports if name == r.TYPE]


@pytest.fixture
def redis_url() -> str:
    return str(settings.REDIS_URL)


@pytest.fixture
def raw(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def node(redis_url: str) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    cleanup = redis.Redis.from_url(redis_url)
    for key in cleanup.scan_iter(match=f"agent:{name}:*"):
        cleanup.delete(key)


@pytest.fixture
def job(redis_url: str) -> Iterator[str]:
    name = f"job-{uuid.uuid4().hex[:8]}"
    yield name
    JobControl(redis_url, name).cleanup()
    cleanup = redis.Redis.from_url(redis_url)
    for key in cleanup.scan_iter(match=f"agent:forwarded:{name}:*"):
        cleanup.delete(key)


def watched_agent(node: str, job: str, redis_url: str, tmp_path: Path) -> tuple[Agent, Sealed]:
    """A real agent that tails ``job``'s stream from its current end."""
    config = AgentConfig(node=node, device="cpu", slots=2, redis_url=redis_url, data_dir=tmp_path)
    sent = Sealed()
    agent = Agent(config, AgentStore.from_url(redis_url, node), send=sent, clock=ManualClock())
    agent.events.watch(job)
    return agent, sent


def events_key(job: str) -> str:
    return JobKeys(job).events


def xadd(raw: redis.Redis, job: str, fields: Mapping[Any, Any]) -> str:
    added: Any = raw.xadd(events_key(job), dict(fields))
    return added.decode() if isinstance(added, bytes) else str(added)


def progress(step: int) -> dict[str, str]:
    data = {"step": step, "samples_per_s": 10.0, "loss": 1.0, "world": 1, "generation": 0}
    return {"kind": "progress", "data": json.dumps(data)}


POISON: dict[str, dict[bytes | str, bytes | str]] = {
    # Valid JSON: "\ud800" decodes to a lone surrogate, which no UTF-8 encoder takes.
    "lone surrogate": {"kind": "failed", "data": '{"worker": "w0", "error": "\\ud800"}'},
    "surrogate in a key": {"kind": "progress", "data": '{"\\udfff": 1}'},
    "not UTF-8": {b"kind": b"failed", b"data": b'{"worker": "w0", "error": "\xff\xfe"}'},
    "not JSON": {"kind": "progress", "data": "{not json"},
    "not an object": {"kind": "progress", "data": "[1, 2, 3]"},
    "too deep": {"kind": "progress", "data": "[" * 200_000 + "]" * 200_000},
    "too big": {
        "kind": "failed",
        "data": json.dumps({"worker": "w0", "error": "x" * MAX_EVENT_BYTES}),
    },
    "unknown fields": {"kind": "progress", "data": "{}", "extra": "1"},
    "unknown kind": {"kind": "\ud800".encode("utf-8", "surrogatepass"), "data": "{}"},
    "wrong types": {"kind": "progress", "data": '{"step": "x", "samples_per_s": 1, "world": 1}'},
}


@pytest.mark.parametrize("name", sorted(POISON))
def test_a_poisoned_event_is_dropped_and_the_pass_still_heartbeats(
    name: str, node: str, job: str, redis_url: str, raw: redis.Redis, tmp_path: Path
) -> None:
    agent, sent = watched_agent(node, job, redis_url, tmp_path)
    xadd(raw, job, POISON[name])
    xadd(raw, job, progress(7))
    agent.tick()  # must not raise
    assert sent.of(Heartbeat), "the pass ended before its heartbeat"
    assert [r.step for r in sent.of(Progress)] == [7], "the good event after it was lost"
    [dropped] = sent.typed("events_dropped")
    assert dropped.job == job and dropped.count == 1
    assert dropped.reason


def test_one_poisoned_event_per_pass_never_silences_the_node(
    node: str, job: str, redis_url: str, raw: redis.Redis, tmp_path: Path
) -> None:
    """Every pass finds a fresh bad entry; every heartbeat still goes out, the count adds up."""
    agent, sent = watched_agent(node, job, redis_url, tmp_path)
    clock = agent.clock
    assert isinstance(clock, ManualClock)
    for _ in range(3):
        agent.events.watch(job)  # a job with no process here is forgotten by each pass
        xadd(raw, job, POISON["lone surrogate"])
        clock.advance(agent.config.heartbeat_seconds)
        agent.tick()
    assert len(sent.of(Heartbeat)) == 3
    assert sum(r.count for r in sent.typed("events_dropped")) == 3


def test_an_entry_id_in_the_future_is_dropped(
    node: str, job: str, redis_url: str, raw: redis.Redis, tmp_path: Path
) -> None:
    """An id the writer chose far ahead would make every later event look old to the portal."""
    agent, sent = watched_agent(node, job, redis_url, tmp_path)
    far = f"{int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000}-0"
    raw.xadd(events_key(job), progress(3), id=far)  # type: ignore[arg-type]
    agent.tick()
    assert not sent.of(Progress)
    [dropped] = sent.typed("events_dropped")
    assert "future" in dropped.reason


def test_a_flood_is_read_in_bounded_passes_and_cut_at_the_job_rate(
    node: str, job: str, redis_url: str, raw: redis.Redis, tmp_path: Path
) -> None:
    """A job writing thousands of events gets its rate; the rest is dropped and counted."""
    clock = ManualClock(start=time.time())  # entry ids are Redis's wall-clock milliseconds
    store = AgentStore.from_url(redis_url, node)
    sent = Sealed()
    forwarder = EventForwarder(
        node,
        store,
        default_control_factory(redis_url),
        sent,
        clock=clock,
        budget=EventBudget(events_per_s=5, burst_events=50),
    )
    forwarder.watch(job)
    pipe = raw.pipeline()
    for step in range(1, 1001):
        pipe.xadd(events_key(job), progress(step))  # type: ignore[arg-type]
    pipe.execute()
    forwarder.forward(job)  # one pass reads a bounded slice of the stream
    assert len(sent.of(Progress)) == 50
    first = sent.typed("events_dropped")
    assert first and first[0].count > 0 and "rate" in first[0].reason
    for _ in range(10):
        clock.advance(2.0)  # 10 more events of budget each time
        forwarder.forward(job)
    forwarder.forget(job)
    forwarded = len(sent.of(Progress))
    dropped = sum(r.count for r in sent.typed("events_dropped"))
    assert forwarded + dropped == 1000
    assert forwarded <= 50 + 5 * 20


def test_a_hostile_job_leaves_its_neighbours_events_and_the_heartbeat_alone(
    node: str, job: str, redis_url: str, raw: redis.Redis, tmp_path: Path
) -> None:
    """Two tenants' jobs on one node: one floods and corrupts its stream, the other trains on."""
    agent, sent = watched_agent(node, job, redis_url, tmp_path)
    neighbour = f"{job}-n"
    try:
        agent.events.watch(neighbour)
        pipe = raw.pipeline()
        for step in range(3000):
            pipe.xadd(events_key(job), progress(step))  # type: ignore[arg-type]
            pipe.xadd(events_key(job), POISON["lone surrogate"])  # type: ignore[arg-type]
        pipe.execute()
        for name in sorted(POISON):
            xadd(raw, job, POISON[name])
        xadd(raw, neighbour, progress(41))
        agent.tick()
        assert sent.of(Heartbeat)
        mine = [r for r in sent.of(Progress) if r.job == neighbour]
        assert [r.step for r in mine] == [41]
        hostile = [r for r in sent.reports if getattr(r, "job", None) == job]
        assert len(hostile) <= 101  # one pass reads a bounded slice, plus its drop count
    finally:
        JobControl(redis_url, neighbour).cleanup()
        for key in raw.scan_iter(match=f"agent:forwarded:{neighbour}:*"):
            raw.delete(key)


@pytest.mark.parametrize(
    ("launcher", "said"),
    [
        ("edl", "did it call `edl.run`?"),
        ("torchrun", None),
        ("session", None),  # a lab its user shut down: the control plane judges the exit
    ],
)
def test_clean_exits_without_a_runtime_fail_an_edl_program_only(
    node: str, job: str, redis_url: str, launcher: str, said: str | None
) -> None:
    forwarder = EventForwarder(
        node, AgentStore.from_url(redis_url, node), default_control_factory(redis_url), Sealed()
    )
    watch = forwarder.watch(job)
    watch.launcher = launcher
    watch.clean_exits.add("w0")
    reason = forwarder.lost_reason(watch)
    assert reason == said or (said is not None and reason is not None and said in reason)
