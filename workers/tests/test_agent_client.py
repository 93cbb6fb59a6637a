"""The control plane's sending of one command: the message on the node's queue, as an agent reads it."""

from __future__ import annotations

import time
import uuid
from typing import Any

import kombu

from workers.agent.celery_app import make_app
from workers.agent.client import send_command
from workers.protocol import AGENT_COMMAND_TASK, Command, StopJob, agent_queue
from workers.signing import node_key, open_envelope

KEY = node_key(b"client-test-master", "n1")


def _sent(redis_url: str, command: Command) -> Any:
    node = f"client-{uuid.uuid4().hex[:8]}"
    app = make_app(redis_url)
    broker: Any = kombu
    with broker.Connection(redis_url) as connection:
        queue = connection.SimpleQueue(agent_queue(node))
        try:
            task_id = send_command(node, command, key=KEY, app=app)
            message = queue.get(timeout=5)
            message.ack()
        finally:
            queue.queue.delete()
            queue.close()
    assert message.headers["id"] == task_id
    return node, message


def test_a_command_arrives_signed_on_its_nodes_queue_and_is_named_not_dumped(
    redis_url: str,
) -> None:
    command = StopJob(job="job-7", command_id="stop-abc", reason="cancelled by its owner")
    node, message = _sent(redis_url, command)
    assert message.headers["task"] == AGENT_COMMAND_TASK
    # Logs and monitors see which command it is, not the envelope and its signature.
    assert message.headers["argsrepr"] == f"[stop_job stop-abc of job-7 for {node}]"
    args, kwargs, _ = message.decode()
    assert kwargs == {} and args[0]["sig"] not in message.headers["argsrepr"]
    opened = open_envelope(args[0], key_for=lambda _node: KEY, now=time.time(), expected_node=node)
    assert opened.node == node and Command.from_dict(opened.body) == command
