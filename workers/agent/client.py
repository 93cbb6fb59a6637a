"""The control plane's side of the agent protocol: sending a command to a node."""

from __future__ import annotations

from workers.protocol import AGENT_COMMAND_TASK, Command


def send_command(node: str, command: Command) -> str:
    """Send ``command`` to the agent of ``node`` (queue ``agent.<node>``); return the task id.

    The agent applies it once: sending the same command (same ``command_id``)
    again is harmless, so a caller may resend after a timeout.
    """
    from portal.celery import agent_queue, app

    result = app.send_task(
        AGENT_COMMAND_TASK, args=[command.to_dict()], queue=agent_queue(node), ignore_result=True
    )
    return str(result.id)
