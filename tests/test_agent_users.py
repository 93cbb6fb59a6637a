"""Agents' own Redis users, made and kept by the control plane (``control.agent_users``).

On the real Redis 7 of ``REDIS_URL`` (key selectors; skipped without it) and
the real database: a tick places a job on a node of the test's own, and what
that node's agent may do with the credentials ``manage.py
agent_credentials`` prints is tried command by command.  Node names are the
test's own: ACL users are the whole server's, shared with every other run.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from control import agent_users
from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_heartbeat, do_load_topology
from jobs import outbox
from jobs.command_sender import wait_sent
from jobs.models import Job
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from tests.jobs.control_helpers import drain_queue
from tests.own_redis import own_embedded_redis
from tests.redis_clients import one_try
from workers.agent.redis_acl import (
    GRANTED,
    agent_rules,
    agent_user,
    agents_secret,
    delete_agent_user,
    delete_job_user,
    derive_password,
    job_url,
    job_user,
    switch_on_agent,
    switched_off,
    url_for,
    users_exist,
)
from workers.protocol import Migrate, StartWorkers, StopJob, WorkerSlot

pytestmark = pytest.mark.django_db(transaction=True)

PORTALS_OWN_QUEUES = ("portal", "tick", "whatif", "webhooks")
"""Queues whose tasks a worker runs whatever their name: an agent may push onto none."""


@dataclass(frozen=True)
class Cluster:
    """Two nodes of the test's own (one leaf, two GPUs each) and the portal's client."""

    node: str
    other: str
    url: str
    admin: redis.Redis


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("no REDIS_URL: agents' own users are tried on the shared Redis 7")
    from django.conf import settings

    admin = redis.Redis.from_url(str(settings.REDIS_URL))
    if int(str(admin.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("agents' own users need Redis 7's key selectors")
    tag = uuid.uuid4().hex[:8]
    nodes = [f"own-{tag}-a", f"own-{tag}-b"]
    servers = [{"leaf": 0, "slot": i, "node": node} for i, node in enumerate(nodes)]
    spec = {"leaves": 1, "spines": 1, "servers_per_leaf": 2, "gpus_per_server": 2}
    do_load_topology({**spec, "servers": servers})
    for node in nodes:
        do_heartbeat(node=node, info={"slots": 2}, at=timezone.now())
    with override_settings(AGENT_REDIS_USERS="on", AGENT_SEND_IN_BACKGROUND=False):
        yield Cluster(nodes[0], nodes[1], str(settings.REDIS_URL), admin)
    for node in nodes:
        delete_agent_user(admin, node)
        for pattern in (f"*{node}*", f"agent:acl:*:{node}"):
            for key in admin.scan_iter(match=pattern):
                admin.delete(key)


def credentials(node: str) -> str:
    """What ``manage.py agent_credentials NODE`` prints: the agent's ``REDIS_URL``."""
    out = io.StringIO()
    call_command("agent_credentials", node, stdout=out)
    return out.getvalue().strip()


def place(user: Any, tenant: Any, gpus: int = 2) -> Job:
    """Submit a job and let one tick place it; its commands are taken off the queues."""
    data = {"name": "own", "workload": "mlp-digits", "gpus": gpus}
    job = do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))
    assert run_tick(policy="fifo").ran
    job.refresh_from_db()
    assert job.state == "running"
    return job


