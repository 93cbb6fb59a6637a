"""Each node's agent on a Redis user of its own: the control plane makes and keeps them.

An agent on the portal's Redis user could read ``agent:acl:secret`` (every
job's Redis password), every agent's commands and the control plane's
queues.  Where the server has key selectors (Redis 7), each agent logs in as
``agent-<node>`` (``workers.agent.redis_acl.agent_rules``): its own keys and
queue, the keys of the jobs it hosts, a push onto the report queues
(``AGENT_REPORT_QUEUES``).  Only the control plane, on the portal's user,
reads the secret, so it makes every user::

    dispatch (control.apply.apply_bound, inside the tick's or a move's transaction)
      ├─ every StartWorkers carries its job's password ............ with_job_passwords
      └─ on commit, before the commands are published ............. dispatched
           the jobs' users made; each target node's user given the jobs' keys
           (in the command sender's thread, ahead of the commands, when they are
           published in the background)
    beat's control.agent_users task (control.tasks.keep_agent_users, on the portal queue,
          every AGENT_USERS_SYNC_SECONDS) ......................... maintain
      ├─ each node's user: the jobs it hosts now (ACL SETUSER only where they changed)
      ├─ users of jobs holding GPUs that a restarted server lost: made again
      ├─ users of jobs no node hosts any more: deleted
      ├─ jobs over their share of a full server: users and keys gone, the job failed
      │    (``workers.agent.redis_guard``; an agent on its own user may not measure)
      └─ agents over that share: user off, keys gone, server down ..... guard_agents

A node hosts a job (``hosted_jobs``) while it holds one of the job's GPUs,
while its newest heartbeat lists one of the job's processes (a stop in
progress), and for ``DISPATCH_GRACE_S`` after a StartWorkers was sent to it
(before its first heartbeat lists the processes); then the job's keys leave
its user's rules.

``AGENT_REDIS_USERS``: ``on``, ``off``, or ``auto`` (on where the server has
key selectors; the embedded server is 6.2).  Off, nothing here runs: agents
on the portal's user make their jobs' users themselves, as before.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Collection, Iterable, Sequence
from typing import TypeVar

import redis
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from control.endings import fail_or_retry
from inventory.models import Server, ServerState
from inventory.services import do_set_server_state, listed_jobs
from jobs import command_sender
from jobs.agent_commands import job_id_from_name, runtime_job_name
from jobs.models import Job, JobGpu
from utilities.redis_clients import shared_redis
from workers.agent.redis_acl import (
    RESERVED_NODES,
    agent_footprint,
    agents_secret,
    delete_job_user,
    derive_password,
    ensure_agent_users,
    ensure_job_users,
    grant_jobs,
    restore_job_users,
    supports_agent_users,
    switch_off_agent,
    switched_off,
)
from workers.agent.redis_guard import guard, over_share
from workers.protocol import Command, Migrate, StartWorkers

M = TypeVar("M")

log = logging.getLogger(__name__)

DISPATCH_GRACE_S = 120.0
"""How long a node hosts a job it was sent a StartWorkers for, before any heartbeat lists
its processes: a command reaches a live agent within seconds; one still queued after this
found its agent down, and the tick has moved the job elsewhere."""

SENT_KEY = "agent:acl:sent:{node}"
"""The jobs a node was sent a StartWorkers for, scored by when (the portal's keys alone)."""

JOBS_KEY = "agent:acl:jobs"
"""The jobs whose users this control plane made: deleted once no node hosts them."""

_support: dict[str, bool] = {}
_next_maintain = [0.0]


def _client() -> redis.Redis:
    return shared_redis()


def enabled() -> bool:
    """Whether agents log in as their own users (``AGENT_REDIS_USERS``; ``auto`` asks the
    server once per process whether it has key selectors)."""
    mode = str(settings.AGENT_REDIS_USERS)
    if mode != "auto":
        return mode == "on"
    url = str(settings.REDIS_URL)
    if url not in _support:
        try:
            _support[url] = supports_agent_users(_client())
        except redis.RedisError:  # asked again next time
            log.warning("cannot tell whether Redis has key selectors", exc_info=True)
            return False
    return _support[url]


def send_to() -> tuple[str, ...]:
    """The queues agents push reports and heartbeats onto."""
    return tuple(settings.AGENT_REPORT_QUEUES)


def _start_of(command: Command) -> StartWorkers | None:
    if isinstance(command, StartWorkers):
        return command
    if isinstance(command, Migrate):
        return command.joining
    return None


def _with_password(command: Command, secret: bytes) -> Command:
    if isinstance(command, StartWorkers):
        return _with_field(command, "redis_password", derive_password(secret, command.job))
    if isinstance(command, Migrate):
        joining = _with_field(
            command.joining, "redis_password", derive_password(secret, command.job)
        )
        return _with_field(command, "joining", joining)
    return command


def _with_field(message: M, name: str, value: object) -> M:
    """A copy of a checked ``message`` with one field set, without checking it all again.

    ``dataclasses.replace`` would run the protocol's checks on every field again
    (a start's workload and arguments among them: most of building a start); the
    values set here pass them by construction (an HMAC-SHA256 hex digest, 64
    hexadecimal digits; a start already checked).
    """
    made = copy.copy(message)
    object.__setattr__(made, name, value)
    return made


def with_job_passwords(commands: Sequence[tuple[str, Command]]) -> list[tuple[str, Command]]:
    """``commands`` with every StartWorkers (a Migrate's too) carrying its job's Redis
    password, which an agent on its own user cannot derive; unchanged when agent users are
    off.  The users themselves are made on commit (``dispatched``)."""
    if not enabled() or not any(_start_of(c) is not None for _, c in commands):
        return list(commands)
    secret = agents_secret(_client())
    return [(node, _with_password(command, secret)) for node, command in commands]


def dispatched_on_commit(commands: Sequence[tuple[str, Command]]) -> None:
    """Register ``dispatched`` with the current transaction (before the outbox's sending,
    which its caller registers after)."""
    starts = [(node, c) for node, c in commands if _start_of(c) is not None]
    if starts and enabled():
        transaction.on_commit(functools.partial(_hand_over, starts))


def _hand_over(starts: Sequence[tuple[str, Command]]) -> None:
    """``dispatched``, where the commands are published: with ``AGENT_SEND_IN_BACKGROUND``,
    in this process's command sender (``jobs.command_sender``), handed over ahead of the
    batch the outbox hands over next, so that it runs first (first in, first out) and an
    agent's user has the job's keys before the start is on its queue, while the committing
    thread (the tick's) is done (a few Redis round trips, about 7 ms a tick that starts
    jobs); else here."""
    if settings.AGENT_SEND_IN_BACKGROUND:
        command_sender.sender().submit(_dispatched_in_sender, starts)
    else:
        dispatched(starts)


def _dispatched_in_sender(starts: Sequence[tuple[str, Command]]) -> None:
    try:
        dispatched(starts)
    finally:
        # A node's first grant reads the database (``sync_nodes``) on the sender thread's
        # own connection: closed again, as that thread otherwise never uses one.
        connections.close_all()


def dispatched(commands: Sequence[tuple[str, Command]], now: float | None = None) -> None:
    """Committed starts, before they are published: each job's user made, each target
    node's user given the job's keys.  Redis away: logged; ``maintain`` does it later."""
    started = [(node, start) for node, c in commands if (start := _start_of(c)) is not None]
    starts = sorted({(node, start.job) for node, start in started})
    if not starts:
        return
    # The passwords the starts carry (``with_job_passwords``): the secret is not read again.
    passwords = {s.job: s.redis_password for _, s in started if s.redis_password is not None}
    client, at = _client(), time.time() if now is None else now
    try:
        writes = client.pipeline(transaction=False)
        for node, job in starts:
            writes.zadd(SENT_KEY.format(node=node), {job: at})
            writes.sadd(JOBS_KEY, job)
        writes.execute()
        ensure_job_users(client, {job for _, job in starts}, passwords=passwords)
        grants: dict[str, set[str]] = {}
        for node, job in starts:
            grants.setdefault(node, set()).add(job)
        unset = grant_jobs(client, grants)  # a start adds; maintain also takes away
        if unset:
            sync_nodes(unset, now=at)
    except redis.RedisError:
        log.exception("could not make the Redis users of %d started jobs", len(starts))


def hosted_jobs(nodes: Collection[str], now: float | None = None) -> dict[str, set[str]]:
    """The jobs each of ``nodes`` hosts (see the module docstring)."""
    hosted: dict[str, set[str]] = {node: set() for node in nodes}
    if not hosted:
        return hosted
    held = JobGpu.objects.filter(gpu__server__node__in=list(hosted))
    for node, job_id in held.values_list("gpu__server__node", "job_id"):
        hosted[node].add(runtime_job_name(job_id))
    for node, info in Server.objects.filter(node__in=list(hosted)).values_list(
        "node", "agent_info"
    ):
        hosted[node] |= listed_jobs(info if isinstance(info, dict) else {})
    at = time.time() if now is None else now
    client = _client()
    reads = client.pipeline(transaction=False)
    order = sorted(hosted)
    for node in order:
        key = SENT_KEY.format(node=node)
        reads.zremrangebyscore(key, "-inf", at - DISPATCH_GRACE_S)
        reads.zrange(key, 0, -1)
    answers = reads.execute()
    for node, members in zip(order, answers[1::2], strict=True):
        hosted[node] |= {m.decode() if isinstance(m, bytes) else str(m) for m in members}
    return hosted


def _usable(client: redis.Redis, nodes: Iterable[str]) -> set[str]:
    """``nodes`` but those that cannot have an agent user (logged) and those whose user was
    switched off (``guard_agents``)."""
    nodes = set(nodes)
    for node in sorted(nodes & RESERVED_NODES):
        log.error("node %r cannot have an agent user (its keys would be shared ones)", node)
    return nodes - RESERVED_NODES - switched_off(client)


def sync_nodes(nodes: Iterable[str], now: float | None = None) -> list[str]:
    """Give each node's agent user the keys of the jobs it hosts now; the nodes whose rules
    changed (``ACL SETUSER`` only for those)."""
    client = _client()
    return _sync(client, hosted_jobs(_usable(client, nodes), now))


def _sync(client: redis.Redis, hosted: dict[str, set[str]]) -> list[str]:
    changed = ensure_agent_users(client, hosted, send_to())
    if changed:
        log.info("agent users updated: %s", ", ".join(changed))
    return changed


def maintain(now: float | None = None, *, force: bool = False) -> None:
    """The control plane's care of Redis users (see the module docstring), at most every
    ``AGENT_USERS_SYNC_SECONDS`` unless ``force``; Redis away: logged, tried next time."""
    if not enabled():
        return
    if not force and time.monotonic() < _next_maintain[0]:
        return
    _next_maintain[0] = time.monotonic() + float(settings.AGENT_USERS_SYNC_SECONDS)
    client = _client()
    try:
        hosted = hosted_jobs(_usable(client, Server.objects.values_list("node", flat=True)), now)
        _sync(client, hosted)
        running = sorted(
            {runtime_job_name(pk) for pk in JobGpu.objects.values_list("job_id", flat=True)}
        )
        for job in restore_job_users(client, running):
            log.warning("Redis had lost the user of job %s: made it again", job)
        _delete_unhosted_job_users(client, set().union(set(running), *hosted.values()))
        guard_memory(client, running)
        guard_agents(client, sorted(hosted))
    except Exception:  # Redis or the database away: logged, the next run tries
        log.warning("could not look after the agents' and jobs' Redis users", exc_info=True)


def _delete_unhosted_job_users(client: redis.Redis, hosted: set[str]) -> None:
    """Delete the users this control plane made of jobs no node hosts any more."""
    made = {m.decode() if isinstance(m, bytes) else str(m) for m in client.smembers(JOBS_KEY)}
    for job in sorted(made - hosted):
        delete_job_user(client, job)
        client.srem(JOBS_KEY, job)
        log.info("deleted the Redis user of job %s: no node hosts it", job)


def guard_memory(client: redis.Redis, running: Sequence[str]) -> list[str]:
    """Stop the jobs over their share of a full server (``redis_guard``: users and keys
    gone) and fail them with the reason (retried while restarts remain); those stopped."""
    stopped_jobs = []
    for stopped in guard(client, running):
        log.warning("job %s stopped: %s", stopped.job, stopped.reason)
        job_id = job_id_from_name(stopped.job)
        with transaction.atomic():
            job = Job.objects.select_for_update().filter(pk=job_id).first()
            if job is not None:
                fail_or_retry(job, stopped.reason, timezone.now())
        stopped_jobs.append(stopped.job)
    return stopped_jobs


def guard_agents(client: redis.Redis, nodes: Sequence[str]) -> list[str]:
    """Switch off the agent users that hold more than a job's share of a full server (their
    own keys, command queue, connections' buffers), and mark their servers down with the
    reason; the nodes switched off.

    A taken-over node cannot fill the shared server through its own keys or by pushing
    huge messages: its user goes off (``switch_off_agent``) and stays off until an admin
    runs ``manage.py agent_credentials NODE --switch-on``.  Its jobs are requeued as a
    down server's are.
    """
    off = []
    for node, refusal in over_share(client, nodes, agent_footprint):
        switch_off_agent(client, node)
        reason = f"{refusal}: its Redis user is off until an admin switches it on"
        log.error("agent of %s switched off: %s", node, reason)
        do_set_server_state(node=node, state=ServerState.DOWN, reason=reason)
        off.append(node)
    return off
