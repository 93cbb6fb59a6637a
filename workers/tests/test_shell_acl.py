"""A shell's streams under the agents' own Redis users (``redis_acl.agent_rules``), on Redis 7.

``shell_keys`` put a shell's two streams under ``agent:<node>:``, so the node's own user
reads and writes them with no rule added, another node's user is refused them, and a
job's user (its programs' and so its shell's) reaches neither.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from workers.agent.redis_acl import agent_rules, agent_user, job_rules, job_user, url_for
from workers.protocol import SHELL_STREAM_TTL_S, shell_entries, shell_keys
from workers.tests import test_redis_agent_user as agent_users
from workers.tests.test_redis_agent_user import Setup

setup = agent_users.setup  # two node names on a Redis 7, with its admin client


def _login(setup: Setup, user: str, rules: list[str]) -> redis.Redis:
    setup.admin.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
    return redis.Redis.from_url(url_for(setup.url, user, "pw"))


def test_only_the_nodes_own_agent_reaches_its_shells_streams(setup: Setup) -> None:
    shell_id = uuid.uuid4().hex
    job = f"job-{setup.node}"
    agent = _login(setup, agent_user(setup.node), agent_rules(setup.node, "pw", jobs=(job,)))
    other = _login(setup, agent_user(setup.other), agent_rules(setup.other, "pw"))
    program = _login(setup, job_user(job), job_rules(job, "pw"))
    try:
        into, out = shell_keys(setup.node, shell_id)
        setup.admin.xadd(into, {"d": b"id\n"})  # the portal's side
        assert [fields for _id, fields in shell_entries(agent.xread({into: 0}))] == [
            {b"d": b"id\n"}
        ]
        agent.xadd(out, {"x": "0"}, maxlen=1000, approximate=True)
        assert agent.expire(out, SHELL_STREAM_TTL_S)
        for intruder in (other, program):
            with pytest.raises(redis.exceptions.NoPermissionError):
                intruder.xread({into: 0})
            with pytest.raises(redis.exceptions.NoPermissionError):
                intruder.xadd(into, {"k": 1})
    finally:
        for user in (agent_user(setup.other), job_user(job)):
            setup.admin.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
        setup.admin.delete(*shell_keys(setup.node, shell_id))
