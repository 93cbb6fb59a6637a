"""The portal's own ``manage.py check --deploy`` checks, beside Django's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


def labs_have_hosts_of_their_own(app_configs: Any = None, **kwargs: Any) -> list[checks.Warning]:
    """Warn when session labs share the portal's origin (no ``LAB_HOST_TEMPLATE``): a
    notebook's script could then act in the portal as whoever views it."""
    if settings.LAB_HOST_TEMPLATE:
        return []
    return [
        checks.Warning(
            "LAB_HOST_TEMPLATE is empty: session labs are served on the portal's origin, "
            "where a notebook's script can call the portal as the person viewing it.",
            hint="Set LAB_HOST_TEMPLATE to a wildcard host such as {id}.labs.example.net "
            "(docs/security.md, 'Labs on hosts of their own').",
            id="portal.W001",
        )
    ]
