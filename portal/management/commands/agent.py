"""``python manage.py agent --node NAME [--gpus N]``: the node agent with the portal's settings.

A GPU server runs ``python -m workers.agent`` with ``REDIS_URL`` in its
environment and no Django at all; this command is the convenience for a
machine that has the portal's settings (the embedded Redis, the data
directory), which it hands to the agent as that environment, with the
node's signing key derived from the portal's (unless ``AGENT_KEY``,
``AGENT_KEY_FILE`` or ``--key-file`` gives one).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.agent_trust import key_text
from workers.agent.celery_app import make_app
from workers.agent.config import AgentConfigError
from workers.agent.service import add_arguments, config_from_options, run


class Command(BaseCommand):
    help = "Run the node agent: a Celery worker on queue agent.<node> that runs training processes."
    # The agent serves no pages and uses no database: the portal's checks are not its business.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = argparse.Namespace(**options)
        environ = {
            **os.environ,
            "REDIS_URL": str(settings.REDIS_URL),
            "PORTAL_DATA_DIR": str(settings.DATA_DIR),
            "AGENT_HEARTBEAT_SECONDS": str(settings.AGENT_HEARTBEAT_SECONDS),
            "AGENT_DOWN_AFTER_SECONDS": str(settings.AGENT_DOWN_AFTER_SECONDS),
            "ARTIFACT_URL": str(settings.ARTIFACT_URL),
            "AGENT_MESSAGE_MAX_AGE_SECONDS": str(settings.AGENT_MESSAGE_MAX_AGE_SECONDS),
            "AGENT_MESSAGE_MAX_SKEW_SECONDS": str(settings.AGENT_MESSAGE_MAX_SKEW_SECONDS),
        }
        if not (namespace.key_file or environ.get("AGENT_KEY") or environ.get("AGENT_KEY_FILE")):
            environ["AGENT_KEY"] = key_text(str(namespace.node))
        database = settings.DATABASES["default"]
        if "sqlite" in database["ENGINE"]:  # tenant programs must not see its directory
            environ["SANDBOX_DATABASE_FILE"] = str(database["NAME"])
        try:
            config = config_from_options(namespace, environ=environ)
        except AgentConfigError as exc:
            raise CommandError(str(exc), returncode=2) from None
        run(config, loglevel=namespace.loglevel, app=make_app(str(settings.CELERY_BROKER_URL)))
