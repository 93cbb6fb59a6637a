"""What the pages read about shells: the open ones with their live byte counts, and what
the job page's terminal may offer (pure reads; the changes are in ``shells.services``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.staticfiles import finders

from jobs.choices import TERMINAL_STATES
from jobs.models import Job
from shells import streams
from shells.models import Shell
from shells.services import LIVE_STATES, worker_nodes
from tenancy.services import can_write

OPEN_SHELLS_SHOWN = 500
XTERM_FILES = ("vendor/xterm/xterm.js", "vendor/xterm/addon-fit.js", "vendor/xterm/xterm.css")
"""xterm.js as ``npm ci`` installs it and ``STATICFILES_DIRS`` serves it (package.json)."""


@dataclass(frozen=True)
class OpenShellRow:
    """One open shell as the admin page lists it; bytes as its consumer last counted them."""

    id: str
    user: str
    tenant: str
    job_id: int
    job_name: str
    worker_id: str
    node: str
    argv: tuple[str, ...]
    opened_at: datetime
    bytes_in: int
    bytes_out: int
    served: bool

    def as_json(self) -> dict[str, Any]:
        """The row as ``/cluster/shells/open.json`` sends it."""
        return {
            "id": self.id,
            "user": self.user,
            "tenant": self.tenant,
            "job": self.job_id,
            "job_name": self.job_name,
            "worker": self.worker_id,
            "node": self.node,
            "argv": list(self.argv),
            "opened_at": self.opened_at.isoformat(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "served": self.served,
        }


def open_shells(*, limit: int = OPEN_SHELLS_SHOWN) -> tuple[list[OpenShellRow], int]:
    """Every open shell, newest first (at most ``limit``), and how many are open in all.

    ``served`` is False for a shell no portal process has said it serves lately (its
    process ended; the next open of its user closes it as lost)."""
    shells = Shell.objects.open().select_related("tenant", "user", "job")
    total = shells.count()
    found = list(shells.order_by("-opened_at")[:limit])
    counts = streams.live_counts(shell.id for shell in found)
    rows = []
    for shell in found:
        moved = counts.get(shell.id)
        rows.append(
            OpenShellRow(
                id=shell.id,
                user=shell.user.get_username(),
                tenant=shell.tenant.slug,
                job_id=shell.job_id,
                job_name=shell.job.name,
                worker_id=shell.worker_id,
                node=shell.node,
                argv=tuple(str(arg) for arg in shell.argv),
                opened_at=shell.opened_at,
                bytes_in=moved[0] if moved else shell.bytes_in,
                bytes_out=moved[1] if moved else shell.bytes_out,
                served=moved is not None,
            )
        )
    return rows, total


@dataclass(frozen=True)
class TerminalOffer:
    """What the job page offers ``user`` for ``job``: a terminal at all (``shown``: a writer
    of its tenant, the job not ended), whether xterm.js is installed, the job's workers now."""

    shown: bool
    available: bool
    live: bool
    workers: tuple[str, ...]


def xterm_installed() -> bool:
    """Whether the static files of xterm.js are there to serve (``npm ci`` ran)."""
    return all(finders.find(path) for path in XTERM_FILES)


def terminal_offer(*, user: Any, job: Job) -> TerminalOffer:
    """The job page's terminal for ``user`` (who may see ``job``): ``check_open`` decides
    for real at the socket; this only spares a button that could not work."""
    if job.state in TERMINAL_STATES or not can_write(user, job.tenant):
        return TerminalOffer(shown=False, available=False, live=False, workers=())
    live = job.state in LIVE_STATES
    return TerminalOffer(
        shown=True,
        available=xterm_installed(),
        live=live,
        workers=tuple(worker_nodes(job)) if live else (),
    )
