"""A Redis user per job, so a tenant program reaches its own job's keys and nothing else.

The elastic runtime of job ``J`` keeps every key under ``edl:{J}:``
(``workers.elastic.keys``).  A program started with the ``edl`` launcher gets
a Redis URL for the user ``edl-J``, who may touch only those keys and
channels, and only the commands the runtime needs (an allow-list)::

    ACL SETUSER edl-J reset on >PASSWORD ~edl:J:* resetchannels &edl:J:*
                      -@all +@fast -@dangerous -@admin -@scripting -@blocking
                      +set +del +scan +smembers +hgetall +exec
                      +blpop +xread +subscribe +unsubscribe +psubscribe +punsubscribe

``+@fast`` are the O(1) and O(log N) commands (GET, HSET, INCR, XADD, RPUSH,
LPOP, EXPIRE, MULTI, WATCH, AUTH, PING...); the slow ones the runtime calls
are named one by one.  What stays out, and why:

- ``@scripting`` (EVAL, EVALSHA, SCRIPT, FUNCTION, FCALL): a script runs
  inside the server; an endless loop answers BUSY to the broker, the cache,
  the channel layer and every job until ``SHUTDOWN NOSAVE``.  The runtime's
  compare-and-set steps are WATCH/MULTI/EXEC transactions instead
  (``workers.elastic.redis_io.write_if``).
- ``@dangerous`` and ``@admin``: KEYS, FLUSHALL, FLUSHDB, CONFIG, ACL,
  DEBUG, SHUTDOWN, MONITOR, CLIENT KILL/LIST/PAUSE, INFO, SWAPDB, SORT...
- every other slow command: RANDOMKEY (other jobs' key names), SETRANGE
  (one command, a 512 MB string), set and sorted-set algebra (SUNIONSTORE...),
  LRANGE, OBJECT, MEMORY...
- blocking commands except the two the runtime waits with: BLPOP (always
  with a timeout of a second) and XREAD (the leader reads its control
  stream without BLOCK).  Redis cannot bound the timeout a client asks for:
  a program that blocks forever holds only its own connection (the server
  goes on serving everyone else), and its connections are counted against
  its job (``job_footprint``) and the server's ``maxclients``.

SCAN is allowed with a MATCH of the job's prefix (the leader's clean-up, the
store's key count); Redis cannot restrict SCAN to a user's patterns, so a
program can list the *names* of other keys (other jobs' ids and worker ids),
never read or change them.  Memory is not a right Redis can give per user:
the server's ``maxmemory`` with ``noeviction`` bounds the whole
(``utilities.embedded_redis.ServerLimits``), and ``job_footprint`` /
``stop_job_user`` let an agent measure a job and stop one that holds more
than its share.

The password: every node's agent must compute the same one for a job, with
no message between them.  It is ``HMAC-SHA256(secret, job)`` in hex, where
``secret`` is 32 random bytes kept in the agents' own Redis at
``agent:acl:secret`` (created once with SET NX by the first agent that needs
it).  A job's user cannot read that key (it is outside ``edl:J:*``).

``ensure_job_user`` is idempotent (``reset`` first, so a refresh changes
nothing); ``restore_job_user`` makes a user again that a restarted server
lost (the control plane on its tick for its running jobs; an agent still on
the portal's user on every heartbeat for the jobs it runs);
``delete_job_user`` is for the agent when a job ends on its node and for
the control plane when it cleans a job up (deleting a user also disconnects
its clients).

Agents' own users (below, ``agent_rules``): on Redis 7 each node's agent
logs in as ``agent-<node>``, whose password derives from the same secret
under another label (``agent_password``).  Only the control plane, on the
portal's user, reads the secret: it makes job users and agent users
(``ensure_agent_users``, ``control.agent_users``) and hands a job's password to
its agents in the signed ``StartWorkers``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import redis

SECRET_KEY = "agent:acl:secret"


def job_user(job: str) -> str:
    """The Redis user of ``job``'s programs."""
    return f"edl-{job}"


