"""The control plane's side of the agent protocol: sending a command to a node."""

from __future__ import annotations

from celery import Celery

from workers.agent.celery_app import agent_app
from workers.protocol import AGENT_COMMAND_TASK, Command, agent_queue


def send_command(node: str, command: Command, *, app: Celery | None = None) -> str:
    """Send ``command`` to the agent of ``node`` (queue ``agent.<node>``); return the task id.

    ``app`` is the Celery app to send with (the control plane passes its
    own); by default the agent's app, whose broker comes from the environment
    (``workers.agent.celery_app``).  The agent applies a command once:
    sending the same command (same ``command_id``) again is harmless, so a
    caller may resend after a timeout.
    """
    sender = app if app is not None else agent_app()
    result = sender.send_task(
        AGENT_COMMAND_TASK, args=[command.to_dict()], queue=agent_queue(node), ignore_result=True
    )
    return str(result.id)
