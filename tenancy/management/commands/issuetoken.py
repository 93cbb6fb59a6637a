"""``manage.py issuetoken USERNAME [--name N] [--expires-in DAYS] [--scope read|write]``.

Makes a new API token and prints its secret alone on one line (scripts read it
with ``$(...)``); the secret is stored hashed, so each run makes a new token.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.context import acting_as, system_actor
from tenancy.models import TokenScope
from tenancy.services import TenancyError
from tenancy.token_services import do_issue_token


class Command(BaseCommand):
    """Make an API token for a user and print its secret."""

    help = (
        "Make an API token for USERNAME and print it (for 'Authorization: Token <secret>'). "
        "Without --name it is called 'default' (or default-2, ... when taken)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", help="the token's name, unique among the user's tokens")
        parser.add_argument(
            "--expires-in",
            type=int,
            metavar="DAYS",
            help="days until it expires (default: the API_TOKEN_DAYS setting)",
        )
        parser.add_argument(
            "--scope", choices=TokenScope.values, default=TokenScope.WRITE, help="default: write"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user named {options['username']!r}")
        try:
            with acting_as(system_actor("manage.py issuetoken")):
                secret = do_issue_token(
                    user=user,
                    name=options["name"],
                    scope=options["scope"],
                    expires_in_days=options["expires_in"],
                )
        except TenancyError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(secret)
