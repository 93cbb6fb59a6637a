"""``python manage.py rotateredispassword``: give the portal's Redis user a new password.

With the embedded Redis (no ``REDIS_URL``) the new password is made and kept
in ``$PORTAL_DATA_DIR/redis/password``; the stack must be stopped first,
since each of its processes read the old one when it started, and picks the
new one up when started again.  With a Redis of your own (``REDIS_URL``) the
portal does not own the server: the command prints the steps
(docs/security.md, "Credentials").
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from utilities.embedded_redis import EmbeddedRedisError, rotate_password

EXTERNAL_STEPS = """\
REDIS_URL names a Redis server the portal does not own. To rotate its password:
  1. on the server: ACL SETUSER <user> >NEW-PASSWORD   (add the new one; the old still works)
  2. set REDIS_URL (and CELERY_BROKER_URL, if set) to the new password for the web, Celery
     and beat processes and every agent, and restart them
  3. on the server: ACL SETUSER <user> <OLD-PASSWORD   (remove the old one)
Per-job users (edl-*) derive from the agents' own secret and need nothing.
"""


class Command(BaseCommand):
    help = "Give the embedded Redis a new password (stop the stack first)."
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.REDIS_IS_EMBEDDED:
            self.stdout.write(EXTERNAL_STEPS)
            return
        try:
            rotate_password(settings.DATA_DIR)
        except EmbeddedRedisError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(
            f"the embedded Redis of {settings.DATA_DIR} has a new password; start the stack again"
        )
