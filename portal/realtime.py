"""Live-update plumbing: group names and after-commit broadcasts over the Channels layer.

Payloads are small JSON dicts with a ``type`` key (ids and diffs, never whole
views).  They are sent only after the transaction that made the change commits.
"""

from __future__ import annotations

import logging
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


def broadcast_now(groups: Iterable[str], payload: dict[str, Any]) -> None:
    """Send ``payload`` to every group now; a layer outage is logged, never raised."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "portal.event", "event": payload}
    for group in groups:
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:  # the change is committed; a lost live update is not fatal
            log.warning("could not broadcast %s to %s", payload.get("type"), group, exc_info=True)


def broadcast_on_commit(groups: Iterable[str], payload: dict[str, Any]) -> None:
    """Send ``payload`` to ``groups`` once the current transaction commits."""
    targets = tuple(groups)
    transaction.on_commit(lambda: broadcast_now(targets, payload))
