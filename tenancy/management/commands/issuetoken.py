"""``manage.py issuetoken USERNAME``: print the user's API token on one line."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenancy.services import do_issue_token


class Command(BaseCommand):
    """Print a user's API token, creating it on first use."""

    help = "Print USERNAME's API token (for 'Authorization: Token <key>')."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user named {options['username']!r}")
        self.stdout.write(do_issue_token(user=user))