def job_rules(job: str, password: str) -> list[str]:
    """The ACL rules of ``job``'s user (see the module docstring)."""
    pattern = f"edl:{job}:*"
    return [
        "reset",
        "on",
        f">{password}",
        f"~{pattern}",
        "resetchannels",  # Redis 6.2's reset leaves all channels on (acl-pubsub-default)
        f"&{pattern}",
        *JOB_COMMANDS,
    ]


JOB_COMMANDS: tuple[str, ...] = (
    "-@all",
    "+@fast",
    "-@dangerous",
    "-@admin",
    "-@scripting",
    "-@blocking",
    # the slow commands the runtime calls (workers/elastic), each by name
    "+set",
    "+del",
    "+scan",
    "+smembers",
    "+hgetall",
    "+exec",
    "+blpop",
    "+xread",
    # its own channels (``&edl:J:*``)
    "+subscribe",
    "+unsubscribe",
    "+psubscribe",
    "+punsubscribe",
)
"""What a job's user may run, in order (see the module docstring)."""


def derive_password(secret: bytes, job: str) -> str:
    """The password of ``job``'s user: HMAC-SHA256 of the job id under the agents' secret."""
    return hmac.new(secret, job.encode(), hashlib.sha256).hexdigest()


def agents_secret(client: redis.Redis) -> bytes:
    """The secret all agents share, created on first use (SET NX, so two agents agree).

    One round trip, ``SET ... NX GET`` (the value there, or nothing when this call
    set it), on a server that has it (Redis 7); two, ``SET NX`` then ``GET``, on
    one that refuses it (6.2 allows no ``GET`` with ``NX``).
    """
    fresh = secrets.token_hex(32)
    if _set_nx_get.get(_server_of(client), True):
        try:
            raw: Any = client.set(SECRET_KEY, fresh, nx=True, get=True)
        except redis.ResponseError:
            _set_nx_get[_server_of(client)] = False
        else:
            return fresh.encode() if raw is None else _text(raw).encode()
    client.set(SECRET_KEY, fresh, nx=True)
    raw = client.get(SECRET_KEY)
    return _text(raw).encode()


_set_nx_get: dict[object, bool] = {}
"""Servers known to refuse ``SET ... NX GET``, by connection address (asked once each)."""


def _server_of(client: redis.Redis) -> object:
    kwargs = client.connection_pool.connection_kwargs
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"))


def ensure_job_user(client: redis.Redis, job: str) -> str:
    """Create or refresh ``job``'s user; return its password."""
    password = derive_password(agents_secret(client), job)
    # The raw command: the rules read as in the Redis manual (redis-py's is untyped).
    rules = job_rules(job, password)
    client.execute_command("ACL", "SETUSER", job_user(job), *rules)  # type: ignore[no-untyped-call]
    return password


def restore_job_user(client: redis.Redis, job: str) -> bool:
    """Make ``job``'s user again if the server lost it; True if it did.

    ACL users made at run time are not in the append-only file: a restarted
    server comes back without them, and the job's processes, riding out the
    outage (``workers.elastic.redis_client``), are refused until their agent
    makes the user again (on its heartbeat).  The password derives from the
    agents' secret, which the file keeps, so it is the one they hold.
    """
    if job_user_exists(client, job):
        return False
    ensure_job_user(client, job)
    return True


def job_user_exists(client: redis.Redis, job: str) -> bool:
    """Whether the server knows ``job``'s user."""
    return _user_exists(client, job_user(job))


def _user_exists(client: redis.Redis, user: str) -> bool:
    found = client.execute_command("ACL", "GETUSER", user)  # type: ignore[no-untyped-call]
    return found is not None


def delete_job_user(client: redis.Redis, job: str) -> None:
    """Remove ``job``'s user (a no-op if there is none); its connections are closed."""
    client.execute_command("ACL", "DELUSER", job_user(job))  # type: ignore[no-untyped-call]


def url_for(base_url: str, user: str, password: str) -> str:
    """``base_url`` (host, port, database, options) with ``user:password`` as credentials."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def job_url(client: redis.Redis, base_url: str, job: str) -> str:
    """Ensure ``job``'s user and return the URL its programs connect with."""
    return url_for(base_url, job_user(job), ensure_job_user(client, job))


