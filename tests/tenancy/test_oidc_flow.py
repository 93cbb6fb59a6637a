"""Single sign-on against a real OpenID Connect provider on loopback (no browser).

The test plays the browser with Django's test client on the portal's side and
plain HTTP on the provider's: the portal really fetches discovery, keys, tokens
and userinfo from the provider over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client
from joserfc.jwk import RSAKey
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tenancy.models import Membership, OidcGrant, OidcIdentity, Role, Tenant
from tenancy.oidc_config import oidc_config
from tenancy.services import do_add_member, do_change_role
from tenancy.token_services import do_issue_token
from tests.tenancy.oidc_provider import Provider

ROLE_MAP = "ml-team:acme:member,ml-leads:acme:owner,auditors:acme:viewer,admins:*:staff,ghosts:nowhere:member"


@pytest.fixture
def provider() -> Iterator[Provider]:
    served = Provider().start()
    yield served
    served.stop()


@pytest.fixture
def sso(provider: Provider, settings: Any) -> Provider:
    """Single sign-on on, against ``provider``."""
    settings.OIDC = oidc_config(
        issuer=provider.issuer,
        client_id=provider.client_id,
        client_secret=provider.client_secret,
        role_map=ROLE_MAP,
    )
    return provider


def authorize(client: Client, provider: Provider, username: str, next_url: str = "") -> str:
    """Start at the portal, sign in at the provider; returns the callback URL it sends back."""
    start = client.get("/oidc/login/", {"next": next_url} if next_url else {})
    assert start.status_code == 302, start.content
    url = start["Location"]
    assert url.startswith(provider.issuer + "/authorize?")
    params = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert params["code_challenge_method"] == "S256" and params["code_challenge"]
    assert params["nonce"] and params["state"]
    assert requests.get(url, timeout=10).status_code == 200  # the provider's sign-in page
    answer = requests.post(
        provider.issuer + "/authorize",
        data={**params, "username": username, "password": "pw"},
        allow_redirects=False,
        timeout=10,
    )
    assert answer.status_code == 302, answer.text
    return str(answer.headers["Location"])


def callback(client: Client, url: str) -> Any:
    """Follow the provider's redirect back to the portal."""
    parts = urlsplit(url)
    return client.get(f"{parts.path}?{parts.query}")


def sign_in(client: Client, provider: Provider, username: str, next_url: str = "") -> Any:
    return callback(client, authorize(client, provider, username, next_url))


def signed_in_as(client: Client) -> Any:
    """The user the client's session belongs to, or None."""
    page = client.get("/")
    return page.context["user"] if page.status_code == 200 else None


