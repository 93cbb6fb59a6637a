"""Live-update plumbing: group names and after-commit broadcasts over the Channels layer.

Payloads are small JSON dicts with a ``type`` key (ids and diffs, never whole
views).  They are sent only after the transaction that made the change commits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

CLUSTER_GROUP = "cluster"


def tenant_group(tenant_id: int) -> str:
    """The group that a tenant's members join to follow its jobs."""
    return f"tenant-{tenant_id}"


def job_group(job_id: int) -> str:
    """The group that a job's detail page joins."""
    return f"job-{job_id}"


def broadcast_now(messages: Iterable[tuple[tuple[str, ...], dict[str, Any]]]) -> None:
    """Send each (groups, payload) now, in one hop into the event loop.

    A layer outage is logged, never raised: the change is already committed,
    and a page that missed an update resynchronises when it reconnects.
    """
    layer = get_channel_layer()
    batch = list(messages)
    if layer is None or not batch:
        return

    async def send_all() -> None:
        for groups, payload in batch:
            message = {"type": "portal.event", "event": payload}
            for group in groups:
                await layer.group_send(group, message)

    try:
        async_to_sync(send_all)()
    except Exception:
        log.warning("could not broadcast %d live updates", len(batch), exc_info=True)


class _CommitBatch:
    """The live updates of one transaction, sent together by a single on-commit hook."""

    def __init__(self) -> None:
        self.messages: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def __call__(self) -> None:
        broadcast_now(self.messages)


_local = threading.local()


def broadcast_on_commit(groups: Iterable[str], payload: dict[str, Any]) -> None:
    """Send ``payload`` to ``groups`` once the current transaction commits.

    All updates of a transaction share one hook (a tick that changes hundreds
    of jobs pays for one event-loop hop, not hundreds).  The batch belongs to
    the transaction: after a rollback its hook is gone and a new one is made.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:  # autocommit: the change is already committed
        broadcast_now([(tuple(groups), payload)])
        return
    batch: _CommitBatch | None = getattr(_local, "batch", None)
    registered = batch is not None and any(
        hook is batch for _, hook, *_ in connection.run_on_commit
    )
    if batch is None or not registered:
        batch = _CommitBatch()
        _local.batch = batch
        transaction.on_commit(batch)
    batch.messages.append((tuple(groups), payload))
