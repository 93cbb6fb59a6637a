"""``python manage.py agentkey NODE``: print the signing key an operator gives that node's agent.

The key is derived from the portal's master secret (``AGENT_SIGNING_KEY``,
else ``SECRET_KEY``; ``jobs.agent_trust``), so it needs no storage: give it
to the agent as ``AGENT_KEY`` or in a file named by ``AGENT_KEY_FILE`` /
``--key-file`` (mode 0600).  Anyone who has it can sign as that node.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.agent_trust import key_text
from workers.protocol import ProtocolError, check_name


class Command(BaseCommand):
    help = "Print the signing key (hex) of one node's agent, for AGENT_KEY or AGENT_KEY_FILE."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node", help="the node's name (its server's node in the inventory)")

    def handle(self, *args: Any, **options: Any) -> None:
        node = str(options["node"])
        try:
            check_name(node, "node")
        except ProtocolError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(key_text(node))
