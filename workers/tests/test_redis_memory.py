"""A job that fills the shared Redis: refused, measured and stopped, the portal's keys kept.

On an embedded server of the test's own (``utilities.embedded_redis``) with a
small ``maxmemory``; the shared server of ``REDIS_URL`` is never reconfigured.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.own_redis import own_embedded_redis
from tests.redis_clients import one_try
from workers.agent.redis_acl import (
    JobBudget,
    job_footprint,
    job_url,
    job_user,
    memory_pressure,
    stop_job_user,
)

LIMIT_MB = 32


@pytest.fixture
def small_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An embedded server of the test's own, configured from the environment as ``runstack``'s
    is, with ``REDIS_MAXMEMORY_MB`` set small."""
    monkeypatch.setenv("REDIS_MAXMEMORY_MB", str(LIMIT_MB))
    with own_embedded_redis(tmp_path) as url:
        yield url


def portal_keys(admin: redis.Redis) -> dict[str, object]:
    """What the portal keeps: a queued report, a Celery binding, the agents' secret."""
    return {
        "portal": admin.lrange("portal", 0, -1),
        "_kombu.binding.portal": admin.smembers("_kombu.binding.portal"),
        "agent:acl:secret": admin.get("agent:acl:secret"),
    }


def test_a_job_that_fills_the_server_is_refused_and_the_portals_keys_stay(
    small_server: str,
) -> None:
    admin = redis.Redis.from_url(small_server)
    admin.rpush("portal", "a queued report")
    admin.sadd("_kombu.binding.portal", "portal\x06\x16\x06\x16portal")
    tenant = redis.Redis.from_url(job_url(admin, small_server, "hog"), retry=one_try().get_retry())
    before = portal_keys(admin)
    assert before["agent:acl:secret"] is not None

    # One command, one huge string: not a right of a job's user.
    with pytest.raises(redis.exceptions.NoPermissionError):
        tenant.setrange("edl:hog:big", 500 * 2**20, "x")

    # Many appends: refused once the server is full (four times its limit at most is tried).
    chunk = b"x" * 2**20
    refused: Exception | None = None
    for n in range(4 * LIMIT_MB):
        try:
            tenant.append(f"edl:hog:part{n // 4}", chunk)
        except redis.exceptions.OutOfMemoryError as exc:
            refused = exc
            break
    assert refused is not None, f"{4 * LIMIT_MB} MB written by one job, never refused"
    assert portal_keys(admin) == before  # noeviction: nothing of the portal's was dropped

    # The agent's guard: the job holds more than its share; stopping it frees the server.
    assert memory_pressure(admin) > 0.9
    footprint = job_footprint(admin, "hog")
    assert footprint.connections == 1 and footprint.keys >= 4
    budget = JobBudget.of_server(admin)
    assert budget.max_bytes == LIMIT_MB * 2**20 // 4
    reason = budget.refusal(footprint)
    assert reason is not None and "job hog holds" in reason
    assert stop_job_user(admin, "hog") == footprint.keys
    assert job_user("hog") not in admin.acl_users()
    with pytest.raises(redis.exceptions.ConnectionError):  # its connection was closed
        tenant.ping()
    assert admin.rpush("portal", "the next report") == 2  # the portal writes again
    assert memory_pressure(admin) < 0.5
    assert job_footprint(admin, "hog").bytes == 0


def test_a_job_within_its_share_is_not_refused(small_server: str) -> None:
    admin = redis.Redis.from_url(small_server)
    tenant = redis.Redis.from_url(job_url(admin, small_server, "calm"))
    tenant.set("edl:calm:state", b"x" * 2**20)
    footprint = job_footprint(admin, "calm")
    assert footprint.keys == 1 and 2**20 <= footprint.key_bytes < 2 * 2**20
    assert JobBudget.of_server(admin).refusal(footprint) is None
    assert JobBudget(max_bytes=2**20, max_connections=100).refusal(footprint) is not None
    many = [redis.Redis.from_url(job_url(admin, small_server, "calm")) for _ in range(5)]
    try:
        for client in many:
            client.ping()
        crowded = job_footprint(admin, "calm")
        assert crowded.connections == 6
        reason = JobBudget(max_bytes=2**30, max_connections=5).refusal(crowded)
        assert reason is not None and "6 Redis connections" in reason
    finally:
        for client in many:
            client.close()


def test_an_agents_heartbeat_stops_a_job_over_its_share_and_never_makes_its_user_again(
    small_server: str, tmp_path: Path
) -> None:
    """The guard wired: a job that fills the server is failed by its agent with the reason,
    its user and keys go, a neighbour within its share keeps running, the portal writes again."""
    from workers.agent.agent import Agent
    from workers.agent.config import AgentConfig
    from workers.agent.store import AgentStore
    from workers.protocol import Failed, Report

    admin = redis.Redis.from_url(small_server)
    hog = redis.Redis.from_url(job_url(admin, small_server, "hog"), retry=one_try().get_retry())
    calm = redis.Redis.from_url(job_url(admin, small_server, "calm"))
    calm.set("edl:calm:state", b"x" * 2**20)
    chunk = b"x" * 2**20
    for n in range(4 * LIMIT_MB):
        try:
            hog.append(f"edl:hog:part{n // 4}", chunk)
        except redis.exceptions.OutOfMemoryError:
            break
    assert memory_pressure(admin) > 0.9
    sent: list[Report] = []
    config = AgentConfig(
        node="guard-node", device="cpu", slots=1, redis_url=small_server, data_dir=tmp_path / "d"
    )
    agent = Agent(config, AgentStore.from_url(small_server, "guard-node"), send=sent.append)
    agent.processes.job_users.update({"hog", "calm"})
    agent.tick()  # the first pass beats, and guards
    failed = [r for r in sent if isinstance(r, Failed)]
    assert [f.job for f in failed] == ["hog"], sent
    assert "job hog holds" in failed[0].error and "shared Redis" in failed[0].error
    users = admin.acl_users()
    assert job_user("hog") not in users and job_user("calm") in users
    assert admin.exists("edl:calm:state") and not list(admin.scan_iter("edl:hog:*"))
    assert admin.rpush("portal", "the next report") >= 1
    agent.heartbeat()
    agent._restore_job_users()
    assert job_user("hog") not in admin.acl_users()  # never made again while it is here
