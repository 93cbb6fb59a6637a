"""Cleaning a node: ended jobs' directories, shipped logs and unused bundles go; nothing else.

The rule is tested pure; the agent's sweep on real directories and the
agent's real Redis offsets (the log shipper's).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from workers.agent.agent import Agent
from workers.agent.cleanup import CleanupSettings, Leftover, doomed
from workers.agent.config import AgentConfig
from workers.agent.log_shipper import LogPosition
from workers.agent.store import AgentStore, StopRecord

DAY = 24 * 3600.0
NOW = 10 * DAY


def item(kind: str, name: str, age_days: float, size: int = 10, shipped: bool = True) -> Leftover:
    return Leftover(kind, name, Path(f"/n/{kind}/{name}"), size, NOW - age_days * DAY, shipped)  # type: ignore[arg-type]


def names(items: list[Leftover]) -> list[str]:
    return [f"{i.kind}:{i.name}" for i in items]


def test_old_ended_jobs_go_and_busy_jobs_unshipped_logs_and_recent_ones_stay() -> None:
    every = [
        item("job", "old", 2),
        item("log", "old", 2),
        item("job", "running", 5),
        item("log", "unshipped", 3, shipped=False),
        item("job", "recent", 0.5),
        item("code", "unused", 4),
        item("code", "in-use", 4),
    ]
    chosen = doomed(
        every,
        now=NOW,
        settings=CleanupSettings(keep_s=DAY, max_bytes=10**9),
        busy_jobs=frozenset({"running"}),
        busy_codes=frozenset({"in-use"}),
    )
    assert names(chosen) == ["code:unused", "job:old", "log:old"]


def test_over_the_size_cap_the_least_recently_used_go_first_until_it_fits() -> None:
    every = [
        item("job", "a", 0.10, size=40),
        item("job", "b", 0.20, size=40),
        item("job", "c", 0.30, size=40),
        item("job", "busy", 0.9, size=40),  # counts, but stays
    ]
    chosen = doomed(
        every,
        now=NOW,
        settings=CleanupSettings(keep_s=DAY, max_bytes=100),
        busy_jobs=frozenset({"busy"}),
        busy_codes=frozenset(),
    )
    assert names(chosen) == ["job:c", "job:b"]  # 160 -> 80 bytes: the two oldest unused


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    node = f"clean-{uuid.uuid4().hex[:8]}"
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=1,
        redis_url=str(settings.REDIS_URL),
        data_dir=tmp_path / "data",
        cleanup=CleanupSettings(keep_s=DAY, max_bytes=10**12),
    )
    made = Agent(config, AgentStore.from_url(config.redis_url, node), send=lambda _r: None)
    yield made
    client = redis.Redis.from_url(config.redis_url)
    for key in client.scan_iter(match=f"agent:{node}:*"):
        client.delete(key)


def aged(path: Path, days: float) -> Path:
    """Make ``path`` (made if missing) and everything below it ``days`` old."""
    path.mkdir(parents=True, exist_ok=True)
    when = time.time() - days * DAY
    for current, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(current, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when))
    return path


def test_the_agents_sweep_removes_ended_jobs_files_and_shipped_logs_and_follows_no_link(
    agent: Agent, tmp_path: Path
) -> None:
    data = agent.config.data_dir
    outside = tmp_path / "outside.txt"
    outside.write_text("not the node's")
    old = data / "jobs" / "job-old"
    (old / "scratch" / "w0").mkdir(parents=True)
    (old / "scratch" / "w0" / "big.bin").write_bytes(b"x" * 1000)
    os.symlink(outside, old / "scratch" / "w0" / "link")  # planted by the program
    os.symlink(tmp_path, old / "artifacts")
    aged(old, 2)
    recent = data / "jobs" / "job-recent"
    (recent / "checkpoints").mkdir(parents=True)
    stopping = aged(data / "jobs" / "job-stopping", 3)
    agent.processes.stops["job-stopping"] = StopRecord(command_id="c1", deadline=0.0)
    logs = data / "logs" / f"agent-{agent.config.node}"
    shipped_log = logs / "job-old" / "w0.log"
    unshipped_log = logs / "job-unshipped" / "w0.log"
    for path in (shipped_log, unshipped_log):
        path.parent.mkdir(parents=True)
        path.write_text("line\n" * 10)
    inode = shipped_log.stat().st_ino
    agent.logs.offsets.save("job-old", "w0", LogPosition("id", inode, 50))
    agent.logs.offsets.save("job-unshipped", "w0", LogPosition("id2", 1, 20))
    aged(logs / "job-old", 2)
    aged(logs / "job-unshipped", 2)
    code = aged(data / "code" / ("ab" * 32), 5)

    removed = agent.clean()

    assert sorted(f"{r.kind}:{r.name}" for r in removed) == [
        f"code:{'ab' * 32}",
        "job:job-old",
        "log:job-old",
    ]
    assert not old.exists() and not (logs / "job-old").exists() and not code.exists()
    assert outside.read_text() == "not the node's" and tmp_path.is_dir()  # no link followed
    assert recent.is_dir() and stopping.is_dir() and unshipped_log.exists()
    assert agent.logs.offsets.get("job-old", "w0") is None  # its offset is forgotten too
    assert agent.logs.offsets.get("job-unshipped", "w0") is not None
    assert agent.clean() == []  # nothing more to do
