"""Helpers for control-plane tests: a loaded demo cluster and the agents' real queues."""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone

from inventory.models import Server
from inventory.services import do_heartbeat, do_load_topology
from jobs.agent_trust import key_of
from jobs.command_sender import wait_sent
from portal.celery import app
from workers.protocol import agent_queue
from workers.signing import open_envelope

DEMO = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


def demo_cluster(spec: dict[str, int] | None = None) -> list[str]:
    """Load a topology and make every agent alive; return the node names.

    The agents' queues start empty: whatever an earlier test or an earlier run
    left in the shared Redis (signed long ago, so stale) is discarded unread.
    """
    do_load_topology(spec or DEMO)
    nodes = list(Server.objects.values_list("node", flat=True))
    for node in nodes:
        drain_envelopes(node)
    for node in nodes:
        do_heartbeat(node=node, info={"slots": 2}, at=timezone.now())
    return nodes


def drain_envelopes(node: str) -> list[dict[str, Any]]:
    """Pop every message waiting on ``agent.<node>`` (the real Redis list), as sent.

    Commands committed by this process are published by its sender thread: they are
    waited for first.
    """
    assert wait_sent(), "the agent command sender did not finish"
    envelopes: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(agent_queue(node), no_ack=True)
        try:
            while True:
                try:
                    message = queue.get(block=False)
                except queue.Empty:
                    break
                envelopes.append(message.payload[0][0])
        finally:
            queue.close()
    return envelopes


def drain_queue(node: str) -> list[dict[str, Any]]:
    """Pop every command waiting on ``agent.<node>``, unwrapped.

    Each must be signed for ``node`` with its key, as its agent checks.
    """
    return [
        open_envelope(envelope, key_for=key_of, now=time.time(), expected_node=node).body
        for envelope in drain_envelopes(node)
    ]


def drain_all(nodes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Commands per node."""
    return {node: drain_queue(node) for node in nodes}