@dataclass(frozen=True)
class JobFootprint:
    """What one job holds on the Redis server: its keys' memory, its clients' buffers and
    connections (every node's processes of the job together)."""

    job: str
    """Whose footprint it is, as a reason names it (``job job-7``, ``the agent of n1``)."""
    key_bytes: int
    keys: int
    client_bytes: int
    connections: int

    @property
    def bytes(self) -> int:
        """Everything the job makes the server hold."""
        return self.key_bytes + self.client_bytes


@dataclass(frozen=True)
class JobBudget:
    """The most one job may hold on the server; more and its agent stops it."""

    max_bytes: int
    max_connections: int

    @classmethod
    def of_server(
        cls, client: redis.Redis, memory_share: float = 0.25, client_share: float = 0.125
    ) -> JobBudget:
        """A share of the server's ``maxmemory`` and ``maxclients`` (a server without a
        ``maxmemory`` is unbounded: see ``utilities.embedded_redis.ServerLimits``)."""
        config: Any = client.config_get("max*")
        maxmemory = int(config.get("maxmemory") or config.get(b"maxmemory") or 0)
        maxclients = int(config.get("maxclients") or config.get(b"maxclients") or 10_000)
        if maxmemory <= 0:
            raise ValueError("the Redis server has no maxmemory: no share of it can be given")
        return cls(int(maxmemory * memory_share), max(int(maxclients * client_share), 1))

    def refusal(self, footprint: JobFootprint) -> str | None:
        """Why ``footprint`` is over this budget, or None when it is within."""
        if footprint.bytes > self.max_bytes:
            return (
                f"{footprint.job} holds {footprint.bytes} bytes in Redis (at most {self.max_bytes})"
            )
        if footprint.connections > self.max_connections:
            return (
                f"{footprint.job} holds {footprint.connections} Redis connections "
                f"(at most {self.max_connections})"
            )
        return None


def job_footprint(client: redis.Redis, job: str) -> JobFootprint:
    """Measure ``job`` on the server (the portal's user; none of these commands is refused
    while the server is full).

    SCAN walks the whole keyspace to find the job's keys: an agent measures
    when the server is under pressure (``memory_pressure``), not on every pass.
    """
    return _footprint(client, f"job {job}", job_user(job), [f"edl:{job}:*"])


def agent_footprint(client: redis.Redis, node: str) -> JobFootprint:
    """Measure what ``node``'s agent user holds: its own keys, its command queue (with
    kombu's priority lists) and its connections' buffers (a push of a huge message onto a
    report queue sits in its query buffer first).  The jobs it hosts are measured as jobs."""
    queue = f"agent.{node}"
    patterns = [f"agent:{node}:*", queue, f"{queue}{KOMBU_SEP}*"]
    return _footprint(client, f"the agent of {node}", agent_user(node), patterns)


def _footprint(client: redis.Redis, owner: str, user: str, patterns: Iterable[str]) -> JobFootprint:
    key_bytes = keys = 0
    for pattern in patterns:
        for key in client.scan_iter(match=pattern, count=1000):
            keys += 1
            key_bytes += int(client.memory_usage(key) or 0)
    mine = [c for c in client.client_list() if c.get("user") == user]
    client_bytes = sum(int(c.get("tot-mem") or 0) for c in mine)
    return JobFootprint(owner, key_bytes, keys, client_bytes, len(mine))


def memory_pressure(client: redis.Redis) -> float:
    """How full the server is: used memory over ``maxmemory`` (0.0 without a maxmemory)."""
    info: Any = client.info("memory")
    limit = int(info.get("maxmemory") or 0)
    return int(info.get("used_memory") or 0) / limit if limit else 0.0


def stop_job_user(client: redis.Redis, job: str) -> int:
    """Stop a job that holds more than its share: its user goes (its connections with it)
    and its keys are freed; the number of keys freed.

    The job cannot go on without its keys: its agent reports it failed (the
    reason from ``JobBudget.refusal``) and must not make its user again.
    """
    delete_job_user(client, job)
    freed = 0
    for key in client.scan_iter(match=f"edl:{job}:*", count=1000):
        freed += int(client.unlink(key))
    return freed


# --------------------------------------------------------------------------- agents' own users

KOMBU_SEP = "\x06\x16"
"""kombu's separator in its Redis key names (a queue's priority lists, binding members)."""


