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

import logging
import time
from collections.abc import Iterable, Mapping

from django.conf import settings
from django.core.cache import cache

from jobs.models import JobGpu
from workers.signing import Signed, key_to_text, master_secret, node_key, open_envelope

log = logging.getLogger(__name__)


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
    """Check a report's envelope against its node's key and the window; raise SignatureError.

    The window is judged at the envelope's first receipt (:func:`first_receipt`),
    so the task's own retries through a database outage stay valid for the
    whole retry horizon; a captured envelope replayed later than that is
    judged at its replay, and is stale.
    """
    master = master_key()
    at = time.time() if now is None else now
    return open_envelope(
        envelope,
        key_for=lambda node: node_key(master, node),
        now=at,
        max_age_s=float(settings.AGENT_MESSAGE_MAX_AGE_SECONDS),
        max_skew_s=float(settings.AGENT_MESSAGE_MAX_SKEW_SECONDS),
        first_received=lambda sig: first_receipt(sig, at),
    )


def receipt_memory_s() -> float:
    """How long a report envelope's first receipt (and its having been applied) is remembered.

    The retry horizon of the report task plus the signing window: longer than
    any retry of it, so no retry is ever judged afresh.
    """
    return float(settings.AGENT_REPORT_RETRY_FOR_SECONDS) + float(
        settings.AGENT_MESSAGE_MAX_AGE_SECONDS
    )


def _receipt_key(sig: str) -> str:
    return f"agent-envelope:{sig}"


def _applied_key(sig: str) -> str:
    return f"agent-envelope-applied:{sig}"


def first_receipt(sig: str, now: float) -> float:
    """When the envelope signed ``sig`` was first received: ``now`` on its first receipt.

    Kept in the shared cache (Redis) for :func:`receipt_memory_s`. Only
    envelopes whose signature is valid are recorded (``open_envelope`` asks
    after the check), so a forger cannot fill the cache. Without the cache
    the envelope is judged at ``now``, as before.
    """
    key = _receipt_key(sig)
    try:
        cache.add(key, now, timeout=receipt_memory_s())
        seen = cache.get(key)
    except Exception:  # the cache is the broker's Redis: judge this receipt as a fresh one
        log.warning("cannot read the first receipt of a report envelope", exc_info=True)
        return now
    return float(seen) if isinstance(seen, int | float) else now


def was_applied(signed: Signed) -> bool:
    """Whether this very envelope was applied already (a redelivered message)."""
    try:
        return bool(signed.sig) and cache.get(_applied_key(signed.sig)) is not None
    except Exception:
        log.warning("cannot read whether a report envelope was applied", exc_info=True)
        return False


def mark_applied(signed: Signed) -> None:
    """Remember that this envelope was applied: a redelivery of it changes nothing."""
    if not signed.sig:
        return
    try:
        cache.set(_applied_key(signed.sig), 1, timeout=receipt_memory_s())
    except Exception:  # the handlers are idempotent: a second apply is a no-op anyway
        log.warning("cannot record that a report envelope was applied", exc_info=True)


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
