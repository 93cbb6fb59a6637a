"""The demo data that ``make run`` creates on first start: an admin and a tenant."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from tenancy.models import Tenant
from tenancy.services import do_create_tenant

DEMO_FABRIC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}
DEMO_ADMIN = ("admin", "admin")
DEMO_TENANT = ("demo", "demo", "demo")  # slug, owner, password


@dataclass(frozen=True)
class DemoCredentials:
    """Who can log in to the demo."""

    admin_user: str
    admin_password: str
    tenant: str
    tenant_user: str
    tenant_password: str


@transaction.atomic
def ensure_demo_data() -> DemoCredentials:
    """Create the demo admin and tenant if they are missing (idempotent)."""
    user_model = get_user_model()
    admin_name, admin_password = DEMO_ADMIN
    if not user_model.objects.filter(username=admin_name).exists():
        user_model.objects.create_superuser(admin_name, "", admin_password)
    slug, owner, password = DEMO_TENANT
    if not Tenant.objects.filter(slug=slug).exists():
        do_create_tenant(
            slug=slug, owner_username=owner, name="Demo team", password=password, gpu_quota=8
        )
    return DemoCredentials(admin_name, admin_password, slug, owner, password)


def ensure_demo_fabric() -> None:
    """Load the 8-slot demo fabric (2 leaves, 2 spines, 2 servers/leaf, 2 GPUs/server) once."""
    from inventory.services import current_spec, do_load_topology

    if current_spec() is None:
        do_load_topology(DEMO_FABRIC)
