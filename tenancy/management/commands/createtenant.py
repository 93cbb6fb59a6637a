"""``manage.py createtenant SLUG --owner USERNAME [--password P] [--gpu-quota N]
[--max-queued-jobs N] [--no-profile]``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.context import acting_as, system_actor
from tenancy.services import TenancyError, check_password_strength, do_create_tenant


class Command(BaseCommand):
    """Create a tenant and its owner (the owner user is created if needed)."""

    help = "Create a tenant and make USERNAME its owner (creating the user if needed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="short unique name: lowercase letters, digits, hyphens")
        parser.add_argument("--owner", required=True, help="username of the owner")
        parser.add_argument(
            "--password",
            help="password for the owner (sets or changes it); must pass the password validators",
        )
        parser.add_argument("--name", help="display name (defaults to the slug)")
        parser.add_argument("--gpu-quota", type=int, default=8, help="most GPUs held at once")
        parser.add_argument(
            "--max-queued-jobs",
            type=int,
            help="most jobs waiting at once (default: DEFAULT_TENANT_MAX_QUEUED_JOBS)",
        )
        parser.add_argument(
            "--no-profile",
            action="store_true",
            help="do not profile each job's throughput curve on its first run",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with acting_as(system_actor("manage.py createtenant")):
                if options["password"] is not None:
                    check_password_strength(username=options["owner"], password=options["password"])
                created = do_create_tenant(
                    slug=options["slug"],
                    owner_username=options["owner"],
                    name=options["name"],
                    password=options["password"],
                    gpu_quota=options["gpu_quota"],
                    max_queued_jobs=options["max_queued_jobs"],
                    profile_jobs=not options["no_profile"],
                )
        except TenancyError as exc:
            raise CommandError(str(exc)) from exc
        who = "new user" if created.owner_created else "existing user"
        self.stdout.write(
            f"created tenant {created.tenant.slug} (quota {created.tenant.gpu_quota} GPUs), "
            f"owner {options['owner']} ({who})"
        )
