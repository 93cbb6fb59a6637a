"""API tokens under policy (issue 35): a lifetime capped by the site and the tenants, and
revocation when what a token relied on goes.

The finding: a write token could mint 10-year tokens, and they survived a password
change, a disabled account and the loss of the roles that made them (an SSO group gone).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.hashers import make_password
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tenancy.models import ApiToken, Role, Tenant
from tenancy.services import do_change_role, do_update_tenant
from tenancy.token_services import do_create_token, lifetime_policy
from tenancy.tokens import hash_secret

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Any:
    return make_user("root", staff=True)


def client_with(secret: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Token {secret}")


def issue(user: Any, name: str = "t", scope: str = "write", **kwargs: Any) -> str:
    return do_create_token(user=user, name=name, scope=scope, **kwargs).secret


def status_of(secret: str) -> tuple[int, str]:
    answer = client_with(secret).get("/api/v1/jobs/")
    return answer.status_code, answer.json().get("message", "") if answer.status_code != 200 else ""


def token_of(secret: str) -> ApiToken:
    return ApiToken.objects.get(key_hash=hash_secret(secret))


# --------------------------------------------------------------------------- lifetime


def test_a_write_token_cannot_mint_a_ten_year_token(alice: Any, settings: Any) -> None:
    """The finding, as it was tried: POST /api/v1/tokens/ with 3650 days."""
    assert settings.API_TOKEN_MAX_DAYS == 365
    client = client_with(issue(alice, "bootstrap"))
    refused = client.post(
        "/api/v1/tokens/", {"name": "forever", "expires_in_days": 3650}, format="json"
    )
    assert refused.status_code == 400
    errors = refused.json()["errors"]
    assert list(errors) == ["expires_in_days"]
    assert "at most 365 days" in errors["expires_in_days"][0]
    assert "API_TOKEN_MAX_DAYS" in errors["expires_in_days"][0]
    assert not ApiToken.objects.filter(name="forever").exists()
    made = client.post("/api/v1/tokens/", {"name": "year", "expires_in_days": 365}, format="json")
    assert made.status_code == 201
    huge = client.post("/api/v1/tokens/", {"name": "x", "expires_in_days": 10**30}, format="json")
    assert huge.status_code == 400 and "expires_in_days" in huge.json()["errors"]


def test_a_tenants_shorter_maximum_applies_to_its_members(
    alice: Any, acme: Tenant, globex: Tenant, make_user: Callable[..., Any], admin: Any
) -> None:
    do_update_tenant(acme, by=admin, max_token_days=30)
    do_update_tenant(globex, by=admin, max_token_days=7)
    assert (lifetime_policy(alice).days, lifetime_policy(alice).source) == (
        30,
        "tenant 'acme''s maximum",
    )
    client = client_with(issue(alice, "bootstrap", expires_in_days=30))
    refused = client.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 31}, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"]["expires_in_days"] == [
        "a token lasts at most 30 days (tenant 'acme''s maximum)"
    ]
    default = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    made = token_of_id(default["id"])
    assert made.expires_at - made.created_at == timedelta(days=30)  # 90 by default, cut to 30
    both = make_user("both", acme)
    make_member(both, globex)
    assert lifetime_policy(both).days == 7  # the strictest of the user's tenants
    outsider = make_user("outsider")
    assert lifetime_policy(outsider).days == 365


def token_of_id(pk: int) -> ApiToken:
    return ApiToken.objects.get(pk=pk)


def make_member(user: Any, tenant: Tenant, role: str = Role.MEMBER) -> None:
    from tenancy.services import do_add_member

    do_add_member(tenant=tenant, user=user, role=role)


def test_tokens_made_before_the_policy_stop_at_its_maximum(alice: Any) -> None:
    """A 10-year token minted before the cap stops once it is a year old."""
    long_ago = timezone.now() - timedelta(days=400)
    with override_settings(API_TOKEN_MAX_DAYS=3650):
        secret = issue(alice, "decade", expires_in_days=3650, now=long_ago)
    day = (long_ago + timedelta(days=365)).date().isoformat()
    assert status_of(secret) == (401, f"token expired on {day}")


def test_a_lowered_tenant_maximum_shortens_tokens_already_made(
    alice: Any, acme: Tenant, admin: Any
) -> None:
    made = timezone.now() - timedelta(days=10)
    secret = issue(alice, "ci", expires_in_days=90, now=made)
    assert status_of(secret) == (200, "")
    do_update_tenant(acme, by=admin, max_token_days=7)
    assert status_of(secret) == (401, f"token expired on {(made + timedelta(days=7)).date()}")
    do_update_tenant(acme, by=admin, max_token_days=None)
    assert status_of(secret) == (200, "")  # the policy of the moment, not a revocation


def test_the_token_page_bounds_the_lifetime_too(alice: Any) -> None:
    client = Client()
    client.force_login(alice)
    answer = client.post(
        "/account/token/", {"name": "ci", "scope": "read", "expires_in_days": "3650"}
    )
    assert answer.status_code == 400
    assert b'data-for="expires_in_days"' in answer.content
    assert not ApiToken.objects.filter(user=alice).exists()


# --------------------------------------------------------------------------- revocation


def revocations(user: Any) -> list[str]:
    return [
        entry.after.get("reason", "")
        for entry in AuditEntry.objects.filter(action="token.revoke").order_by("pk")
        if entry.object_id in {str(pk) for pk in user.api_tokens.values_list("pk", flat=True)}
    ]


def test_a_password_change_revokes_every_token(alice: Any) -> None:
    write, read = issue(alice, "w"), issue(alice, "r", scope="read")
    alice.set_password("a new passphrase, long enough")
    alice.save()
    for secret in (write, read):
        code, message = status_of(secret)
        assert code == 401 and message.startswith("token revoked on")
    assert revocations(alice) == ["the user's password changed"] * 2
    fresh = issue(alice, "after")  # a token made after the change works
    assert status_of(fresh) == (200, "")


@override_settings(
    PASSWORD_HASHERS=[
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]
)
def test_a_rehash_of_the_same_password_at_sign_in_revokes_nothing(alice: Any) -> None:
    alice.password = make_password("pw", hasher="pbkdf2_sha256")  # an older hasher's hash
    alice.save()
    secret = issue(alice, "w")
    client = Client()
    assert client.post("/login/", {"username": "alice", "password": "pw"}).status_code == 302
    alice.refresh_from_db()
    assert alice.password.startswith("md5$")  # Django upgraded the hash as it signed in
    assert status_of(secret) == (200, "")


def test_a_disabled_user_loses_every_token_for_good(alice: Any) -> None:
    secret = issue(alice, "w")
    alice.is_active = False
    alice.save()
    assert status_of(secret) == (401, "invalid token")
    alice.is_active = True
    alice.save()  # enabled again: the token stays revoked
    code, message = status_of(secret)
    assert code == 401 and message.startswith("token revoked on")
    assert revocations(alice) == ["the user was disabled"]


def test_losing_staff_revokes_every_token(make_user: Callable[..., Any]) -> None:
    root = make_user("ops-admin", staff=True)
    secret = issue(root, "ops")
    root.is_staff = False
    root.save(update_fields=["is_staff"])
    assert status_of(secret)[1].startswith("token revoked on")
    assert revocations(root) == ["the user is no longer a cluster admin (staff)"]


def test_a_removed_membership_revokes_every_token(alice: Any, acme: Tenant, admin: Any) -> None:
    write, read = issue(alice, "w"), issue(alice, "r", scope="read")
    owner = acme.memberships.get(role=Role.OWNER).user
    removed = client_with(issue(owner, "owner")).delete(f"/api/v1/tenants/acme/members/{alice.pk}/")
    assert removed.status_code == 204
    for secret in (write, read):
        assert status_of(secret)[1].startswith("token revoked on")
    assert revocations(alice) == ["membership of tenant 'acme' removed"] * 2
    revoke = AuditEntry.objects.filter(action="token.revoke").first()
    assert revoke is not None and revoke.actor_name == owner.username  # who made the change


def test_a_deleted_tenant_revokes_its_members_tokens(alice: Any, acme: Tenant) -> None:
    secret = issue(alice, "w")
    acme.delete()  # its memberships go with it
    assert status_of(secret)[1].startswith("token revoked on")


def test_a_lowered_role_revokes_the_write_tokens_only(alice: Any, acme: Tenant, admin: Any) -> None:
    write, read = issue(alice, "w"), issue(alice, "r", scope="read")
    do_change_role(tenant=acme, user=alice, role=Role.OWNER, by=admin)  # raised: nothing
    assert status_of(write) == (200, "")
    do_change_role(tenant=acme, user=alice, role=Role.VIEWER, by=admin)
    assert status_of(write)[1].startswith("token revoked on")
    assert status_of(read) == (200, "")  # reading needs only the membership
    assert revocations(alice) == ["role in tenant 'acme' lowered from owner to viewer"]


def test_unrelated_saves_revoke_nothing(alice: Any) -> None:
    secret = issue(alice, "w")
    alice.email = "alice@example.org"
    alice.save()
    alice.last_login = timezone.now()
    alice.save(update_fields=["last_login"])
    assert status_of(secret) == (200, "")
    assert revocations(alice) == []
