"""An agent's own Redis user (``agent_rules``): can kombu's Redis transport live with it?

Tried on a real Redis 7 (key selectors) with kombu itself: the agent consumes
its command queue and acknowledges with its own unacked keys, publishes a
report, and is refused everything else — another agent's queue, reading or
deleting the reports queue, kombu's shared ``unacked`` hash, the agents' ACL
secret, a job it does not run, scripts, channels.  The queues are the test's
own (never the portal's real ``portal`` queue on a shared server).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kombu
import pytest
import redis
from django.conf import settings

from workers.agent.broker_redis import Transport
from workers.agent.redis_acl import agent_rules, agent_unacked_keys, agent_user, url_for

broker: Any = kombu  # kombu is only partly typed: its objects are used as Any here


@dataclass(frozen=True)
class Setup:
    """Two nodes' names, a reports queue of the test's own, the admin URL and client."""

    node: str
    other: str
    reports: str
    url: str
    admin: redis.Redis


def _direct(name: str) -> Any:
    """A queue bound to a direct exchange of its own name (as Celery declares ``agent.N``)."""
    return broker.Queue(name, broker.Exchange(name, type="direct"), routing_key=name)


@pytest.fixture
def setup() -> Iterator[Setup]:
    url = str(settings.REDIS_URL)
    admin = redis.Redis.from_url(url)
    if int(str(admin.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("per-agent users need Redis 7's key selectors (the embedded server is 6.2)")
    tag = uuid.uuid4().hex[:8]
    made = Setup(f"n1-{tag}", f"n2-{tag}", f"reports-{tag}", url, admin)
    yield made
    admin.execute_command("ACL", "DELUSER", agent_user(made.node))  # type: ignore[no-untyped-call]
    for pattern in (f"*{made.node}*", f"*{made.other}*", f"*{made.reports}*"):
        for key in admin.scan_iter(match=pattern):
            admin.delete(key)


def test_an_agent_user_serves_its_queue_and_sends_reports_and_reaches_nothing_else(
    setup: Setup,
) -> None:
    node, admin = setup.node, setup.admin
    job, foreign_job = f"job-{node}", f"job-{setup.other}"
    rules = agent_rules(node, "agent-pw", jobs=(job,), send_to=(setup.reports,))
    admin.execute_command("ACL", "SETUSER", agent_user(node), *rules)  # type: ignore[no-untyped-call]
    agent_url = url_for(setup.url, agent_user(node), "agent-pw")

    # The control plane's side: its worker declared the reports queue; it sends a command.
    commands, reports = _direct(f"agent.{node}"), _direct(setup.reports)
    with broker.Connection(setup.url) as portal:
        reports(portal.default_channel).declare()
        broker.Producer(portal).publish(
            {"type": "stop_job"},
            exchange=commands.exchange,
            routing_key=commands.routing_key,
            declare=[commands],
        )

    received: list[Any] = []

    def on_command(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    with broker.Connection(agent_url, transport_options=agent_unacked_keys(node)) as conn:
        with broker.Consumer(conn, [commands], callbacks=[on_command]):
            conn.drain_events(timeout=5)
        broker.Producer(conn).publish(
            {"type": "report"}, exchange=reports.exchange, routing_key=reports.routing_key,
            declare=[],  # the agent declares nothing it sends to: binding tables are read-only
        )  # fmt: skip
    assert received == [{"type": "stop_job"}]
    assert admin.llen(setup.reports) == 1
    assert admin.zcard(f"agent:{node}:unacked_index") == 0  # acknowledged, in its own keys

    agent = redis.Redis.from_url(agent_url)
    assert agent.set(f"edl:{job}:k", "v")  # a job it runs: its keys, its network's
    assert agent.hincrby(f"agent:net:{job}", "next", 1) == 1
    allowed = []
    for command in (
        ("LPOP", setup.reports),
        ("LRANGE", setup.reports, "0", "-1"),
        ("DEL", setup.reports),
        ("RPOP", f"agent.{setup.other}"),
        ("HGETALL", "unacked"),
        ("GET", "agent:acl:secret"),
        ("GET", f"edl:{foreign_job}:k"),
        ("HGETALL", f"agent:net:{foreign_job}"),
        ("SADD", f"_kombu.binding.{setup.reports}", "hijack"),
        ("EVAL", "return 1", "0"),
        ("PUBLISH", "/0.celery.pidbox", "x"),
        ("KEYS", "*"),
        ("ACL", "SETUSER", agent_user(node), "~*"),
    ):
        with contextlib.suppress(redis.exceptions.NoPermissionError):
            allowed.append((command, agent.execute_command(*command)))  # type: ignore[no-untyped-call]
    assert allowed == [], f"an agent's user may run these: {allowed}"
    assert admin.llen(setup.reports) == 1  # still there


TAKE_AND_DIE = """
import json, os
import kombu
options = json.loads(os.environ["OPTIONS"])
conn = kombu.Connection(os.environ["AGENT_URL"], transport_options=options)
assert conn.default_channel.basic_get(os.environ["QUEUE"], no_ack=False) is not None
os._exit(0)  # dies holding it: nothing acknowledged, nothing given back
"""


def test_an_agent_user_restores_its_unacknowledged_commands_without_scripts(
    setup: Setup,
) -> None:
    """What a consumer took and never acknowledged (it died) goes back to its queue.  kombu's
    stock transport needs EVALSHA for that (redis-py's lock release); the agent's transport
    (``broker_redis``) does it with a transaction."""
    node, admin = setup.node, setup.admin
    admin.execute_command("ACL", "SETUSER", agent_user(node), *agent_rules(node, "agent-pw"))  # type: ignore[no-untyped-call]
    agent_url = url_for(setup.url, agent_user(node), "agent-pw")
    commands = _direct(f"agent.{node}")
    with broker.Connection(setup.url) as portal:
        for n in range(2):
            broker.Producer(portal).publish(
                {"type": "stop_job", "n": n}, exchange=commands.exchange,
                routing_key=commands.routing_key, declare=[commands],
            )  # fmt: skip
    options = {**agent_unacked_keys(node), "visibility_timeout": 0}
    env = {
        **os.environ,
        "AGENT_URL": agent_url,
        "QUEUE": commands.name,
        "OPTIONS": json.dumps(options),
    }

    def take_one_and_restore(transport: Any) -> None:
        """A consumer takes a command and dies (no ack, no clean close); another restores."""
        subprocess.run([sys.executable, "-c", TAKE_AND_DIE], env=env, check=True, timeout=60)
        assert admin.zcard(f"agent:{node}:unacked_index") >= 1
        with broker.Connection(agent_url, transport=transport, transport_options=options) as conn:
            conn.default_channel.qos.restore_visible(interval=1)

    with pytest.raises(redis.exceptions.NoPermissionError, match="evalsha"):
        take_one_and_restore(kombu.transport.redis.Transport)
    # It was given back, then the mutex's release failed: the mutex stays held (and every
    # restore waits) until it expires, and the error goes up through the consumer's loop.
    assert admin.llen(commands.name) == 2
    assert int(admin.ttl(f"agent:{node}:unacked_mutex")) > 0
    admin.delete(f"agent:{node}:unacked_mutex")  # as its expiry would

    take_one_and_restore(Transport)
    assert admin.llen(commands.name) == 2  # the one the second consumer took is back too
    assert admin.zcard(f"agent:{node}:unacked_index") == 0
    assert admin.get(f"agent:{node}:unacked_mutex") is None  # released
