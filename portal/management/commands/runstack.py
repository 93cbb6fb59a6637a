"""``manage.py runstack``: migrate, create the demo, and run the whole portal (``make run``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from portal.demo import ensure_demo_data
from portal.stack import ProcessSpec, Stack, python_module


def stack_processes(
    *, host: str, port: int, worker: bool = True, beat: bool = True
) -> list[ProcessSpec]:
    """The children of the stack: ASGI server, Celery worker and beat."""
    data_dir = str(settings.DATA_DIR)
    specs = [
        ProcessSpec(
            "web", python_module("daphne", "-b", host, "-p", str(port), "portal.asgi:application")
        ),
    ]
    if worker:
        specs.append(
            ProcessSpec(
                "worker",
                python_module(
                    "celery",
                    "-A",
                    "portal",
                    "worker",
                    "-Q",
                    "portal",
                    "-n",
                    "portal@%h",
                    "--concurrency",
                    "2",
                    "--loglevel",
                    "INFO",
                ),
            )
        )
    if beat:
        specs.append(
            ProcessSpec(
                "beat",
                python_module(
                    "celery",
                    "-A",
                    "portal",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "--schedule",
                    os.path.join(data_dir, "celerybeat-schedule"),
                ),
            )
        )
    return specs


class Command(BaseCommand):
    """Run the portal with everything it needs, until Ctrl-C."""

    help = "Migrate, create demo data, and run the ASGI server, Celery worker and beat."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("PORTAL_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORTAL_PORT", "8000")))
        parser.add_argument("--no-worker", action="store_true", help="do not start Celery")
        parser.add_argument("--no-beat", action="store_true", help="do not start Celery beat")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        creds = ensure_demo_data()
        env = {
            "DJANGO_SETTINGS_MODULE": os.environ.get(
                "DJANGO_SETTINGS_MODULE", "portal.settings.dev"
            ),
            "REDIS_URL": settings.REDIS_URL,
        }
        os.environ.update(env)
        url = f"http://{options['host']}:{options['port']}/"
        db = (
            "PostgreSQL"
            if settings.DATABASE_URL
            else f"SQLite at {settings.DATABASES['default']['NAME']}"
        )
        self.stdout.write(
            f"\nGPU portal: {url}\n"
            f"  admin:  {creds.admin_user} / {creds.admin_password}   (cluster admin)\n"
            f"  tenant: {creds.tenant_user} / {creds.tenant_password}   (tenant '{creds.tenant}')\n"
            f"  database: {db}\n  redis: {settings.REDIS_URL}\n"
            f"  API docs: {url}api/docs/   Ctrl-C stops everything.\n"
        )
        self.stdout.flush()
        stack = Stack(
            stack_processes(
                host=options["host"],
                port=options["port"],
                worker=not options["no_worker"],
                beat=not options["no_beat"],
            ),
            log=lambda line: print(f"[runstack] {line}", flush=True),
        )
        stack.start()
        status = stack.watch()
        sys.exit(status)
