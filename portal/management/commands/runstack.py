"""``manage.py runstack``: migrate, create the demo, and run the whole portal (``make run``).

The stack supervises its children (``portal.stack``): one that dies is started
again with backoff, and so is the embedded Redis that this process owns.
"""

from __future__ import annotations

import os
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count

from audit.context import acting_as, system_actor
from jobs.lifecycle import TICK_QUEUE
from notifications.services import DELIVER_QUEUE
from portal.demo import ensure_demo_data, ensure_demo_fabric
from portal.stack import Keeper, ProcessSpec, Stack, python_module
from utilities.embedded_redis import ensure_running, restart_if_dead
from workers.protocol import HEARTBEATS_QUEUE, REPORTS_QUEUE

WHATIF_QUEUE = "whatif"
"""The what-if simulations' queue: its own worker, one at a time, so they never starve the tick."""
PORTAL_QUEUE = "portal"
"""The control plane's own tasks (log export, retention); agents' reports are on their own
queues (``REPORTS_QUEUE``, ``HEARTBEATS_QUEUE``), where nothing else runs."""
WEBHOOKS_QUEUE = DELIVER_QUEUE
"""Webhook and email deliveries: their own worker, so slow subscribers never delay a report."""
REPORT_WORKER_QUEUES = f"{HEARTBEATS_QUEUE},{REPORTS_QUEUE},{PORTAL_QUEUE}"
"""What the report worker consumes: heartbeats beside the reports, served in turn, so a
backlog of reports never holds a heartbeat back until it expires (``HEARTBEATS_QUEUE``)."""


def celery_worker(name: str, queue: str, *, concurrency: int) -> ProcessSpec:
    """A Celery worker of the portal's app that consumes only ``queue`` (comma-separated)."""
    argv = ("-A", "portal", "worker", "-Q", queue, "-n", f"{queue}@%h")
    return ProcessSpec(
        name,
        python_module("celery", *argv, "--concurrency", str(concurrency), "--loglevel", "INFO"),
    )


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (the banner goes to logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def stack_processes(
    *, host: str, port: int, worker: bool = True, beat: bool = True, agents: bool = True
) -> list[ProcessSpec]:
    """The children of the stack: ASGI server, Celery workers and beat, one agent per server."""
    data_dir = str(settings.DATA_DIR)
    specs = [
        ProcessSpec(
            "web", python_module("daphne", "-b", host, "-p", str(port), "portal.asgi:application")
        ),
    ]
    if worker:
        specs += [
            celery_worker("worker", REPORT_WORKER_QUEUES, concurrency=2),
            celery_worker("tick worker", TICK_QUEUE, concurrency=1),
            celery_worker("whatif worker", WHATIF_QUEUE, concurrency=1),
            celery_worker("webhooks worker", WEBHOOKS_QUEUE, concurrency=2),
        ]
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

    help = (
        "Migrate, create demo data, and run (and keep running) the ASGI server, the Celery "
        "workers (queues portal and whatif), beat and the demo agents."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("PORTAL_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORTAL_PORT", "8000")))
        parser.add_argument("--no-worker", action="store_true", help="do not start Celery workers")
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
        keepers: list[Keeper] = []
        if settings.REDIS_IS_EMBEDDED:  # settings only name it; the stack owns the server
            ensure_running(settings.DATA_DIR)
            keepers.append(lambda: restart_if_dead(settings.DATA_DIR))
        call_command("migrate", interactive=False, verbosity=0)
        with acting_as(system_actor("manage.py runstack")):  # the demo's tenant and fabric
            demo = ensure_demo_data(external_database=bool(settings.DATABASE_URL))
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
            f"\nGPU portal: {url}\n{demo.describe()}"
            f"  database: {db}\n  redis: {redacted(settings.REDIS_URL)}"
            " (new password: stop, then manage.py rotateredispassword)\n"
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
            keepers=keepers,
        )
        stack.start()
        sys.exit(stack.watch())

    def _log(self, line: str) -> None:
        self.stdout.write(f"[runstack] {line}")
        self.stdout.flush()
