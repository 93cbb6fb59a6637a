"""A Redis user per job, so a tenant program reaches its own job's keys and nothing else.

The elastic runtime of job ``J`` keeps every key under ``edl:{J}:``
(``workers.elastic.keys``).  A program started with the ``edl`` launcher gets
a Redis URL for the user ``edl-J``, who may touch only those keys and
channels, and none of the commands that reach beyond them::

    ACL SETUSER edl-J reset on >PASSWORD ~edl:J:* resetchannels &edl:J:*
                      +@all -@dangerous -@admin -randomkey -script
                      +script|load +script|exists

``@dangerous`` and ``@admin`` cover KEYS, FLUSHALL, FLUSHDB, CONFIG, ACL,
DEBUG, SHUTDOWN, MONITOR, CLIENT, INFO, SWAPDB, MIGRATE, SORT and the like;
RANDOMKEY would show other jobs' key names; SCRIPT FLUSH/KILL would disturb
other jobs' scripts.  What the runtime uses stays allowed: strings, hashes,
sets, lists (BLPOP), streams, EVAL with declared keys (Redis checks each
``redis.call`` of a script against the user's rules too), and SCAN with a
MATCH of its prefix (the leader's clean-up, the store's key count).  Redis
cannot restrict SCAN to a user's patterns, so a program can list the *names*
of other keys (other jobs' ids and worker ids), never read or change them.

The password: every node's agent must compute the same one for a job, with
no message between them.  It is ``HMAC-SHA256(secret, job)`` in hex, where
``secret`` is 32 random bytes kept in the agents' own Redis at
``agent:acl:secret`` (created once with SET NX by the first agent that needs
it).  A job's user cannot read that key (it is outside ``edl:J:*``).

``ensure_job_user`` is idempotent (``reset`` first, so a refresh changes
nothing); ``restore_job_user`` makes a user again that a restarted server
lost (the agent asks on every heartbeat for the jobs it runs); ``delete_job_user`` is for the agent when a job ends on its node
and for the control plane when it cleans a job up (deleting a user also
disconnects its clients).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

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
        "+@all",
        "-@dangerous",
        "-@admin",
        "-randomkey",
        "-script",
        "+script|load",
        "+script|exists",
    ]


def derive_password(secret: bytes, job: str) -> str:
    """The password of ``job``'s user: HMAC-SHA256 of the job id under the agents' secret."""
    return hmac.new(secret, job.encode(), hashlib.sha256).hexdigest()


def agents_secret(client: redis.Redis) -> bytes:
    """The secret all agents share, created on first use (SET NX, so two agents agree)."""
    fresh = secrets.token_hex(32)
    client.set(SECRET_KEY, fresh, nx=True)
    raw: Any = client.get(SECRET_KEY)
    value = raw.decode() if isinstance(raw, bytes) else str(raw)
    return value.encode()


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
    found = client.execute_command("ACL", "GETUSER", job_user(job))  # type: ignore[no-untyped-call]
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
