"""Opening and closing shells: the checks (``check_*``) and the changes (``do_*``).

A shell opens in three steps: ``check_open`` finds the job the user may see, that it
runs, the worker and its node, and builds the agent's ``OpenShell``; ``do_open``
records the shell and its audit row in one transaction and, on commit, sends the
command on the agent-command path (``jobs.outbox.publish``, signed with the node's key).
``do_close`` records the end once (exit status, bytes, why), with its audit row.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit import services as audit
from jobs.agent_commands import runtime_job_name
from jobs.choices import JobState
from jobs.models import Job, JobGpu
from jobs.outbox import publish
from shells import streams
from shells.models import Shell
from tenancy.services import can_write
from workers.protocol import OpenShell, ProtocolError

LIVE_STATES = (JobState.RUNNING, JobState.SCALING)
_FIELD = re.compile(r"^open_shell\.(\w+)")


class ShellRefused(Exception):
    """A shell that may not open: an HTTP-like ``status``, the ``field`` at fault, a message."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message

    def as_dict(self) -> dict[str, Any]:
        """The refusal as the socket sends it."""
        return {
            "type": "error",
            "status": self.status,
            "field": self.field,
            "message": self.message,
        }


@dataclass(frozen=True)
class ShellPlan:
    """A checked request: the job, where its worker runs, and the agent's command."""

    job: Job
    node: str
    command: OpenShell


def worker_nodes(job: Job) -> dict[str, str]:
    """The job's workers now, in rank order, with their nodes."""
    slots = JobGpu.objects.filter(job=job).select_related("gpu__server").order_by("rank")
    return {slot.worker_id: slot.gpu.server.node for slot in slots}


def check_open(
    *,
    user: Any,
    job_id: int,
    worker: str | None,
    argv: list[str],
    term: str,
    rows: int,
    cols: int,
) -> ShellPlan:
    """A shell ``user`` may open in ``job_id`` (its ``worker``; None: the first), or
    ``ShellRefused``: 404 for a job the user cannot see (another tenant's included),
    403 for a viewer of its tenant, 409 for one not running, 400 for a bad field, 429
    past the open-shell limit."""
    job = Job.objects.restrict(user).filter(pk=job_id).select_related("tenant").first()
    if job is None:
        raise ShellRefused(404, "job", f"no job {job_id}")
    if not can_write(user, job.tenant):
        # A shell runs commands in the job's sandbox: the job's writers only, not a viewer.
        raise ShellRefused(
            403, "job", f"your role in tenant {job.tenant.slug} is read-only: no shell"
        )
    if job.state not in LIVE_STATES:
        raise ShellRefused(409, "job", f"job {job_id} is {job.state}, not running")
    nodes = worker_nodes(job)
    chosen = worker or next(iter(nodes), "")
    if chosen not in nodes:
        known = ", ".join(nodes) or "none"
        raise ShellRefused(
            400, "worker", f"job {job_id} has no worker {chosen!r} (it has: {known})"
        )
    do_close_lost(user=user, now=timezone.now())
    if Shell.objects.open().filter(user=user).count() >= settings.SHELL_MAX_OPEN_PER_USER:
        raise ShellRefused(
            429, "shells", f"you have {settings.SHELL_MAX_OPEN_PER_USER} shells open already"
        )
    shell_id = secrets.token_hex(16)
    try:
        command = OpenShell(
            job=runtime_job_name(job.pk),
            command_id=f"shell-{shell_id[:16]}",
            shell_id=shell_id,
            worker_id=chosen,
            argv=tuple(argv),
            term=term,
            rows=rows,
            cols=cols,
            idle_seconds=max(1.0, float(settings.SHELL_IDLE_SECONDS)),
        )
    except ProtocolError as exc:
        match = _FIELD.match(str(exc))
        raise ShellRefused(400, match.group(1) if match else "open", str(exc)) from None
    return ShellPlan(job=job, node=nodes[chosen], command=command)


def do_open(*, user: Any, plan: ShellPlan, now: datetime) -> Shell:
    """Record the shell and its audit row; send the agent its command once they commit."""
    command = plan.command
    with transaction.atomic():
        shell = Shell.objects.create(
            id=command.shell_id,
            tenant=plan.job.tenant,
            job=plan.job,
            user=user,
            node=plan.node,
            worker_id=command.worker_id,
            argv=list(command.argv),
            opened_at=now,
        )
        audit.record(
            "shell.open",
            obj=shell,
            tenant=plan.job.tenant,
            user=user,
            after={
                "job": plan.job.pk,
                "worker": command.worker_id,
                "node": plan.node,
                "argv": list(command.argv),
            },
        )
        transaction.on_commit(lambda: publish([(plan.node, command)]))
    return shell


def do_close(
    *,
    shell_id: str,
    now: datetime,
    reason: str,
    exit_code: int | None = None,
    bytes_in: int = 0,
    bytes_out: int = 0,
    closed_by: Any = None,
) -> bool:
    """Record that a shell ended (once: False if it was closed already), with its audit row."""
    with transaction.atomic():
        shell = Shell.objects.select_for_update().select_related("tenant").get(pk=shell_id)
        if shell.closed_at is not None:
            if shell.exit_code is None and exit_code is not None:
                # The shell's own end, reported after an admin's close was recorded (the
                # admin's close is what made the agent end it): keep who closed it and why,
                # add what only the end can tell.
                shell.exit_code = exit_code
                shell.bytes_in, shell.bytes_out = bytes_in, bytes_out
                shell.save(update_fields=["exit_code", "bytes_in", "bytes_out"])
            return False
        shell.closed_at = now
        shell.exit_code = exit_code
        shell.bytes_in, shell.bytes_out = bytes_in, bytes_out
        shell.close_reason = reason[:200]
        shell.closed_by = closed_by
        shell.save()
        audit.record(
            "shell.close",
            obj=shell,
            tenant=shell.tenant,
            user=closed_by or shell.user,
            after={
                "exit_code": exit_code,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
                "reason": shell.close_reason,
                "job": shell.job_id,
                "worker": shell.worker_id,
            },
        )
    return True


def do_close_lost(*, user: Any, now: datetime) -> list[str]:
    """Close ``user``'s open shells that no portal process serves any more (its process
    ended: a restart, a crash), so that they stop counting against the user's limit."""
    settled = now - timedelta(seconds=streams.ALIVE_TTL_S)
    candidates = dict(
        Shell.objects.open().filter(user=user, opened_at__lt=settled).values_list("id", "node")
    )
    alive = streams.served(candidates)
    lost = [shell_id for shell_id in candidates if shell_id not in alive]
    for shell_id in lost:
        streams.send_close(candidates[shell_id], shell_id)  # its shell, should it still run
        do_close(shell_id=shell_id, now=now, reason="lost: no portal process serves it")
    return lost


def do_request_close(*, shell: Shell, by: Any, now: datetime) -> bool:
    """An admin closes an open shell: it is recorded as closed by ``by``, then the agent is
    told to end it (False, and nothing sent, when it had ended already).

    The record comes first: the agent ends the shell at once and its consumer records that
    end, so an agent told first could have the shell's own end recorded before the admin's
    close, which then found it closed (``closed_by`` null although the admin closed an open
    shell).  The end's exit status still completes the admin's record (``do_close``).
    """
    if shell.closed_at is not None:
        return False
    if not do_close(shell_id=shell.id, now=now, reason=f"closed by {by}", closed_by=by):
        return False
    node, shell_id = shell.node, shell.id
    transaction.on_commit(lambda: streams.send_close(node, shell_id))
    return True
