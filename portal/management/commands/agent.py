"""``python manage.py agent --node NAME [--gpus N]``: run the node agent (see docs/agent.md)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

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
        try:
            config = config_from_options(namespace)
        except AgentConfigError as exc:
            raise CommandError(str(exc), returncode=2) from None
        run(config, loglevel=namespace.loglevel)
