"""The control plane's side of the agent protocol: sending a signed command to a node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from workers.agent.celery_app import agent_app
from workers.protocol import AGENT_COMMAND_TASK, Command, agent_queue
from workers.signing import seal


def command_envelope(
    node: str, command: Command, *, key: bytes, now: Callable[[], float] = time.time
) -> dict[str, Any]:
    """The wire form of ``command`` for ``node``: its JSON in an envelope signed with ``key``."""
    return seal(command.to_dict(), node=node, key=key, now=now())


def send_command(
    node: str,
    command: Command,
    *,
    key: bytes,
    app: Celery | None = None,
    producer: Any = None,
) -> str:
    """Send ``command`` to the agent of ``node`` (queue ``agent.<node>``); return the task id.

    ``key`` is that node's key (``workers.signing.node_key``): the agent
    refuses a command signed with any other.  ``app`` is the Celery app to
    send with (the control plane passes its own, and a ``producer`` to send
    many over one connection); by default the agent's app, whose broker comes
    from the environment (``workers.agent.celery_app``).  The agent applies a
    command once: sending the same command (same ``command_id``) again is
    harmless, so a caller may resend after a timeout.
    """
    sender = app if app is not None else agent_app()
    result = sender.send_task(
        AGENT_COMMAND_TASK,
        args=[command_envelope(node, command, key=key)],
        # What logs and monitors show of the task: without it Celery builds a bounded
        # repr of the whole signed envelope for every command (most of a send's CPU).
        argsrepr=f"[{command.TYPE} {command.command_id} of {command.job} for {node}]",
        kwargsrepr="{}",
        queue=agent_queue(node),
        ignore_result=True,
        producer=producer,
    )
    return str(result.id)
