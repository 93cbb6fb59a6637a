"""Django admin helpers shared by the apps."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ReadOnlyAdminMixin:
    """An admin page that shows rows and changes none of them.

    Every change goes through the services, which write the audit log; an admin
    page that could add, change or delete rows would go around both.
    """

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Rows are made through the services (pages, API, commands)."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Read-only: a change here would bypass the services and the audit log."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never deleted here: their history and audit rows refer to them."""
        return False
