"""What the portal's Celery workers run from the queues agents may write.

Agents push their reports and heartbeats onto ``AGENT_REPORT_QUEUES`` (on
their own Redis users, LPUSH and nothing else there: ``redis_acl.agent_rules``).
A taken-over node can push any message it likes onto those lists, so a
message's claims are not believed:

- **Which queue it came from** is the list the worker popped it from, not what
  the message says.  kombu's Redis transport hands each message on with the
  ``delivery_info`` its sender wrote; :class:`Transport` overwrites the
  exchange and routing key with the queue it was read from before anything
  (Celery, kombu's unacknowledged-message book) sees them.  For a message the
  portal itself sent they are the same values: a queue's default exchange and
  routing key are its name.
- **What runs from an agent's queue** is the report task only
  (:class:`PortalTask`): the report handler checks the envelope's signature
  against the sending node's key.  Any other task name there (the tick, an
  export, a webhook) is dropped with a warning and never called.
- **A message that is not one** (not JSON, not a kombu envelope) is dropped
  and logged instead of breaking the worker's consumer loop.

The portal sends nothing but reports to those queues
(``CELERY_TASK_ROUTES``), and the settings refuse an ``AGENT_REPORT_QUEUES``
that names a queue other portal tasks use.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Task
from django.conf import settings
from kombu.transport import redis as kombu_redis

from workers.protocol import REPORT_TASK

logger = logging.getLogger(__name__)

TRANSPORT = "portal.broker:Transport"
"""The ``broker_transport`` of the portal's Celery app (``CELERY_BROKER_TRANSPORT``)."""


def stamped(message: Any, queue: str) -> dict[str, Any] | None:
    """``message`` (a decoded kombu envelope) with its delivery info set to ``queue``, the
    list it was read from; None if it is not an envelope kombu could handle."""
    if not isinstance(message, dict):
        return None
    properties = message.get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get("delivery_tag"), str):
        return None
    if not isinstance(message.get("body", ""), str) or properties.get("body_encoding") not in (
        None,
        "base64",
    ):
        return None
    if not isinstance(message.get("headers", {}), dict):
        return None
    info = properties.get("delivery_info")
    info = dict(info) if isinstance(info, dict) else {}
    info.update(exchange=queue, routing_key=queue)
    properties["delivery_info"] = info
    return message


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, dropping a popped item that is not JSON instead of raising."""

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[no-untyped-call]
        except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
            logger.warning("dropped a broker message that is not JSON: %s", exc)
            return True


class Transport(kombu_redis.Transport):
    """kombu's Redis transport whose messages say the queue they were read from."""

    Channel = Channel

    def _deliver(self, message: Any, queue: str) -> None:
        checked = stamped(message, queue)
        if checked is None:
            shown = json.dumps(message, default=repr)[:200]
            logger.warning("dropped a malformed broker message from %s: %s", queue, shown)
            return
        super()._deliver(checked, queue)  # type: ignore[no-untyped-call]


def agent_queues() -> frozenset[str]:
    """The queues agents may push onto (``AGENT_REPORT_QUEUES``)."""
    return frozenset(settings.AGENT_REPORT_QUEUES)


def allowed(task: str, queue: str | None) -> bool:
    """Whether a worker runs ``task`` read from ``queue`` (None: not from a queue, e.g. a
    direct call): from an agent's queue, only the report task."""
    return queue is None or queue not in agent_queues() or task == REPORT_TASK


class PortalTask(Task):  # type: ignore[misc]  # Celery's Task is untyped
    """The base of the portal's tasks: refuses to run a task that came off an agent's queue
    unless it is the report task (see the module docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        info = self.request.delivery_info or {}
        queue = info.get("routing_key") if isinstance(info, dict) else None
        if not allowed(str(self.name), queue):
            logger.warning(
                "refused task %s from %s: agents' queues carry reports only", self.name, queue
            )
            return None
        return super().__call__(*args, **kwargs)