def test_a_new_user_signs_in_with_the_mapped_role(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    acme = make_tenant("acme")
    subject = sso.add_user("carol", "pw", email="carol@example.org", groups=["ml-team"])

    answer = sign_in(client, sso, "carol")

    assert answer.status_code == 302 and answer["Location"] == "/"
    carol = signed_in_as(client)
    assert carol.username == "carol" and carol.email == "carol@example.org"
    assert not carol.has_usable_password() and not carol.is_staff
    assert OidcIdentity.objects.get(user=carol).subject == subject
    assert Membership.objects.get(user=carol).role == Role.MEMBER
    assert Membership.objects.get(user=carol).tenant == acme
    assert f'data-tenant="{acme.pk}"' in client.get("/").content.decode()  # its dashboard
    # PKCE: the verifier went with the code to the token endpoint (the provider checked it).
    assert sso.token_requests[-1]["code_verifier"]
    # The grant is in the audit log, made by the portal acting for single sign-on.
    grant = AuditEntry.objects.get(
        action="membership.add", tenant_id=acme.pk, object_repr__contains="carol"
    )
    assert grant.via == f"single sign-on ({sso.issuer})" and grant.after["role"] == Role.MEMBER


def resign(client: Client, provider: Provider, username: str, groups: list[str]) -> Any:
    """The user's groups at the provider are now ``groups``; they sign in again."""
    provider.add_user(username, "pw", groups=groups)
    client.logout()
    assert sign_in(client, provider, username).status_code == 302
    return signed_in_as(client)


def test_each_sign_in_follows_the_groups_up_and_down(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    """Issue 35: a role single sign-on gave is taken back when the group goes."""
    acme = make_tenant("acme")
    sso.add_user("carol", "pw", groups=["auditors"])
    sign_in(client, sso, "carol")
    carol = signed_in_as(client)
    assert Membership.objects.get(user=carol, tenant=acme).role == Role.VIEWER

    for groups, expected in [
        (["ml-leads", "auditors"], Role.OWNER),  # raised to the highest the map gives
        (["auditors"], Role.VIEWER),  # lowered: the group that made her owner is gone
        ([], None),  # removed: no group gives acme any more
        (["ml-team"], Role.MEMBER),  # and given again
    ]:
        assert resign(client, sso, "carol", groups) == carol
        found = Membership.objects.filter(user=carol, tenant=acme).first()
        assert (found.role if found else None) == expected, groups
    assert get_user_model().objects.filter(username__startswith="carol").count() == 1
    actions = AuditEntry.objects.filter(tenant_id=acme.pk, object_repr__contains="carol")
    assert {entry.via for entry in actions} == {f"single sign-on ({sso.issuer})"}
    assert "membership.remove" in {entry.action for entry in actions}


def test_roles_given_in_the_portal_are_never_taken_by_a_sign_in(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    sso.add_user("carol", "pw", groups=["ml-team"])
    sign_in(client, sso, "carol")
    carol = signed_in_as(client)
    do_add_member(tenant=globex, user=carol, role=Role.MEMBER)  # an owner's doing
    # An owner makes her a viewer in acme: from now on acme's role is the portal's.
    do_change_role(tenant=acme, user=carol, role=Role.VIEWER)
    resign(client, sso, "carol", [])
    assert Membership.objects.get(user=carol, tenant=globex).role == Role.MEMBER
    assert Membership.objects.get(user=carol, tenant=acme).role == Role.VIEWER
    # A group raises a role the portal gave; losing the group goes back to that role.
    resign(client, sso, "carol", ["ml-leads"])
    assert Membership.objects.get(user=carol, tenant=acme).role == Role.OWNER
    resign(client, sso, "carol", [])
    assert Membership.objects.get(user=carol, tenant=acme).role == Role.VIEWER


def test_the_last_owner_stays_until_another_is_made(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    acme = make_tenant("acme")
    sso.add_user("lead", "pw", groups=["ml-leads"])
    sign_in(client, sso, "lead")
    lead = signed_in_as(client)
    Membership.objects.filter(tenant=acme, user__username="acme-owner").delete()
    assert resign(client, sso, "lead", []) == lead  # signed in; acme keeps an owner
    assert Membership.objects.get(user=lead, tenant=acme).role == Role.OWNER
    assert OidcGrant.objects.filter(user=lead, tenant=acme).exists()  # tried again next time


def test_groups_that_map_to_nothing_sign_in_with_no_tenant(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    make_tenant("acme")
    sso.add_user("erin", "pw", groups=["strangers", "ghosts"])  # ghosts: a tenant that is not

    assert sign_in(client, sso, "erin").status_code == 302
    erin = signed_in_as(client)
    assert erin.username == "erin"
    assert not Membership.objects.filter(user=erin).exists()
    assert "No tenant yet" in client.get("/").content.decode()


def test_a_staff_rule_makes_a_cluster_admin(sso: Provider, client: Client, db: None) -> None:
    sso.add_user("root-sso", "pw", groups=["admins"])
    sign_in(client, sso, "root-sso")
    assert signed_in_as(client).is_staff


def test_staff_single_sign_on_gave_goes_with_the_group(
    sso: Provider, client: Client, db: None
) -> None:
    """Issue 35: SSO-granted staff was never revoked."""
    sso.add_user("root-sso", "pw", groups=["admins"])
    sign_in(client, sso, "root-sso")
    root = signed_in_as(client)
    token = do_issue_token(user=root)
    assert root.is_staff
    root = resign(client, sso, "root-sso", ["ml-team"])
    assert root is not None and not root.is_staff
    assert client.get("/admin/").status_code == 302  # the admin is closed to her now
    assert APIClient(HTTP_AUTHORIZATION=f"Token {token}").get("/api/v1/jobs/").status_code == 401
    entries = AuditEntry.objects.filter(action="user.staff").order_by("pk")
    assert [e.after["is_staff"] for e in entries] == [True, False]
    assert {e.via for e in entries} == {f"single sign-on ({sso.issuer})"}


def test_staff_given_in_the_admin_is_never_taken_by_a_sign_in(
    sso: Provider, client: Client, db: None
) -> None:
    sso.add_user("ops", "pw", groups=[])
    sign_in(client, sso, "ops")
    ops = signed_in_as(client)
    ops.is_staff = True  # an admin's doing
    ops.save()
    assert resign(client, sso, "ops", []).is_staff
    # Made staff by the groups after the admin took it away: the groups' again.
    ops.is_staff = False
    ops.save()
    assert resign(client, sso, "ops", ["admins"]).is_staff
    assert not resign(client, sso, "ops", []).is_staff


def test_a_provider_name_never_takes_over_a_local_account(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    acme = make_tenant("acme")  # its owner is the local user acme-owner
    sso.add_user("acme-owner", "pw", groups=[])
    sso.add_user("../<b>x</b> y", "pw", groups=[])

    sign_in(client, sso, "acme-owner")
    twin = signed_in_as(client)
    assert twin.username == "acme-owner-2"
    assert not Membership.objects.filter(user=twin, tenant=acme).exists()
    client.logout()
    sign_in(client, sso, "../<b>x</b> y")
    assert signed_in_as(client).username == "b-x-b-y"


def test_next_is_followed_on_this_site_only(
    sso: Provider, client: Client, make_tenant: Callable[..., Tenant]
) -> None:
    make_tenant("acme")
    sso.add_user("carol", "pw", groups=["ml-team"])
    assert sign_in(client, sso, "carol", next_url="/usage/")["Location"] == "/usage/"
    client.logout()
    assert sign_in(client, sso, "carol", next_url="https://evil.example/")["Location"] == "/"


def _refused(answer: Any, client: Client, says: str) -> None:
    assert answer.status_code == 400
    assert says in answer.content.decode()
    assert signed_in_as(client) is None
    assert not OidcIdentity.objects.exists()


def test_a_state_this_session_did_not_start_is_refused(
    sso: Provider, client: Client, db: None
) -> None:
    sso.add_user("mallory", "pw", groups=["admins"])
    url = authorize(client, sso, "mallory")
    forged = url.replace("state=", "state=x")
    _refused(callback(client, forged), client, "Single sign-on failed")
    # The code, sent to another browser (no sign-in started there): refused as well.
    _refused(callback(Client(), url), Client(), "Single sign-on failed")


@pytest.mark.parametrize(
    ("overrides", "claim"),
    [
        ({"nonce": "forged-nonce"}, "nonce"),
        ({"aud": "another-client"}, "aud"),
        ({"iss": "http://127.0.0.1:1"}, "iss"),
        ({"exp": 1_000_000_000, "iat": 999_999_000}, "exp"),
    ],
)
def test_an_id_token_with_a_wrong_claim_is_refused(
    sso: Provider, client: Client, db: None, overrides: dict[str, Any], claim: str
) -> None:
    sso.add_user("mallory", "pw", groups=["admins"])
    sso.id_token_overrides = overrides
    _refused(sign_in(client, sso, "mallory"), client, "ID token is not valid")


def test_an_id_token_signed_by_another_key_is_refused(
    sso: Provider, client: Client, db: None
) -> None:
    sso.add_user("mallory", "pw", groups=["admins"])
    sso.sign_with = RSAKey.generate_key(2048, parameters={"kid": "test-key-1"})
    _refused(sign_in(client, sso, "mallory"), client, "ID token is not valid")


def test_a_discovery_document_naming_another_issuer_is_refused(
    provider: Provider, settings: Any, client: Client, db: None
) -> None:
    settings.OIDC = oidc_config(
        issuer=provider.issuer.replace("127.0.0.1", "localhost"),
        client_id=provider.client_id,
        client_secret=provider.client_secret,
        discovery_url=provider.issuer + "/.well-known/openid-configuration",
    )
    answer = client.get("/oidc/login/")
    assert answer.status_code == 400
    assert "names another issuer" in answer.content.decode()


def test_an_unreachable_provider_is_a_clear_refusal(
    settings: Any, client: Client, db: None
) -> None:
    settings.OIDC = oidc_config(issuer="http://127.0.0.1:9", client_id="portal")
    answer = client.get("/oidc/login/")
    assert answer.status_code == 400
    assert "cannot be reached" in answer.content.decode()


def test_off_means_no_button_and_no_routes(settings: Any, client: Client, db: None) -> None:
    settings.OIDC = None
    page = client.get("/login/").content.decode()
    assert "Sign in with SSO" not in page and "/oidc/" not in page
    assert client.get("/oidc/login/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


def test_on_the_login_page_offers_the_button(sso: Provider, client: Client, db: None) -> None:
    page = client.get("/login/?next=/usage/").content.decode()
    assert 'href="/oidc/login/?next=/usage/"' in page
    assert "Sign in with SSO" in page


def test_a_disabled_user_is_refused_and_gets_no_new_role(
    sso: Provider, make_tenant: Callable[..., Tenant], client: Client
) -> None:
    acme = make_tenant("acme")
    sso.add_user("carol", "pw", groups=["auditors"])
    sign_in(client, sso, "carol")
    carol = signed_in_as(client)
    carol.is_active = False
    carol.save()
    client.logout()
    sso.add_user("carol", "pw", groups=["ml-leads"])

    answer = sign_in(client, sso, "carol")

    assert answer.status_code == 400 and "this account is disabled" in answer.content.decode()
    assert signed_in_as(client) is None
    assert Membership.objects.get(user=carol, tenant=acme).role == Role.VIEWER
