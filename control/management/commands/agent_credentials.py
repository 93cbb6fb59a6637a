"""``python manage.py agent_credentials NODE``: make NODE's agent Redis user, print its URL.

Where agents log into Redis as their own users (``AGENT_REDIS_USERS``,
``control.agent_users``), give the printed URL to that node's agent as
its ``REDIS_URL`` (in place of the portal's), beside its ``AGENT_KEY``
(``manage.py agentkey NODE``).  The password derives from the agents'
secret in Redis, so running the command again prints the same URL; the
control plane keeps the user's rules current from then on.  The URL names
the portal's Redis host as the portal reaches it: write the address the
node reaches it at if that differs.

``--switch-on`` gives back the user of an agent that the control plane
switched off for holding more than its share of a full server
(``agent_users.guard_agents``): do it once the node is trusted again, then
mark its server up.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from control import agent_users
from utilities.redis_clients import shared_redis
from workers.agent.redis_acl import RESERVED_NODES, agent_url, switch_on_agent
from workers.protocol import ProtocolError, check_name


class Command(BaseCommand):
    help = "Make one node's agent Redis user and print the REDIS_URL its agent logs in with."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node", help="the node's name (its server's node in the inventory)")
        parser.add_argument(
            "--switch-on",
            action="store_true",
            help="give back a user the control plane switched off (over its share of Redis)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        node = str(options["node"])
        try:
            check_name(node, "node")
        except ProtocolError as exc:
            raise CommandError(str(exc), returncode=2) from None
        if node in RESERVED_NODES:
            raise CommandError(f"node {node!r} cannot have an agent user: rename it", returncode=2)
        if not agent_users.enabled():
            raise CommandError(
                "agents use the portal's Redis user here (AGENT_REDIS_USERS is off, or the "
                "server is older than Redis 7 and has no key selectors)"
            )
        if options["switch_on"] and switch_on_agent(shared_redis(), node):
            self.stderr.write(f"the agent user of {node} may be used again")
        agent_users.sync_nodes([node])
        self.stdout.write(agent_url(str(settings.REDIS_URL), shared_redis(), node))