AGENT_USER_PREFIX = "agent-"

RESERVED_NODES = frozenset({"acl", "net", "forwarded"})
"""Node names whose own keys (``agent:N:*``) would be the portal's or every job's:
``agent:acl:*`` (the secret), ``agent:net:*`` and ``agent:forwarded:*`` (all jobs')."""


def agent_user(node: str) -> str:
    """The Redis user of ``node``'s agent (``agent_rules``; the control plane makes it)."""
    return f"{AGENT_USER_PREFIX}{node}"


def agent_password(secret: bytes, node: str) -> str:
    """The password of ``node``'s agent user: HMAC-SHA256 of ``agent:<node>`` under the
    agents' secret.  A job id never holds a ``:`` (``workers.schema.check_name``), so no
    agent's password is ever a job's (``derive_password``)."""
    return hmac.new(secret, f"agent:{node}".encode(), hashlib.sha256).hexdigest()


def node_of_url(url: str) -> str | None:
    """The node whose agent user ``url`` logs in as (``agent-<node>``); None for any other
    user (the portal's, a job's, the default)."""
    user = urlsplit(url).username or ""
    if not user.startswith(AGENT_USER_PREFIX):
        return None
    return unquote(user.removeprefix(AGENT_USER_PREFIX)) or None


def supports_agent_users(client: redis.Redis) -> bool:
    """Whether the server has key selectors (Redis 7 or later), which ``agent_rules`` needs."""
    info: Any = client.info("server")
    return int(str(info.get("redis_version", "0")).split(".")[0]) >= 7


def _rules_digest_key(node: str) -> str:
    """Where the control plane keeps a digest of the rules it last gave ``node``'s user
    (under ``agent:acl:``, which only the portal's user reaches)."""
    return f"agent:acl:rules:{node}"


def ensure_agent_users(
    client: redis.Redis, hosted: Mapping[str, Iterable[str]], send_to: tuple[str, ...] = ()
) -> list[str]:
    """Give each node's agent user of ``hosted`` the rules for its jobs and ``send_to``
    (``agent_rules``), unless it has them already; the nodes whose user was set.

    For the control plane (the portal's user): the password derives from the
    agents' secret, so every control-plane process gives the same one.  The
    rules' digest is kept beside the secret: a user the server lost (a
    restart), or rules that changed, are set again; otherwise nothing is
    written (``users_exist`` and the digests: a start's cost does not grow with
    the number of users on the server).
    Changing a user's rules keeps its connections (the agent's consumer).
    """
    nodes = sorted(hosted)
    if not nodes:
        return []
    secret = agents_secret(client)
    found = users_exist(client, [agent_user(node) for node in nodes])
    kept: list[Any] = client.mget([_rules_digest_key(node) for node in nodes])
    writes = client.pipeline(transaction=False)
    changed = []
    for node, exists, digest_kept in zip(nodes, found, kept, strict=True):
        jobs = tuple(sorted(set(hosted[node])))
        rules = agent_rules(node, agent_password(secret, node), jobs, send_to)
        digest = hashlib.sha256("\n".join(rules).encode()).hexdigest()
        if exists and digest_kept is not None and _text(digest_kept) == digest:
            continue
        writes.execute_command("ACL", "SETUSER", agent_user(node), *rules)  # type: ignore[no-untyped-call]
        writes.set(_rules_digest_key(node), digest)
        changed.append(node)
    if changed:
        writes.execute()
    return changed


GRANTED = "granted"
"""The rules digest of an agent user a start added to (``grant_jobs``): never a digest."""


