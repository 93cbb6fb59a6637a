"""Template context shared by every page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def navigation(request: HttpRequest) -> dict[str, Any]:
    """Expose the tenants the user belongs to, for the navigation bar."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_tenants": []}
    from tenancy.models import Tenant

    return {"nav_tenants": list(Tenant.objects.restrict(user).order_by("slug"))}
