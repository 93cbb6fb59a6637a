"""Models of the portal app: tenancy and the cluster inventory."""

from portal.models.inventory import Fabric, Gpu, Server, ServerState
from portal.models.tenancy import (
    WRITE_ROLES,
    Membership,
    Role,
    Tenant,
    TenantOwnedQuerySet,
    TenantQuerySet,
)

__all__ = [
    "WRITE_ROLES",
    "Fabric",
    "Gpu",
    "Membership",
    "Role",
    "Server",
    "ServerState",
    "Tenant",
    "TenantOwnedQuerySet",
    "TenantQuerySet",
]
