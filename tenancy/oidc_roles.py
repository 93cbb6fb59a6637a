"""``OIDC_ROLE_MAP``: which claim values give which tenant roles (pure; no Django).

The map is a comma-separated list of ``VALUE:TENANT:ROLE`` rules (docs/sso.md)::

    OIDC_ROLE_MAP="ml-team:team-a:member, ml-leads:team-a:owner, auditors:team-a:viewer,
                   cluster-admins:*:staff"

- ``VALUE`` is one value of the groups claim (``OIDC_GROUPS_CLAIM``, default ``groups``);
  it may itself contain colons (``org:team:ml:acme:member`` reads as value ``org:team:ml``),
  not commas;
- ``TENANT`` is a tenant's slug, or ``*`` with role ``staff`` (a cluster admin);
- ``ROLE`` is ``owner``, ``member`` or ``viewer`` (tenancy.models.Role), or ``staff``.

A user in several groups gets, in each tenant, the highest role any of them gives
(owner > member > viewer).  Anything else is refused with a message naming the rule,
so a typo stops the portal at start-up instead of silently granting nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Tenant roles from lowest to highest (the values of tenancy.models.Role).
TENANT_ROLES: tuple[str, ...] = ("viewer", "member", "owner")
STAFF = "staff"
ALL_TENANTS = "*"
# tenancy.services.check_slug's rule: what slugify() keeps, at most 50 characters.
_SLUG = re.compile(r"^[a-z0-9_-]{1,50}$")


class RoleMapError(ValueError):
    """A malformed ``OIDC_ROLE_MAP``; the message names the rule and what is wrong."""


@dataclass(frozen=True)
class RoleRule:
    """One rule: members of ``group`` get ``role`` in ``tenant`` (``*`` + ``staff``: admin)."""

    group: str
    tenant: str
    role: str


@dataclass(frozen=True)
class Grants:
    """What a set of claim values gives: the highest role per tenant slug, and staff."""

    tenant_roles: tuple[tuple[str, str], ...]  # (slug, role), sorted by slug
    staff: bool

    def role_in(self, slug: str) -> str | None:
        """The role given in tenant ``slug``, or None."""
        return dict(self.tenant_roles).get(slug)


def role_rank(role: str) -> int:
    """Order of tenant roles: viewer 0 < member 1 < owner 2 (unknown: -1)."""
    return TENANT_ROLES.index(role) if role in TENANT_ROLES else -1


def _rule(text: str) -> RoleRule:
    parts = text.rsplit(":", 2)
    if len(parts) != 3:
        raise RoleMapError(f"OIDC_ROLE_MAP rule {text!r}: expected VALUE:TENANT:ROLE")
    group, tenant, role = (part.strip() for part in parts)
    if not group:
        raise RoleMapError(f"OIDC_ROLE_MAP rule {text!r}: the claim value is empty")
    if role == STAFF:
        if tenant != ALL_TENANTS:
            raise RoleMapError(
                f"OIDC_ROLE_MAP rule {text!r}: role 'staff' (cluster admin) takes tenant '*'"
            )
    elif role in TENANT_ROLES:
        if not _SLUG.match(tenant):
            raise RoleMapError(
                f"OIDC_ROLE_MAP rule {text!r}: {tenant!r} is not a tenant slug "
                "(lowercase letters, digits, hyphens; '*' only with role 'staff')"
            )
    else:
        known = ", ".join((*TENANT_ROLES, STAFF))
        raise RoleMapError(f"OIDC_ROLE_MAP rule {text!r}: unknown role {role!r} (known: {known})")
    return RoleRule(group=group, tenant=tenant, role=role)


def parse_role_map(text: str) -> tuple[RoleRule, ...]:
    """The rules of ``text`` (empty: none); ``RoleMapError`` on the first malformed one.

    The same value and tenant may appear once: two roles for them would be a typo.
    """
    if not text.strip():
        return ()
    rules: list[RoleRule] = []
    seen: dict[tuple[str, str], str] = {}
    for raw in text.split(","):
        if not raw.strip():
            raise RoleMapError(
                f"OIDC_ROLE_MAP has an empty rule (two commas, or one at an end): {text!r}"
            )
        rule = _rule(raw.strip())
        key = (rule.group, rule.tenant)
        if key in seen:
            raise RoleMapError(
                f"OIDC_ROLE_MAP gives {rule.group!r} in {rule.tenant!r} twice "
                f"({seen[key]!r} and {rule.role!r})"
            )
        seen[key] = rule.role
        rules.append(rule)
    return tuple(rules)


def grants_for(rules: Iterable[RoleRule], values: Iterable[str]) -> Grants:
    """What the claim ``values`` (a user's groups) give under ``rules``."""
    held = set(values)
    best: dict[str, str] = {}
    staff = False
    for rule in rules:
        if rule.group not in held:
            continue
        if rule.role == STAFF:
            staff = True
        elif role_rank(rule.role) > role_rank(best.get(rule.tenant, "")):
            best[rule.tenant] = rule.role
    return Grants(tenant_roles=tuple(sorted(best.items())), staff=staff)