def refused(client: redis.Redis, *command: Any) -> bool:
    """Whether ``client`` is refused ``command`` (NOPERM)."""
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_a_start_carries_its_jobs_password_and_the_node_reaches_the_jobs_keys_only(
    cluster: Cluster, alice: Any, acme: Any
) -> None:
    job = place(alice, acme)
    name = f"job-{job.pk}"
    sent = {node: drain_queue(node) for node in (cluster.node, cluster.other)}
    [(host, start)] = [(n, c) for n, cs in sent.items() for c in cs if c["type"] == "start_workers"]
    password = derive_password(agents_secret(cluster.admin), name)
    assert start["redis_password"] == password
    as_job = redis.Redis.from_url(url_for(cluster.url, job_user(name), password))
    assert as_job.set(f"edl:{name}:k", "v")  # the control plane made the job's user

    agent = redis.Redis.from_url(credentials(host))
    assert agent.get(f"edl:{name}:k") == b"v"  # the job its node hosts
    foreign = f"edl:job-{uuid.uuid4().hex[:6]}:k"  # a job it does not host
    cluster.admin.set(foreign, "theirs")
    other_node = cluster.other if host == cluster.node else cluster.node
    probes = [
        ("GET", "agent:acl:secret"),
        ("GET", foreign),
        ("SET", foreign, "mine"),
        ("LRANGE", f"agent.{other_node}", "0", "-1"),
        ("LPOP", f"agent.{other_node}"),
        ("LRANGE", "reports", "0", "-1"),
        ("LPOP", "reports"),
        *(("LPUSH", queue, "a task of the portal's") for queue in PORTALS_OWN_QUEUES),
        ("EVAL", "return 1", "0"),
        ("SUBSCRIBE", "anything"),
        ("ACL", "SETUSER", agent_user(host), "~*"),
    ]
    allowed = [p for p in probes if not refused(agent, *p)]
    assert allowed == [], f"the agent's user may run: {allowed}"
    cluster.admin.delete(foreign)
    for queue in ("reports", "heartbeats"):  # it may report, and a worker runs only reports
        before = cluster.admin.llen(queue)  # from there (tests/queues/test_agent_queues.py)
        assert agent.lpush(queue, "x") == before + 1
        cluster.admin.lrem(queue, 1, "x")


def test_the_control_planes_update_removes_an_ended_jobs_keys_from_the_agents_rules(
    cluster: Cluster, alice: Any, acme: Any
) -> None:
    job = place(alice, acme, gpus=4)  # both nodes
    name = f"job-{job.pk}"
    agents = {
        node: redis.Redis.from_url(credentials(node)) for node in (cluster.node, cluster.other)
    }
    assert all(a.set(f"edl:{name}:k", node) for node, a in agents.items())
    do_cancel_job(user=alice, job_id=job.pk)
    # Its processes still run on one node (its newest heartbeat lists them): that node keeps
    # the job's keys until they are gone; the other, whose heartbeat no longer lists any,
    # loses them once the StartWorkers it was sent is past its grace.
    worker = {"job": name, "worker_id": "w0", "slot": 0, "pid": 1234, "generation": 0}
    do_heartbeat(node=cluster.node, info={"slots": 2, "workers": [worker]}, at=timezone.now())
    later = time.time() + agent_users.DISPATCH_GRACE_S + 1
    agent_users.maintain(later, force=True)
    assert agents[cluster.node].get(f"edl:{name}:k") is not None
    assert refused(agents[cluster.other], "GET", f"edl:{name}:k")
    assert job_user(name) in set(cluster.admin.acl_users())

    do_heartbeat(node=cluster.node, info={"slots": 2, "workers": []}, at=timezone.now())
    agent_users.maintain(later, force=True)
    assert refused(agents[cluster.node], "GET", f"edl:{name}:k")
    assert job_user(name) not in set(cluster.admin.acl_users())


def test_the_tick_makes_again_the_users_a_restarted_redis_lost(
    cluster: Cluster, alice: Any, acme: Any
) -> None:
    job = place(alice, acme, gpus=4)
    name = f"job-{job.pk}"
    url = credentials(cluster.node)
    delete_agent_user(cluster.admin, cluster.node)
    delete_job_user(cluster.admin, name)
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(url).ping()

    agent_users.maintain(force=True)
    assert redis.Redis.from_url(url).get(f"edl:{name}:nothing") is None  # back, same password
    password = derive_password(agents_secret(cluster.admin), name)
    assert redis.Redis.from_url(url_for(cluster.url, job_user(name), password)).ping()


def test_an_agent_user_is_set_only_when_its_rules_change(cluster: Cluster) -> None:
    assert agent_users.sync_nodes([cluster.node]) == [cluster.node]
    assert agent_users.sync_nodes([cluster.node]) == []  # nothing changed: no ACL SETUSER


