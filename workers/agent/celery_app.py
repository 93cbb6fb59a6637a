"""The agent's own Celery application, configured from the environment.

A GPU server runs the agent without the portal's Django project: the broker
comes from ``CELERY_BROKER_URL`` (else ``REDIS_URL``).  The settings match
the control plane's app where the two meet on the wire: JSON only (a peer
that can write to the broker must not be able to make us unpickle),
late acknowledgement with rejection on a lost worker (a command redelivered
after a crash is completed, see ``docs/agent.md``), a visibility timeout
below the signing window, one message prefetched at a time, and the same queue
names (``agent.<node>`` for commands, ``portal`` for reports).

A broker restart loses nothing of ours: the worker reconnects for as long as
it takes, and a report sent while the broker is away is published again
(``PUBLISH_RETRY_POLICY``, about a minute) before ``send_report`` gives up.

The app is built on first use, not at import, so importing the agent
connects to nothing.

**On its own Redis user.**  When the broker URL's user is ``agent-<node>``
(``redis_acl.agent_rules``; the control plane makes it and ``manage.py
agent_credentials`` prints its URL), the app asks for nothing that user may
not do: kombu's transport without scripts (``workers.agent.broker_redis``),
its unacknowledged commands under its own keys (``agent_unacked_keys``), no
queue declared (it may not write kombu's binding tables; the control plane
declares every queue, the agent's own included, when it sends), no remote
control and no events, worker heartbeats included (all are pidbox or event
channels, and the user has none).  Reports and heartbeats are ordinary
tasks on their queues, which the user may push to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.app import amqp as celery_amqp
from celery.app import events as celery_events
from celery.events import dispatcher as celery_dispatcher

from workers.agent.redis_acl import agent_unacked_keys, node_of_url
from workers.protocol import REPORTS_QUEUE
from workers.signing import DEFAULT_MAX_AGE_S


class BrokerNotConfigured(RuntimeError):
    """Neither ``CELERY_BROKER_URL`` nor ``REDIS_URL`` is set."""


def broker_url(environ: Mapping[str, str] | None = None) -> str:
    """The broker of the agent's Celery app: ``CELERY_BROKER_URL``, else ``REDIS_URL``."""
    env = os.environ if environ is None else environ
    url = env.get("CELERY_BROKER_URL") or env.get("REDIS_URL")
    if not url:
        raise BrokerNotConfigured("no broker: set CELERY_BROKER_URL or REDIS_URL")
    return url


PUBLISH_RETRY_POLICY: dict[str, float] = {
    "max_retries": 40,
    "interval_start": 0.0,
    "interval_step": 0.5,
    "interval_max": 2.0,
}
"""Kombu's retry of one publish: 0, 0.5, 1, 1.5, then every 2 s (about 75 s in all), which
outlasts a Redis restart (``workers.elastic.redis_client.DEFAULT_OUTAGE_S``)."""


VISIBILITY_TIMEOUT_S = 300
"""A command taken by an agent that died before acknowledging it (SIGKILL, OOM) is on its
queue again after this long (``AGENT_BROKER_VISIBILITY_TIMEOUT_SECONDS``): well below the
signing window (``workers.signing.DEFAULT_MAX_AGE_S``), so it is still fresh when the agent
takes it again, and above any command's run (they start or stop processes, briefly)."""


def visibility_timeout(environ: Mapping[str, str] | None = None) -> int:
    """The agent's broker visibility timeout: the environment's, below the signing window."""
    env = os.environ if environ is None else environ
    raw = env.get("AGENT_BROKER_VISIBILITY_TIMEOUT_SECONDS", "").strip()
    window = float(env.get("AGENT_MESSAGE_MAX_AGE_SECONDS") or DEFAULT_MAX_AGE_S)
    try:
        seconds = int(raw) if raw else VISIBILITY_TIMEOUT_S
    except ValueError:
        raise ValueError(
            f"AGENT_BROKER_VISIBILITY_TIMEOUT_SECONDS: not a number: {raw!r}"
        ) from None
    if not 0 < seconds < window:
        raise ValueError(
            f"AGENT_BROKER_VISIBILITY_TIMEOUT_SECONDS must be from 1 to below the signing "
            f"window ({window:.0f} s): a redelivered command must still be fresh"
        )
    return seconds


class UndeclaredQueues(celery_amqp.Queues):  # type: ignore[misc]  # Celery ships no types
    """Celery's queues, none of which is ever declared (``no_declare``): an agent on its own
    user sends to queues the control plane declared, and consumes its own, which the
    control plane declares with every command it sends."""

    def __setitem__(self, name: str, queue: Any) -> None:
        queue.no_declare = True
        super().__setitem__(name, queue)


class OwnUserAMQP(celery_amqp.AMQP):  # type: ignore[misc]  # Celery ships no types
    """Celery's AMQP layer with ``UndeclaredQueues``."""

    queues_cls = UndeclaredQueues


class SilentDispatcher(celery_dispatcher.EventDispatcher):  # type: ignore[misc]  # Celery ships no types
    """An event dispatcher that is never enabled: worker heartbeats and task events would
    go out on an event channel (Redis PUBLISH), which an agent's own user may not use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["enabled"] = False
        super().__init__(*args, **kwargs)

    def enable(self) -> None:
        """Stay disabled (remote control's ``enable_events`` included)."""


class SilentEvents(celery_events.Events):  # type: ignore[misc]  # Celery ships no types
    """Celery's events with ``SilentDispatcher``."""

    dispatcher_cls = "workers.agent.celery_app:SilentDispatcher"


BROKER_TRANSPORT = "workers.agent.broker_redis:Transport"
"""The transport of an agent on its own Redis user (no scripts)."""


def own_user_node(broker: str) -> str | None:
    """The node whose own Redis user ``broker`` logs in as (``agent-<node>``), else None."""
    return node_of_url(broker) if broker.startswith(("redis://", "rediss://")) else None


def make_app(broker: str, environ: Mapping[str, str] | None = None) -> Celery:
    """A Celery app for the agent protocol on ``broker`` (on an agent's own Redis user, one
    that needs no right the user lacks: see the module docstring)."""
    node = own_user_node(broker)
    options: dict[str, Any] = {"visibility_timeout": visibility_timeout(environ)}
    if node is None:
        app = Celery("workers.agent", broker=broker, set_as_current=False)
    else:
        app = Celery(
            "workers.agent",
            broker=broker,
            set_as_current=False,
            amqp=OwnUserAMQP,
            events=SilentEvents,
        )
        options.update(agent_unacked_keys(node))
        app.conf.update(
            broker_transport=BROKER_TRANSPORT,
            worker_enable_remote_control=False,
            worker_send_task_events=False,
            task_send_sent_event=False,
        )
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        # A command whose agent died mid-way is taken again (commands carry ids: a second
        # run completes or repeats nothing, docs/agent.md); a message that kills the agent
        # every time stops coming back once its envelope is stale (the signing window).
        task_reject_on_worker_lost=True,
        broker_transport_options=options,
        worker_prefetch_multiplier=1,
        task_default_queue=REPORTS_QUEUE,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,  # never give up on the broker: it comes back
        task_publish_retry=True,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        task_ignore_result=True,
        worker_hijack_root_logger=True,
    )
    return app


_app: Celery | None = None
_app_lock = threading.Lock()


def agent_app() -> Celery:
    """The process's agent app (built from the environment on first use)."""
    global _app
    with _app_lock:
        if _app is None:
            _app = make_app(broker_url())
        return _app
