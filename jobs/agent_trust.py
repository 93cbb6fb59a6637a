"""What the control plane believes of an agent: its key, and which jobs it hosts.

Redis carries the agent protocol but is no trust root (``docs/security.md``):

- keys: every node's key is derived from one master secret
  (``AGENT_SIGNING_KEY``, else derived from ``SECRET_KEY``) by
  ``workers.signing.node_key``; commands are signed with the target node's
  key, reports are checked against the sending node's;
- hosting: a node may report only about a job it hosts.  It hosts a job
  while it holds one of the job's GPUs, and for ``AGENT_HOSTED_GRACE_SECONDS``
  after it last did or was last sent a command for it, so a scale-in leaver's
  exit report, the last log lines and the artifacts collected after the job
  ended still count.  Those recent hosts are kept in the cache
  (``agent-hosted:<node>:<job>``), JSON-serialised like everything in it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from django.conf import settings
from django.core.cache import cache

from jobs.models import JobGpu
from workers.signing import Signed, key_to_text, master_secret, node_key, open_envelope


def master_key() -> bytes:
    """The master secret every node's key is derived from."""
    return master_secret(str(settings.AGENT_SIGNING_KEY), str(settings.SECRET_KEY))


def key_of(node: str) -> bytes:
    """The signing key of ``node``'s agent (``manage.py agentkey NODE`` prints it)."""
    return node_key(master_key(), node)


def key_text(node: str) -> str:
    """``key_of(node)`` as an agent takes it in ``AGENT_KEY`` (hex)."""
    return key_to_text(key_of(node))


def open_report(envelope: object, *, now: float | None = None) -> Signed:
    """Check a report's envelope against its node's key and the window; raise SignatureError."""
    master = master_key()
    return open_envelope(
        envelope,
        key_for=lambda node: node_key(master, node),
        now=time.time() if now is None else now,
        max_age_s=float(settings.AGENT_MESSAGE_MAX_AGE_SECONDS),
        max_skew_s=float(settings.AGENT_MESSAGE_MAX_SKEW_SECONDS),
    )


def _marker(node: str, job: str) -> str:
    return f"agent-hosted:{node}:{job}"


def mark_hosted(node: str, jobs: Iterable[str]) -> None:
    """Remember that ``node`` hosts (or was just sent commands for) these runtime jobs."""
    mark_hosted_by({node: jobs})


def mark_hosted_by(hosts: Mapping[str, Iterable[str]]) -> None:
    """:func:`mark_hosted` for many nodes at once (one cache round trip: a tick's commands)."""
    grace = float(settings.AGENT_HOSTED_GRACE_SECONDS)
    markers = {_marker(node, job): 1 for node, jobs in hosts.items() for job in jobs}
    if markers:
        cache.set_many(markers, timeout=grace)


def forget_hosted(node: str, jobs: Iterable[str]) -> None:
    """Drop what ``mark_hosted`` remembered (a job's id reused, a test's clean slate)."""
    cache.delete_many([_marker(node, job) for job in jobs])


def holds(node: str, job_id: int) -> bool:
    """Whether ``node`` holds one of the job's GPUs now."""
    return JobGpu.objects.filter(job_id=job_id, gpu__server__node=node).exists()


def hosts(node: str, job_id: int, job: str) -> bool:
    """Whether ``node`` may report about the job: it holds its GPUs, or did so recently."""
    if holds(node, job_id):
        mark_hosted(node, [job])
        return True
    return cache.get(_marker(node, job)) is not None
