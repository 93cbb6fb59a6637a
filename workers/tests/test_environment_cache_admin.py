"""An admin's view of a node's environment cache: the agent's report, and its eviction.

Against a real ``EnvironmentCache`` in a temporary directory (complete entries
written by hand: a directory with its ``manifest.json``, no uv), the agent's
real command handler and Redis, and a sleeping process standing in for a
worker that runs in an environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from workers.agent.agent import Agent
from workers.agent.cache_report import cache_report
from workers.agent.config import AgentConfig
from workers.agent.environments import EnvironmentCache, EnvironmentSettings
from workers.agent.processes import Child
from workers.agent.store import AgentStore, WorkerRecord
from workers.protocol import (
    MAX_CACHE_ENTRIES,
    MAX_CACHE_REPORT_CHARS,
    CachedEnvironment,
    Command,
    EnvironmentCacheReport,
    EnvironmentEvicted,
    EvictEnvironment,
    ProtocolError,
    Rejected,
    Report,
)

KEY_A = "a" * 32
KEY_B = "b" * 32


class Collected:
    """The reports an agent sent, in order."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.reports.append(report)

    def of(self, kind: type[Report]) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind)]


def make_entry(
    root: Path, key: str, *, packages: list[str], last_used: float, size: int = 1000
) -> Path:
    """A complete environment as the cache leaves one: ``site/`` and its manifest last."""
    path = root / key
    (path / "site").mkdir(parents=True)
    (path / "site" / "payload.bin").write_bytes(b"x" * size)
    manifest = {
        "key": key,
        "requirements": [p.split("==")[0] for p in packages],
        "packages": packages,
        "build_s": 1.5,
        "built_at": last_used - 100,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    os.utime(path, (last_used, last_used))
    return path


@pytest.fixture
def node() -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    cleanup = redis.Redis.from_url(str(settings.REDIS_URL), decode_responses=True)
    for key in cleanup.scan_iter(match=f"agent:{name}:*"):
        cleanup.delete(key)


def make_agent(node: str, tmp_path: Path) -> tuple[Agent, Collected, Path]:
    root = tmp_path / "envs"
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=2,
        redis_url=str(settings.REDIS_URL),
        data_dir=tmp_path,
        environments=EnvironmentSettings(root=root, max_bytes=10**9),
    )
    sent = Collected()
    agent = Agent(config, AgentStore.from_url(str(settings.REDIS_URL), node), send=sent)
    return agent, sent, root


@contextlib.contextmanager
def worker_in(agent: Agent, job: str, key: str, tmp_path: Path) -> Iterator[None]:
    """A process of ``job`` that runs in environment ``key`` on the agent's node."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = WorkerRecord(
            job, "w0", 0, proc.pid, str(tmp_path / "w0.log"), time.time(), environment=key
        )
        agent.processes.children[(job, "w0")] = Child(record=record, popen=proc)
        yield
    finally:
        agent.processes.children.pop((job, "w0"), None)
        proc.kill()
        proc.wait(timeout=10)


def evict(key: str, command_id: str = "e1") -> dict[str, Any]:
    return {"type": "evict_environment", "job": "node", "command_id": command_id, "key": key}


# --------------------------------------------------------------------------- the protocol


def entry(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"key": KEY_A, "size_bytes": 10, "last_used": 1.7e9}
    fields.update(overrides)
    return fields


def cache_dict(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "type": "environment_cache",
        "node": "gpu-1",
        "max_bytes": 100,
        "total_bytes": 10,
        "entries": [entry()],
    }
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    "bad",
    [
        {"entries": [entry(key="../../etc")]},
        {"entries": [entry(key="A" * 32)]},
        {"entries": [entry(size_bytes=-1)]},
        {"entries": [entry(size_bytes=2**63)]},
        {"entries": [entry(last_used=float("nan"))]},
        {"entries": [entry(last_used=-5)]},
        {"entries": [entry(packages=["x" * 201])]},
        {"entries": [entry(packages=[f"p{i}==1" for i in range(1001)])]},
        {"entries": [entry(requirements=["r" * 401])]},
        {"entries": [entry(), entry()]},  # one key twice
        {"entries": [entry(key=f"{i:032x}") for i in range(MAX_CACHE_ENTRIES + 1)]},
        {"entries": [entry(in_use="yes")]},
        {"entries": [entry(unknown=1)]},
        {"max_bytes": -1},
        {"total_bytes": "big"},
        {"omitted": -2},
        {"node": "../x"},
        {"entries": "none"},
    ],
)
def test_a_malformed_cache_report_does_not_parse(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        Report.from_dict(cache_dict(**bad))


def test_a_cache_report_carries_a_bounded_amount_of_text() -> None:
    """Each entry within its own bounds, yet all of them together over the report's."""
    packages = [f"{'p' * 190}=={i}" for i in range(1000)]  # ~196 KB per entry
    entries = [entry(key=f"{i:032x}", packages=packages) for i in range(2)]
    assert sum(len(p) for p in packages) * 2 > MAX_CACHE_REPORT_CHARS
    with pytest.raises(ProtocolError, match="more than"):
        Report.from_dict(cache_dict(entries=entries))


