"""An agent logged into Redis as its own user (``agent-<node>``) leaves users to the control plane.

Its user may not read the agents' secret, run ``ACL`` or measure the server
(``redis_acl.agent_rules``): its heartbeat must neither fail nor log a
warning every beat trying to restore or guard job users, and a job that ends
on its node keeps its user for the control plane to delete.  On the real
Redis 7 of ``REDIS_URL`` (skipped without it, or on an older server).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from workers.agent.agent import Agent
from workers.agent.celery_app import make_app
from workers.agent.config import AgentConfig
from workers.agent.redis_acl import (
    agent_url,
    delete_agent_user,
    delete_job_user,
    ensure_agent_user,
    ensure_job_user,
    job_user,
)
from workers.agent.store import AgentStore
from workers.protocol import EnvironmentCacheReport, Heartbeat, Report


@dataclass(frozen=True)
class OwnUser:
    """A node, a job it hosts, its agent user's URL and the portal's client."""

    node: str
    job: str
    url: str
    admin: redis.Redis


@pytest.fixture
def own_user() -> Iterator[OwnUser]:
    base = os.environ.get("REDIS_URL")
    if not base:
        pytest.skip("no REDIS_URL: agents' own users are tried on the shared Redis 7")
    admin = redis.Redis.from_url(base)
    if int(str(admin.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("agents' own users need Redis 7's key selectors")
    tag = uuid.uuid4().hex[:8]
    node, job = f"own-{tag}", f"job-own-{tag}"
    ensure_job_user(admin, job)  # as the control plane makes it at dispatch
    ensure_agent_user(admin, node, jobs=(job,), send_to=(f"reports-{tag}",))
    yield OwnUser(node, job, agent_url(base, admin, node), admin)
    delete_agent_user(admin, node)
    delete_job_user(admin, job)
    for key in admin.scan_iter(match=f"*{tag}*"):
        admin.delete(key)


def test_on_its_own_user_the_agent_neither_restores_nor_guards_nor_deletes_job_users(
    own_user: OwnUser, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[Report] = []
    config = AgentConfig(
        node=own_user.node, device="cpu", slots=1, redis_url=own_user.url, data_dir=tmp_path
    )
    agent = Agent(config, AgentStore.from_url(own_user.url, own_user.node), send=sent.append)
    assert agent.on_own_redis_user
    agent.processes.job_users.add(own_user.job)
    own_user.admin.execute_command("ACL", "DELUSER", job_user(own_user.job))  # type: ignore[no-untyped-call]
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            agent.tick()
            agent.heartbeat()
            agent._restore_job_users()
            agent._guard_redis()
    agent._cache_thread.join(timeout=30)  # its environment cache report, sent at start
    assert [r for r in sent if not isinstance(r, Heartbeat | EnvironmentCacheReport)] == []
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == []  # no NOPERM, no warning per beat (the start's INFO lines may be there)
    assert job_user(own_user.job) not in own_user.admin.acl_users()  # the control plane's to do

    ensure_job_user(own_user.admin, own_user.job)
    agent._drop_job_user(own_user.job)  # the job ended here: no ACL DELUSER tried
    assert job_user(own_user.job) in own_user.admin.acl_users()
    assert own_user.job not in agent.processes.job_users


def test_the_agents_app_on_its_own_user_declares_nothing_and_sends_no_events(
    own_user: OwnUser,
) -> None:
    app = make_app(own_user.url, {})
    assert app.conf.broker_transport == "workers.agent.broker_redis:Transport"
    options = app.conf.broker_transport_options
    assert options["unacked_key"] == f"agent:{own_user.node}:unacked"
    assert not app.conf.worker_enable_remote_control
    assert all(app.amqp.queues[name].no_declare for name in ("portal", "heartbeats", "other"))
    with app.connection_for_write() as conn:
        dispatcher = app.events.Dispatcher(conn, enabled=True)
        assert not dispatcher.enabled  # a worker heartbeat would be a PUBLISH: refused
    portal_app = make_app(str(os.environ["REDIS_URL"]), {})
    assert portal_app.conf.broker_transport is None
    assert not portal_app.amqp.queues["portal"].no_declare