def test_with_agent_users_off_a_start_carries_no_password_and_no_user_is_made(
    cluster: Cluster, alice: Any, acme: Any
) -> None:
    before = set(cluster.admin.acl_users())  # the shared server's: other runs' job-1 too
    with override_settings(AGENT_REDIS_USERS="off"):
        job = place(alice, acme)
        commands = drain_queue(cluster.node) + drain_queue(cluster.other)
        with pytest.raises(Exception, match="agents use the portal's Redis user"):
            credentials(cluster.node)
    [start] = [c for c in commands if c["type"] == "start_workers"]
    assert start["redis_password"] is None
    made = set(cluster.admin.acl_users()) - before
    assert agent_user(cluster.node) not in made and job_user(f"job-{job.pk}") not in made


def test_the_control_plane_stops_and_fails_a_job_over_its_share_of_a_full_redis(
    cluster: Cluster, alice: Any, acme: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent on its own user may not measure the server: the control plane guards it."""
    job = place(alice, acme)
    name = f"job-{job.pk}"
    monkeypatch.setenv("REDIS_MAXMEMORY_MB", "32")
    with own_embedded_redis(tmp_path) as small:  # the shared server is never filled
        admin = redis.Redis.from_url(small)
        hog = redis.Redis.from_url(job_url(admin, small, name), retry=one_try().get_retry())
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):
            for n in range(4 * 32):
                hog.append(f"edl:{name}:part{n // 4}", b"x" * 2**20)
        assert agent_users.guard_memory(admin, [name]) == [name]
        assert job_user(name) not in set(admin.acl_users())
        assert not list(admin.scan_iter(f"edl:{name}:*"))
    job.refresh_from_db()
    assert job.state in ("queued", "failed")
    reasons = " ".join(job.events.values_list("reason", flat=True))
    assert f"job {name} holds" in reasons and "shared Redis" in reasons


def test_a_migrations_newcomers_and_a_scale_outs_joiners_carry_the_password_too(
    cluster: Cluster,
) -> None:
    join = StartWorkers(
        job="job-77", command_id="start-1", workload="mlp-digits", batch_size=8,
        recovery="consistent", checkpoint_every=0, join=True,
        workers=(WorkerSlot(worker_id="w3", slot=1),),
    )  # fmt: skip
    migrate = Migrate(job="job-77", command_id="migrate-1", leaving=("w0",), joining=join)
    stop = StopJob(job="job-77", command_id="stop-1")
    sent = agent_users.with_job_passwords([("a", migrate), ("b", join), ("c", stop)])
    password = derive_password(agents_secret(cluster.admin), "job-77")
    moved, joined, stopped = (command for _, command in sent)
    assert isinstance(moved, Migrate) and moved.joining.redis_password == password
    assert isinstance(joined, StartWorkers) and joined.redis_password == password
    assert stopped == stop
    assert password not in repr(sent)  # never in a log line


@pytest.mark.parametrize("node", ["acl", "net", "forwarded"])
def test_a_node_named_after_everyones_keys_gets_no_agent_user(node: str) -> None:
    """``agent:acl:*`` holds the secret, ``agent:net:*`` and ``agent:forwarded:*`` every
    job's keys: an agent user of such a node would reach them as its own keys."""
    with pytest.raises(CommandError, match="cannot have an agent user"):
        credentials(node)
    with pytest.raises(ValueError, match="cannot have an agent user"):
        agent_rules(node, "pw")


def test_an_agent_over_its_share_of_a_full_redis_is_switched_off_and_its_server_marked_down(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A taken-over node fills the server through its own keys: its user goes off and stays
    off (the control plane's sync leaves it), its keys are freed, its server is down."""
    monkeypatch.setenv("REDIS_MAXMEMORY_MB", "32")
    with own_embedded_redis(tmp_path) as small:  # the shared server is never filled
        admin = redis.Redis.from_url(small)
        admin.set(f"agent:{cluster.other}:state", "small")  # a neighbour within its share
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):
            for n in range(4 * 32):
                admin.append(f"agent:{cluster.node}:hoard{n // 4}", b"x" * 2**20)
        assert agent_users.guard_agents(admin, [cluster.node, cluster.other]) == [cluster.node]
        user: Any = admin.acl_getuser(agent_user(cluster.node))
        assert "off" in user["flags"] and cluster.node in switched_off(admin)
        assert not list(admin.scan_iter(f"agent:{cluster.node}:*"))
        assert admin.get(f"agent:{cluster.other}:state") == b"small"
        assert agent_users._usable(admin, [cluster.node, cluster.other]) == {cluster.other}
        assert switch_on_agent(admin, cluster.node)  # what --switch-on does
        assert agent_users._usable(admin, [cluster.node]) == {cluster.node}
    server = Server.objects.get(node=cluster.node)
    assert server.state == "down"
    assert f"the agent of {cluster.node} holds" in server.state_reason
    assert Server.objects.get(node=cluster.other).state == "up"


def test_users_exist_tells_known_users_without_reading_their_rules(cluster: Cluster) -> None:
    stranger = f"nobody-{uuid.uuid4().hex[:8]}"
    agent_users.sync_nodes([cluster.node])
    switched = agent_user(cluster.other)
    cluster.admin.acl_setuser(switched, enabled=False)
    try:
        assert users_exist(cluster.admin, [agent_user(cluster.node), stranger, switched]) == [
            True,
            False,
            True,  # off, still known: a lost user is the one to make again
        ]
        assert users_exist(cluster.admin, []) == []
    finally:
        delete_agent_user(cluster.admin, cluster.other)


def test_beat_keeps_the_users_on_the_portal_queue_off_the_ticks_worker() -> None:
    from django.conf import settings

    from control.tasks import AGENT_USERS_TASK, keep_agent_users

    entry: Any = settings.CELERY_BEAT_SCHEDULE["agent-users"]
    assert entry["task"] == AGENT_USERS_TASK == keep_agent_users.name
    assert entry["options"]["queue"] == "portal"
    assert entry["schedule"] == settings.AGENT_USERS_SYNC_SECONDS


def test_a_start_adds_the_jobs_keys_to_a_kept_user_and_the_sync_sets_exact_rules_again(
    cluster: Cluster, alice: Any, acme: Any
) -> None:
    """On a node whose user the control plane keeps, a start only adds the job's keys (no
    read of every node's jobs); the next sync sets the exact rules again."""
    urls = {node: credentials(node) for node in (cluster.node, cluster.other)}  # users kept
    job = place(alice, acme, gpus=4)  # both nodes
    name = f"job-{job.pk}"
    digests = cluster.admin.mget([f"agent:acl:rules:{n}" for n in (cluster.node, cluster.other)])
    assert digests == [GRANTED.encode(), GRANTED.encode()]
    for url in urls.values():
        assert redis.Redis.from_url(url).set(f"edl:{name}:k", "v")  # reached at once
    assert sorted(agent_users.sync_nodes([cluster.node, cluster.other])) == sorted(urls)
    assert GRANTED.encode() not in cluster.admin.mget(
        [f"agent:acl:rules:{n}" for n in (cluster.node, cluster.other)]
    )
    for url in urls.values():
        assert redis.Redis.from_url(url).get(f"edl:{name}:k") == b"v"  # it still runs there


def test_sending_in_the_background_the_users_are_made_in_the_sender_before_the_commands_go(
    cluster: Cluster, alice: Any, acme: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off the tick's thread, and still before the start is on the agent's queue."""
    calls: list[tuple[str, str]] = []
    make_users, publish = agent_users.dispatched, outbox.publish

    def users(starts: Any, now: float | None = None) -> None:
        calls.append(("users", threading.current_thread().name))
        make_users(starts, now)

    def send(commands: Any, app: Any = None) -> None:
        calls.append(("publish", threading.current_thread().name))
        publish(commands, app)

    monkeypatch.setattr(agent_users, "dispatched", users)
    monkeypatch.setattr(outbox, "publish", send)
    with override_settings(AGENT_SEND_IN_BACKGROUND=True):
        job = place(alice, acme)
        assert wait_sent()
    assert calls == [("users", "agent-command-sender"), ("publish", "agent-command-sender")]
    name = f"job-{job.pk}"
    [start] = [c for n in (cluster.node, cluster.other) for c in drain_queue(n)]
    assert start["type"] == "start_workers"
    password = derive_password(agents_secret(cluster.admin), name)
    as_job = redis.Redis.from_url(url_for(cluster.url, job_user(name), password))
    assert as_job.set(f"edl:{name}:k", "v")  # the user was made