def grant_jobs(client: redis.Redis, grants: Mapping[str, Iterable[str]]) -> list[str]:
    """Add the keys of newly started jobs to their nodes' agent users (``ACL SETUSER``
    without ``reset`` adds patterns), in one pipeline and with nothing read back but the
    users' digests; the nodes whose user the control plane has not set yet (no digest),
    for the caller to set in full (``ensure_agent_users``).

    The stored digest becomes ``GRANTED``, which no rules hash to, so the next
    ``ensure_agent_users`` sets the exact rules again: a start only adds, the control
    plane's sync also takes away (an ended job's keys).
    """
    nodes = sorted(grants)
    if not nodes:
        return []
    kept: list[Any] = client.mget([_rules_digest_key(node) for node in nodes])
    writes = client.pipeline(transaction=False)
    unset = []
    for node, digest in zip(nodes, kept, strict=True):
        if digest is None:
            unset.append(node)
            continue
        patterns = [p for job in sorted(set(grants[node])) for p in hosted_job_keys(job)]
        writes.execute_command("ACL", "SETUSER", agent_user(node), *patterns)  # type: ignore[no-untyped-call]
        writes.set(_rules_digest_key(node), GRANTED)  # matches no rules: the sync sets them
    if len(unset) < len(nodes):
        writes.execute()
    return unset


def ensure_agent_user(
    client: redis.Redis, node: str, jobs: Iterable[str] = (), send_to: tuple[str, ...] = ()
) -> bool:
    """``ensure_agent_users`` for one node; True when its user was set."""
    return bool(ensure_agent_users(client, {node: jobs}, send_to))


def users_exist(client: redis.Redis, users: list[str]) -> list[bool]:
    """Whether the server knows each of ``users``, in one round trip and without reading
    their rules (``ACL DRYRUN``, Redis 7: "not found" for an unknown user; ``ACL GETUSER``
    would send back every key pattern, ``ACL USERS`` every job's user)."""
    if not users:
        return []
    reads = client.pipeline(transaction=False)
    for user in users:
        reads.execute_command("ACL", "DRYRUN", user, "PING")  # type: ignore[no-untyped-call]
    answers = reads.execute(raise_on_error=False)
    return [
        not (isinstance(answer, redis.ResponseError) and "not found" in str(answer))
        for answer in answers
    ]


def ensure_job_users(
    client: redis.Redis, jobs: Iterable[str], *, passwords: Mapping[str, str] | None = None
) -> None:
    """``ensure_job_user`` for many jobs: at most one read of the secret, one pipeline.

    ``passwords``: those the caller already derived from the secret (the control
    plane's start commands carry them); the secret is read only for the other jobs.
    """
    jobs = sorted(set(jobs))
    if not jobs:
        return
    known = passwords or {}
    secret = b"" if all(job in known for job in jobs) else agents_secret(client)
    writes = client.pipeline(transaction=False)
    for job in jobs:
        password = known.get(job) or derive_password(secret, job)
        rules = job_rules(job, password)
        writes.execute_command("ACL", "SETUSER", job_user(job), *rules)  # type: ignore[no-untyped-call]
    writes.execute()


def acl_users(client: redis.Redis) -> set[str]:
    """The names of every user the server knows (one ``ACL USERS``)."""
    names: Any = client.execute_command("ACL", "USERS")  # type: ignore[no-untyped-call]
    return {_text(name) for name in names}


def restore_job_users(client: redis.Redis, jobs: Iterable[str]) -> list[str]:
    """``restore_job_user`` for many jobs in a few round trips; the jobs made again."""
    jobs = sorted(set(jobs))
    if not jobs:
        return []
    users = acl_users(client)
    lost = [job for job in jobs if job_user(job) not in users]
    ensure_job_users(client, lost)
    return lost


def agent_user_exists(client: redis.Redis, node: str) -> bool:
    """Whether the server knows ``node``'s agent user."""
    return _user_exists(client, agent_user(node))


def delete_agent_user(client: redis.Redis, node: str) -> None:
    """Remove ``node``'s agent user and its rules' digest (its connections are closed)."""
    client.execute_command("ACL", "DELUSER", agent_user(node))  # type: ignore[no-untyped-call]
    client.delete(_rules_digest_key(node))


SWITCHED_OFF_KEY = "agent:acl:off"
"""The nodes whose agent user the control plane switched off (over its share of the
server); kept off, whatever their rules, until an admin switches them on again."""