def test_an_eviction_names_a_key_and_no_job() -> None:
    assert Command.from_dict(evict(KEY_A)) == EvictEnvironment(command_id="e1", key=KEY_A)
    for bad in (evict("../" + "a" * 29), evict(KEY_A) | {"job": "job-1"}, evict("")):
        with pytest.raises(ProtocolError):
            Command.from_dict(bad)


# --------------------------------------------------------------------------- the report


def test_the_report_lists_the_cache_most_recent_first_with_its_manifests(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    make_entry(root, KEY_A, packages=["six==1.16.0"], last_used=1_700_000_000)
    make_entry(root, KEY_B, packages=["attrs==23.1.0", "idna==3.6"], last_used=1_700_000_500)
    (root / f".build-{'c' * 32}-0000").mkdir()  # a build under way: no entry
    cache = EnvironmentCache(EnvironmentSettings(root=root, max_bytes=5000))
    report = cache_report("gpu-1", cache, in_use={KEY_A})
    assert [e.key for e in report.entries] == [KEY_B, KEY_A]
    newest, oldest = report.entries
    assert newest.packages == ("attrs==23.1.0", "idna==3.6")
    assert newest.requirements == ("attrs", "idna") and newest.build_s == 1.5
    assert newest.built_at == 1_700_000_400 and not newest.in_use
    assert oldest.in_use and oldest.size_bytes >= 1000
    assert report.total_bytes == newest.size_bytes + oldest.size_bytes
    assert report.max_bytes == 5000 and report.omitted == 0
    assert Report.from_dict(json.loads(report.to_json())) == report  # what the portal parses


def test_a_damaged_manifest_costs_its_details_not_the_report(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    path = make_entry(root, KEY_A, packages=["six==1.16.0"], last_used=1_700_000_000)
    (path / "manifest.json").write_text('{"packages": [1, "x' + "y" * 300 + '"], "build_s": 1e99}')
    cache = EnvironmentCache(EnvironmentSettings(root=root))
    [listed] = cache_report("gpu-1", cache, in_use=()).entries
    assert listed == CachedEnvironment(key=KEY_A, size_bytes=listed.size_bytes, last_used=1.7e9)


def test_the_agent_reports_its_cache_at_start_and_marks_what_its_workers_use(
    node: str, tmp_path: Path
) -> None:
    agent, sent, root = make_agent(node, tmp_path)
    make_entry(root, KEY_A, packages=["six==1.16.0"], last_used=1_700_000_000)
    make_entry(root, KEY_B, packages=["idna==3.6"], last_used=1_700_000_100)
    with worker_in(agent, "job-1", KEY_A, tmp_path):
        agent.tick()  # the first pass reports, in a thread of its own
        agent._cache_thread.join(timeout=30)
        [report] = sent.of(EnvironmentCacheReport)
        assert report.node == node
        assert {e.key: e.in_use for e in report.entries} == {KEY_A: True, KEY_B: False}
        agent.tick()  # not again before CACHE_REPORT_EVERY_S
        agent._cache_thread.join(timeout=30)
        assert len(sent.of(EnvironmentCacheReport)) == 1


# --------------------------------------------------------------------------- eviction


def test_an_eviction_removes_the_directory_and_is_answered(node: str, tmp_path: Path) -> None:
    agent, sent, root = make_agent(node, tmp_path)
    path = make_entry(root, KEY_A, packages=["six==1.16.0"], last_used=1_700_000_000)
    make_entry(root, KEY_B, packages=["idna==3.6"], last_used=1_700_000_100)
    assert agent.receive(evict(KEY_A)) == "applied"
    assert not path.exists() and (root / KEY_B).is_dir()
    [answer] = sent.of(EnvironmentEvicted)
    assert (answer.command_id, answer.key, answer.outcome) == ("e1", KEY_A, "evicted")
    assert agent.receive(evict(KEY_A)) == "replayed"  # once per command id
    assert len(sent.of(EnvironmentEvicted)) == 1


def test_an_eviction_of_a_key_a_worker_runs_in_is_refused(node: str, tmp_path: Path) -> None:
    agent, sent, root = make_agent(node, tmp_path)
    path = make_entry(root, KEY_A, packages=["six==1.16.0"], last_used=1_700_000_000)
    with worker_in(agent, "job-7", KEY_A, tmp_path):
        assert agent.receive(evict(KEY_A)) == "rejected"
    assert (path / "manifest.json").is_file()  # untouched
    [answer] = sent.of(EnvironmentEvicted)
    assert answer.outcome == "in_use" and "job-7/w0" in answer.detail


def test_an_eviction_of_a_key_the_cache_lacks_says_so(node: str, tmp_path: Path) -> None:
    agent, sent, _ = make_agent(node, tmp_path)
    assert agent.receive(evict(KEY_B)) == "rejected"
    [answer] = sent.of(EnvironmentEvicted)
    assert answer.outcome == "not_found"


def test_a_malformed_eviction_is_rejected_and_removes_nothing(node: str, tmp_path: Path) -> None:
    agent, sent, root = make_agent(node, tmp_path)
    path = make_entry(root, KEY_A, packages=["six==1.16.0"], last_used=1_700_000_000)
    for bad in (evict(".."), evict(KEY_A) | {"job": "job-1"}, evict(KEY_A) | {"path": "/"}):
        assert agent.receive(bad) == "rejected"
    assert (path / "manifest.json").is_file()
    assert len(sent.of(Rejected)) == 3 and not sent.of(EnvironmentEvicted)
