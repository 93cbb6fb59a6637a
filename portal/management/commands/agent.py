"""``python manage.py agent --node NAME [--gpus N]``: run the node agent (see docs/agent.md)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from workers.agent.service import add_arguments, run_options


class Command(BaseCommand):
    help = "Run the node agent: a Celery worker on queue agent.<node> that runs training processes."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        status = run_options(argparse.Namespace(**options))
        if status != 0:
            raise CommandError("bad agent options", returncode=status)
