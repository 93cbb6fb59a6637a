"""The migration that remembers single sign-on's earlier grants (tenancy 0010): roles given
before it are taken back on a later sign-in as well, and roles given in the portal are not."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from tenancy.models import OidcGrant
from tenancy.oidc_config import oidc_config

BEFORE = [("tenancy", "0009_tenant_max_token_days"), ("audit", "0002_append_only")]
SSO = "single sign-on (https://id.example.org)"


def _migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


@pytest.mark.django_db(transaction=True)
def test_earlier_sso_grants_are_found_in_the_audit_log(settings: Any) -> None:
    settings.OIDC = oidc_config(
        issuer="https://id.example.org",
        client_id="portal",
        role_map="ml-team:acme:member,admins:*:staff",
    )
    executor = _migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    users, tenants = old.get_model("auth", "User"), old.get_model("tenancy", "Tenant")
    memberships = old.get_model("tenancy", "Membership")
    entries = old.get_model("audit", "AuditEntry")
    acme = tenants.objects.create(slug="acme", name="acme")
    globex = tenants.objects.create(slug="globex", name="globex")
    carol, dave = users.objects.create(username="carol"), users.objects.create(username="dave")
    root = users.objects.create(username="root-sso", is_staff=True)
    users.objects.create(username="local-admin", is_staff=True)  # not linked: the admin's
    identities = old.get_model("tenancy", "OidcIdentity")
    for n, user in enumerate((carol, dave, root)):
        identities.objects.create(user=user, issuer="https://id.example.org", subject=f"s{n}")

    def log(membership: Any, action: str, via: str, before: str | None, after: str) -> None:
        entries.objects.create(
            at=timezone.now(), actor_name="system", via=via, tenant_id=membership.tenant_id,
            action=action, object_type="tenancy.membership", object_id=str(membership.pk),
            before={"role": before} if before else {}, after={"role": after},
        )  # fmt: skip

    by_sso = memberships.objects.create(user=carol, tenant=acme, role="member")
    log(by_sso, "membership.add", SSO, None, "member")
    raised = memberships.objects.create(user=dave, tenant=acme, role="owner")
    log(raised, "membership.add", "session", None, "viewer")
    log(raised, "membership.role", SSO, "viewer", "owner")
    changed_since = memberships.objects.create(user=carol, tenant=globex, role="viewer")
    log(changed_since, "membership.add", SSO, None, "member")
    log(changed_since, "membership.role", "session", "member", "viewer")
    by_hand = memberships.objects.create(user=dave, tenant=globex, role="member")
    log(by_hand, "membership.add", "session", None, "member")

    _migrate(executor.loader.graph.leaf_nodes())

    found = {
        (g.user.username, g.tenant.slug if g.tenant else None, g.role, g.replaced_role)
        for g in OidcGrant.objects.select_related("user", "tenant")
    }
    assert found == {
        ("carol", "acme", "member", ""),
        ("dave", "acme", "owner", "viewer"),
        ("root-sso", None, "staff", ""),  # linked, staff, and the map has a staff rule
    }
