"""The demo data that ``make run`` creates on first start: an admin and a tenant.

No fixed passwords: each demo account gets a random one when it is created,
printed once by ``runstack``; on an external database there are no demo
accounts at all.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from tenancy.models import Tenant
from tenancy.services import do_create_tenant

DEMO_FABRIC = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}
DEMO_ADMIN = "admin"
DEMO_TENANT = ("demo", "demo")  # slug, owner


@dataclass(frozen=True)
class DemoAccount:
    """One demo login; ``password`` is known only on the run that created the account."""

    username: str
    password: str | None
    role: str


@dataclass(frozen=True)
class DemoCredentials:
    """Who can log in to the demo; empty on a real (external) database."""

    accounts: tuple[DemoAccount, ...] = ()
    skipped: bool = False

    def describe(self) -> str:
        """Lines for the ``runstack`` banner: a new password once, never again."""
        if self.skipped:
            return (
                "  no demo users (DATABASE_URL is set): create your own with "
                "`manage.py createsuperuser` and `manage.py createtenant`\n"
            )
        lines = []
        for account in self.accounts:
            if account.password is not None:
                lines.append(
                    f"  {account.role}: {account.username} / {account.password}   "
                    "(new password, shown this once: note it now)\n"
                )
            else:
                lines.append(
                    f"  {account.role}: {account.username}   (password shown when it was "
                    "created; `manage.py changepassword` sets a new one)\n"
                )
        return "".join(lines)


def new_password() -> str:
    """A random password for a demo account (about 96 bits, easy to copy)."""
    return secrets.token_urlsafe(12)


@transaction.atomic
def ensure_demo_data(*, external_database: bool) -> DemoCredentials:
    """Create the demo admin and tenant if they are missing (idempotent).

    Each account gets a random password when it is created, returned this once
    and never again.  On an external database (``DATABASE_URL`` set, a real
    deployment) no demo account is created at all.
    """
    if external_database:
        return DemoCredentials(skipped=True)
    user_model = get_user_model()
    admin_password: str | None = None
    if not user_model.objects.filter(username=DEMO_ADMIN).exists():
        admin_password = new_password()
        user_model.objects.create_superuser(DEMO_ADMIN, "", admin_password)
    slug, owner = DEMO_TENANT
    tenant_password: str | None = None
    if not Tenant.objects.filter(slug=slug).exists():
        existing_owner = user_model.objects.filter(username=owner).exists()
        tenant_password = None if existing_owner else new_password()
        do_create_tenant(
            slug=slug, owner_username=owner, name="Demo team", password=tenant_password, gpu_quota=8
        )
    return DemoCredentials(
        accounts=(
            DemoAccount(DEMO_ADMIN, admin_password, "admin "),
            DemoAccount(owner, tenant_password, f"tenant '{slug}'"),
        )
    )


TWO_TYPE_SERVERS = (
    # (leaf, slot, node, gpu type, pool): one leaf of each type, a pool label per server
    (0, 0, "a100-0", "a100-40g", "train"),
    (0, 1, "a100-1", "a100-40g", "interactive"),
    (1, 0, "h100-0", "h100-80g", "train"),
    (1, 1, "h100-1", "h100-80g", "interactive"),
)


def two_type_fabric() -> dict[str, object]:
    """The demo fabric with two GPU types (``DEMO_CLUSTER=two-type``): leaf 0 holds A100s
    (32 cores, 256 GiB), leaf 1 H100s (64 cores, 512 GiB), each server labelled with a pool."""
    servers = [
        {
            "leaf": leaf,
            "slot": slot,
            "node": node,
            "gpu_type": gpu_type,
            "cpu_cores": 32 if gpu_type.startswith("a100") else 64,
            "memory_mib": (256 if gpu_type.startswith("a100") else 512) * 1024,
            "labels": {"pool": pool},
        }
        for leaf, slot, node, gpu_type, pool in TWO_TYPE_SERVERS
    ]
    return {**DEMO_FABRIC, "servers": servers}


def uniform_fabric() -> dict[str, object]:
    """The demo fabric of one GPU type (``DEMO_CLUSTER=uniform``, the default)."""
    return dict(DEMO_FABRIC)


DEMO_CLUSTERS: dict[str, Callable[[], dict[str, object]]] = {
    "uniform": uniform_fabric,
    "two-type": two_type_fabric,
}
"""The demo fabrics ``DEMO_CLUSTER`` chooses from (``uniform``, the default: one type)."""


def demo_fabric(name: str) -> dict[str, object]:
    """The topology document of demo cluster ``name`` (ValueError naming the choices)."""
    if name not in DEMO_CLUSTERS:
        raise ValueError(f"DEMO_CLUSTER={name!r}: choose one of {', '.join(DEMO_CLUSTERS)}")
    return DEMO_CLUSTERS[name]()


def ensure_demo_fabric() -> None:
    """Load the demo fabric (``DEMO_CLUSTER``: 2 leaves, 2 spines, 2 servers/leaf, 2
    GPUs/server, of one type or of two) once."""
    from django.conf import settings

    from inventory.services import current_spec, do_load_topology

    if current_spec() is None:
        do_load_topology(demo_fabric(settings.DEMO_CLUSTER))
