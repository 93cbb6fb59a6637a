"""``manage.py runstack``: migrate, create the demo, and run the whole portal (``make run``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count

from portal.demo import ensure_demo_data, ensure_demo_fabric
from portal.stack import ProcessSpec, Stack, python_module
from utilities.embedded_redis import ensure_running


def stack_processes(
    *, host: str, port: int, worker: bool = True, beat: bool = True, agents: bool = True
) -> list[ProcessSpec]:
    """The children of the stack: ASGI server, Celery worker and beat, one agent per server."""
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
    if agents:
        from inventory.models import Server
        from jobs.agent_trust import key_text

        servers = Server.objects.annotate(gpus=Count("gpu_set")).order_by("leaf", "slot")
        for node, gpus in servers.values_list("node", "gpus"):
            specs.append(
                ProcessSpec(
                    f"agent {node}",
                    python_module(
                        "workers.agent",
                        "--node",
                        node,
                        "--gpus",
                        str(gpus),
                        "--cpu",
                        "--loglevel",
                        "WARNING",
                    ),
                    env={"AGENT_KEY": key_text(node)},
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
        parser.add_argument(
            "--no-agents",
            action="store_true",
            help="do not start node agents (real servers run theirs)",
        )
        parser.add_argument(
            "--no-demo-fabric", action="store_true", help="do not load the 8-slot demo fabric"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.REDIS_IS_EMBEDDED:  # settings only name it; the stack owns the server
            ensure_running(settings.DATA_DIR)
        call_command("migrate", interactive=False, verbosity=0)
        creds = ensure_demo_data()
        if not options["no_demo_fabric"]:
            ensure_demo_fabric()
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
                agents=not options["no_agents"],
            ),
            log=self._log,
        )
        stack.start()
        status = stack.watch()
        sys.exit(status)

    def _log(self, line: str) -> None:
        self.stdout.write(f"[runstack] {line}")
        self.stdout.flush()