def switch_off_agent(client: redis.Redis, node: str) -> int:
    """Switch ``node``'s agent user off for holding more than its share: recorded first (so
    no control plane sets it on again), then the user off, its connections closed and its
    own keys freed; the number of keys freed.  Its node then misses its heartbeats."""
    client.sadd(SWITCHED_OFF_KEY, node)
    user = agent_user(node)
    client.execute_command("ACL", "SETUSER", user, "off")  # type: ignore[no-untyped-call]
    client.execute_command("CLIENT", "KILL", "USER", user)  # type: ignore[no-untyped-call]
    freed = 0
    queue = f"agent.{node}"
    for pattern in (f"agent:{node}:*", queue, f"{queue}{KOMBU_SEP}*"):
        for key in client.scan_iter(match=pattern, count=1000):
            freed += int(client.unlink(key))
    return freed


def switched_off(client: redis.Redis) -> set[str]:
    """The nodes whose agent user stays off (``switch_off_agent``)."""
    return {_text(m) for m in client.smembers(SWITCHED_OFF_KEY)}


def switch_on_agent(client: redis.Redis, node: str) -> bool:
    """Let the control plane give ``node``'s agent its user again; False if it was not off."""
    return bool(client.srem(SWITCHED_OFF_KEY, node))


def agent_url(base_url: str, client: redis.Redis, node: str) -> str:
    """The ``REDIS_URL`` ``node``'s agent logs in with (``base_url``'s server and database)."""
    return url_for(base_url, agent_user(node), agent_password(agents_secret(client), node))


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def agent_unacked_keys(node: str) -> dict[str, str]:
    """kombu transport options that keep ``node``'s unacknowledged commands under its own keys.

    kombu's default ``unacked`` hash is one for every consumer on the server:
    whoever may write it reads every agent's commands in flight.
    """
    return {
        "unacked_key": f"agent:{node}:unacked",
        "unacked_index_key": f"agent:{node}:unacked_index",
        "unacked_mutex_key": f"agent:{node}:unacked_mutex",
    }


def hosted_job_keys(job: str) -> tuple[str, ...]:
    """The key patterns of ``job`` that an agent running it touches: the runtime's keys, the
    events it forwarded (``workers.agent.store``), the job's network addresses
    (``workers.agent.network``)."""
    return (f"~edl:{job}:*", f"~agent:forwarded:{job}:*", f"~agent:net:{job}")


def agent_rules(
    node: str, password: str, jobs: tuple[str, ...] = (), send_to: tuple[str, ...] = ()
) -> list[str]:
    """The ACL rules of ``node``'s agent on Redis 7 or later (key selectors).

    Its own keys (``agent:N:*``, its command queue ``agent.N`` with kombu's
    priority lists and binding) with most commands; the keys of the jobs it
    runs (``jobs``, ``hosted_job_keys``); LPUSH and nothing else on the queues it sends to
    (``send_to``: reports, heartbeats), so it cannot read, pop or delete
    another agent's reports; SMEMBERS and nothing else on kombu's binding
    tables (a publish looks its route up there).  No scripts, no channels, no
    ``agent:acl:secret``, no other agent's queue.  An agent that logs in with
    it needs, in its Celery app: the scriptless transport
    (``broker_transport = "workers.agent.broker_redis:Transport"``), its own
    unacked keys (``agent_unacked_keys``), nothing declared that it sends to
    (``no_declare``), no remote control, events, gossip or mingle (pidbox
    channels); and the control plane must create and restore job users (the
    agent can no longer read ``agent:acl:secret``).  See docs/security.md.

    A node named after a key space of everyone's (``RESERVED_NODES``) is refused.
    """
    if node in RESERVED_NODES:
        raise ValueError(f"node {node!r} cannot have an agent user: agent:{node}:* is shared")
    queue = f"agent.{node}"
    own = [
        f"~agent:{node}:*",
        f"~{queue}",
        f"~{queue}{KOMBU_SEP}*",
        f"~_kombu.binding.{queue}",
        f"~_kombu.binding_permanent.{queue}",
        *(pattern for job in jobs for pattern in hosted_job_keys(job)),
    ]
    sends = " ".join(f"~{q} ~{q}{KOMBU_SEP}*" for q in send_to)
    rules = [
        "reset",
        "on",
        f">{password}",
        "resetchannels",
        *own,
        "+@all",
        "-@dangerous",
        "-@admin",
        "-@scripting",
        "-@pubsub",
        "(%R~_kombu.binding.* -@all +smembers)",
    ]
    if sends:
        rules.append(f"({sends} -@all +lpush)")
    return rules
