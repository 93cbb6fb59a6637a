"""Agent commands collected during a transaction and sent once it commits.

Commands go to each node's queue (``agent.<node>``) through the Celery app
that is current (the portal's in the control plane), over one broker
connection, each signed with its node's key (``jobs.agent_trust``), by this
process's sender thread (``jobs.command_sender``), so that the committing
thread does not wait for the broker; a command lost on the way is recovered
as ``jobs.command_sender`` says (reconcile requeues a job whose start never
came).  Before the publishing, in the thread that publishes, every node a
command concerns (its target, and the nodes of the workers it asks to leave)
is remembered as hosting the job, so their late reports about it are believed
(``agent_trust.hosts``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, current_app
from django.conf import settings
from django.db import transaction

from jobs import agent_trust, command_sender
from jobs.agent_commands import (
    GpuHome,
    JobLaunch,
    ProgramLaunch,
    gpu_of_worker,
    leaving_workers,
    membership_commands,
)
from jobs.holdings import gpu_homes
from jobs.models import Job
from jobs.sessions import home_prefix
from workers.agent.client import send_command
from workers.artifacts import job_prefix
from workers.protocol import Command

log = logging.getLogger(__name__)


@dataclass
class Outbox:
    """Agent commands collected during a transaction, sent once it commits."""

    commands: list[tuple[str, Command]] = field(default_factory=list)
    homes: Mapping[int, GpuHome] = field(default_factory=dict)
    """Where GPUs live, when the caller knows (the tick does): leavers' nodes without a query."""

    def extend(self, commands: Iterable[tuple[str, Command]]) -> None:
        """Queue commands as ``(node, command)`` pairs."""
        self.commands.extend(commands)

    def stop_workers(self, job: Job, held: Sequence[int], *, reason: str) -> None:
        """Queue a graceful stop of the workers ``job`` ran on ``held`` GPUs."""
        if held:
            self.extend(
                membership_commands(launch_of(job), held, (), gpu_homes(held), reason=reason)
            )

    def send_on_commit(self) -> None:
        """Register the sending with the current transaction."""
        pending = list(self.commands)
        self.commands.clear()
        if pending:
            transaction.on_commit(functools.partial(deliver, pending, self.homes))


def deliver(
    commands: Sequence[tuple[str, Command]], homes: Mapping[int, GpuHome] | None = None
) -> None:
    """Committed commands on their way: hosts found now, remembered, then published.

    The hosts are found in the committing thread (a leaver's node may need the
    database, which that thread has) and remembered just before the publishing,
    in the thread that publishes: always first, so a report answering a command
    is believed however soon it comes.  With ``AGENT_SEND_IN_BACKGROUND`` both go
    to this process's sender thread (``jobs.command_sender``), and the committing
    thread (the tick's) does not wait for the cache either; else here.
    """
    try:
        hosts = hosts_of(commands, homes)
    except Exception:  # as a failed send: the next tick re-derives them
        log.exception("could not send %d agent commands", len(commands))
        return
    if settings.AGENT_SEND_IN_BACKGROUND:
        app = current_app._get_current_object()  # the committing thread's, for the sender's
        command_sender.sender().submit(
            functools.partial(_remember_and_publish, hosts, app=app), commands
        )
    else:
        _remember_and_publish(hosts, commands)


def _remember_and_publish(
    hosts: Mapping[str, set[str]],
    commands: Sequence[tuple[str, Command]],
    app: Celery | None = None,
) -> None:
    try:
        agent_trust.mark_hosted_by(hosts)
    except Exception:  # as a failed send: the next tick re-derives them
        log.exception("could not send %d agent commands", len(commands))
        return
    publish(commands, app=app)


def send_commands(commands: Sequence[tuple[str, Command]]) -> None:
    """Remember the hosts and publish the commands, in this thread."""
    remember_hosts(commands)
    publish(commands)


def publish(commands: Sequence[tuple[str, Command]], app: Celery | None = None) -> None:
    """Put each command, signed, on its node's queue (``agent.<node>``), over one connection.

    ``app``: the Celery app to send with (default: the current one; the sender
    thread is given the committing thread's).
    """
    app = app or current_app
    try:
        with app.producer_or_acquire() as producer:
            for node, command in commands:
                key = agent_trust.key_of(node)
                send_command(node, command, key=key, app=app, producer=producer)
    except Exception:  # the next tick re-derives state; lost commands are logged
        log.exception("could not send %d agent commands", len(commands))


def remember_hosts(
    commands: Sequence[tuple[str, Command]], homes: Mapping[int, GpuHome] | None = None
) -> None:
    """Mark every node a command concerns as hosting its job (see the module docstring)."""
    agent_trust.mark_hosted_by(hosts_of(commands, homes))


def hosts_of(
    commands: Sequence[tuple[str, Command]], homes: Mapping[int, GpuHome] | None = None
) -> dict[str, set[str]]:
    """Every node a command concerns, with the jobs it is to be remembered as hosting.

    A leaving worker's node comes from ``homes`` when it names the GPU, else from the database.
    """
    hosts: dict[str, set[str]] = {}
    leavers: dict[int, str] = {}
    for node, command in commands:
        hosts.setdefault(node, set()).add(command.job)
        for worker in leaving_workers(command):
            gpu = gpu_of_worker(worker)
            if gpu is not None:
                leavers[gpu] = command.job
    homes = homes or {}
    unknown = [gpu for gpu in leavers if gpu not in homes]
    found = gpu_homes(unknown) if unknown else {}
    for gpu, job in leavers.items():
        if (home := homes.get(gpu) or found.get(gpu)) is not None:
            hosts.setdefault(home.node, set()).add(job)
    return hosts


def launch_of(job: Job) -> JobLaunch:
    """The fixed part of a job's StartWorkers commands."""
    return JobLaunch(
        job_id=job.pk,
        workload=job.workload,
        args=job.args,
        batch_size=job.batch_size,
        recovery=job.recovery,
        checkpoint_every=job.checkpoint_interval,
        program=program_of(job),
        store_prefix=job_prefix(job.tenant.slug, job.pk),
        checkpoint_keep=settings.CHECKPOINT_KEEP,
        checkpoint_min_seconds=settings.CHECKPOINT_MIN_SECONDS,
    )


def rendezvous_port(job_pk: int, generation: int) -> int:
    """Where a torchrun program's rank 0 listens in one run: the same for every start command
    of that run, a new one each generation, and not guessable from the job's id (a keyed
    hash under ``SECRET_KEY``, in ``TORCHRUN_PORT_BASE`` + [0, ``TORCHRUN_PORT_SPAN``))."""
    key = str(settings.SECRET_KEY).encode()
    digest = hmac.new(key, f"rendezvous:{job_pk}:{generation}".encode(), hashlib.sha256).digest()
    offset = int.from_bytes(digest[:8], "big") % settings.TORCHRUN_PORT_SPAN
    return int(settings.TORCHRUN_PORT_BASE) + offset


def program_of(job: Job) -> ProgramLaunch | None:
    """The program half of a job's StartWorkers (None for a built-in workload)."""
    bundle = job.code
    if bundle is None:
        return None
    return ProgramLaunch(
        code=bundle.sha256,
        code_path=bundle.store_path,
        entrypoint=tuple(shlex.split(job.entrypoint)),
        launcher=job.launcher,
        env=dict(job.env),
        environment=dict(job.environment),
        generation=job.generation,
        master_port=rendezvous_port(job.pk, job.generation),
        grace_seconds=settings.TORCHRUN_GRACE_SECONDS,
        **_session_home(job),
    )


def _session_home(job: Job) -> dict[str, Any]:
    """A session's persistent home and its quota for the agent (nothing for a batch job)."""
    if not job.is_session:
        return {}
    return {
        "home_prefix": home_prefix(job),
        "home_quota_mib": job.tenant.session_home_quota_mib,
    }
