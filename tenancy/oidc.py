"""Single sign-on with OpenID Connect: the provider's client, and what a sign-in changes.

    browser ── GET /oidc/login/ ──> start_sign_in(): state, nonce and a PKCE verifier
       │                             kept in the session (authlib's Django client)
       └──> provider's authorize page ── the user signs in there
    browser <── 302 /oidc/callback/?code=…&state=… ──┘
    finish_sign_in(): the state must be one this session started; code + verifier
       ──> token endpoint; the ID token's signature is checked against the
       provider's JWKS (asymmetric algorithms only) and its iss, aud, exp, iat and
       nonce; userinfo (same ``sub``) adds claims the ID token left out
    do_sso_sign_in(): the user linked to (iss, sub), or a new one; tenant roles and
       staff per OIDC_ROLE_MAP, granted and taken back (tenancy.services)

Each sign-in checks the map again (issue 35: staff given by a group stayed after the
group went). What the groups give is granted, and remembered as single sign-on's
(``OidcGrant``, with the role it replaced); a role single sign-on gave that the groups
no longer give goes back to the role it replaced, or the membership goes, and staff
it gave is taken away. Roles given in the portal are never taken by a sign-in: a role
an owner or admin changed after single sign-on gave it is theirs from then on. A user
whose groups map to nothing signs in with no tenant (or with what the portal gave).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests
from authlib.integrations.base_client import OAuthError
from authlib.integrations.django_client import DjangoIntegration, DjangoOAuth2App
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from joserfc.errors import JoseError

from audit import services as audit
from tenancy.errors import TenancyError
from tenancy.models import OidcGrant, OidcIdentity, Tenant
from tenancy.oidc_config import OidcConfig, check_provider_url
from tenancy.oidc_roles import STAFF, Grants, grants_for, role_rank
from tenancy.services import do_add_member, do_change_role, do_remove_member

log = logging.getLogger(__name__)

#: Signature algorithms an ID token may use: asymmetric ones only, whatever the
#: provider's discovery document offers ("none" and HS256 never).
ID_TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384")
HTTP_TIMEOUT_SECONDS = 10
_UNSAFE = re.compile(r"[^\w.@+-]+", re.ASCII)
_USERNAME_MAX = 150  # Django's User.username


class SsoError(Exception):
    """A sign-in that is refused; the message is safe to show the user."""


@dataclass(frozen=True)
class SignedIn:
    """What one SSO sign-in did: the user, whether it is new, the roles now granted."""

    user: User
    created: bool
    grants: Grants


def current_config() -> OidcConfig | None:
    """The configured provider (``settings.OIDC``), or None when single sign-on is off."""
    config: OidcConfig | None = getattr(settings, "OIDC", None)
    return config


@functools.lru_cache(maxsize=4)
def provider_client(config: OidcConfig) -> DjangoOAuth2App:
    """authlib's client for ``config``; it keeps the discovery document and keys it read."""
    given = {
        "issuer": config.issuer,
        "authorization_endpoint": config.authorization_endpoint,
        "token_endpoint": config.token_endpoint,
        "jwks_uri": config.jwks_uri,
        "userinfo_endpoint": config.userinfo_endpoint,
    }
    metadata = {key: url for key, url in given.items() if url}
    client_kwargs: dict[str, Any] = {
        "scope": config.scopes,
        "code_challenge_method": "S256",  # PKCE
        "default_timeout": HTTP_TIMEOUT_SECONDS,
    }
    if not config.client_secret:
        client_kwargs["token_endpoint_auth_method"] = "none"  # a public client
    return DjangoOAuth2App(
        DjangoIntegration("portal-oidc"),
        name="portal-oidc",
        client_id=config.client_id,
        client_secret=config.client_secret or None,
        server_metadata_url=config.discovery_url or None,
        authorize_url=config.authorization_endpoint or None,
        access_token_url=config.token_endpoint or None,
        client_kwargs=client_kwargs,
        **metadata,
    )


def checked_metadata(config: OidcConfig, client: DjangoOAuth2App) -> dict[str, Any]:
    """The provider's metadata, refused unless it names our issuer and safe endpoints.

    The discovery document is fetched once per process and kept; its signing
    algorithms are narrowed to ``ID_TOKEN_ALGORITHMS``.
    """
    try:
        metadata: dict[str, Any] = client.load_server_metadata()
    except (requests.RequestException, ValueError) as exc:
        raise SsoError("the sign-in provider cannot be reached") from exc
    if metadata.get("issuer") != config.issuer:
        client.server_metadata.pop("_loaded_at", None)  # read it again next time
        raise SsoError("the sign-in provider's discovery document names another issuer")
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        url = metadata.get(key)
        if url is None and key == "userinfo_endpoint":
            continue
        try:
            check_provider_url(key, str(url or ""))
        except ValueError as exc:
            raise SsoError(f"the sign-in provider's {key} is missing or not https") from exc
    offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
    metadata["id_token_signing_alg_values_supported"] = [
        alg for alg in offered if alg in ID_TOKEN_ALGORITHMS
    ] or ["RS256"]
    return metadata


def start_sign_in(request: HttpRequest, config: OidcConfig, redirect_uri: str) -> HttpResponse:
    """Redirect the browser to the provider; state, nonce and PKCE verifier go to the session."""
    client = provider_client(config)
    checked_metadata(config, client)
    response: HttpResponse = client.authorize_redirect(request, redirect_uri)
    return response


def finish_sign_in(request: HttpRequest, config: OidcConfig) -> dict[str, Any]:
    """The verified claims of the user the provider sent back; ``SsoError`` if anything is off.

    The ID token's claims win over userinfo's: they are signed.
    """
    client = provider_client(config)
    checked_metadata(config, client)
    try:
        token = client.authorize_access_token(request)
        id_claims = token.get("userinfo")
        if not id_claims:
            raise SsoError("the sign-in provider returned no ID token")
        claims: dict[str, Any] = dict(id_claims)
        if client.server_metadata.get("userinfo_endpoint"):
            extra = client.userinfo(token=token)
            if extra.get("sub") != claims.get("sub"):
                raise SsoError("the sign-in provider's userinfo is about another user")
            claims = {**dict(extra), **claims}
    except OAuthError as exc:
        log.warning("SSO sign-in refused: %s", exc)
        raise SsoError(f"the sign-in was refused ({exc.error or 'invalid'})") from exc
    except JoseError as exc:
        log.warning("SSO sign-in: bad ID token: %s", exc)
        raise SsoError("the sign-in provider's ID token is not valid") from exc
    except (requests.RequestException, ValueError, KeyError) as exc:
        log.warning("SSO sign-in: provider error: %s", exc)
        raise SsoError("the sign-in provider could not complete the sign-in") from exc
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise SsoError("the ID token names no subject")
    return claims


def claim_values(claims: Mapping[str, Any], name: str) -> list[str]:
    """The string values of claim ``name``: a list of strings, or a single string."""
    value = claims.get(name)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def safe_username(wanted: str) -> str:
    """A free username like ``wanted``: Django's characters only, a suffix if taken."""
    base = _UNSAFE.sub("-", wanted).strip("-.")[: _USERNAME_MAX - 8] or "sso-user"
    users = get_user_model().objects
    name, n = base, 1
    while users.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


@transaction.atomic
def do_sso_sign_in(*, config: OidcConfig, claims: Mapping[str, Any]) -> SignedIn:
    """The user the verified ``claims`` sign in as, with the roles OIDC_ROLE_MAP gives.

    A new subject gets a new user (unusable password; username from
    ``OIDC_USERNAME_CLAIM``, made safe and unique).  Roles the groups give are granted
    or raised, and roles single sign-on gave that they no longer give are taken back
    (``_apply_grants``); a tenant the map names that does not exist is skipped with a
    warning.  An inactive user is refused.
    """
    subject = str(claims["sub"])
    identity = (
        OidcIdentity.objects.select_related("user")
        .filter(issuer=config.issuer, subject=subject)
        .first()
    )
    created = identity is None
    if identity is None:
        wanted = claims.get(config.username_claim)
        user_model = get_user_model()
        user = user_model(
            username=safe_username(wanted if isinstance(wanted, str) else subject),
            email=claims["email"] if isinstance(claims.get("email"), str) else "",
        )
        user.set_unusable_password()
        user.save()
        OidcIdentity.objects.create(user=user, issuer=config.issuer, subject=subject)
        log.info("SSO: new user %s for subject %s", user.get_username(), subject)
    else:
        user = identity.user
    if not user.is_active:
        raise SsoError("this account is disabled")
    grants = grants_for(config.role_map, claim_values(claims, config.groups_claim))
    _apply_grants(user, grants)
    return SignedIn(user=user, created=created, grants=grants)


def _apply_grants(user: User, grants: Grants) -> None:
    """Make ``user``'s roles what the groups give, for the roles single sign-on manages."""
    wanted = dict(grants.tenant_roles)
    named = {t.slug: t for t in Tenant.objects.filter(slug__in=wanted)}
    for slug in sorted(set(wanted) - set(named)):
        log.warning("SSO: OIDC_ROLE_MAP names tenant %r, which does not exist", slug)
    recorded = {
        grant.tenant_id: grant
        for grant in OidcGrant.objects.select_for_update(of=("self",))
        .select_related("tenant")
        .filter(user_id=user.pk)
    }
    staff_grant = recorded.pop(None, None)
    tenants = {tenant.pk: tenant for tenant in named.values()}
    for grant in recorded.values():
        if grant.tenant is not None:
            tenants.setdefault(grant.tenant.pk, grant.tenant)
    held = dict(user.memberships.values_list("tenant_id", "role"))
    for tenant_id, tenant in sorted(tenants.items()):
        _apply_tenant_grant(
            user, tenant, wanted.get(tenant.slug), held.get(tenant_id), recorded.get(tenant_id)
        )
    _apply_staff_grant(user, grants.staff, staff_grant)


def _apply_tenant_grant(
    user: User, tenant: Tenant, want: str | None, have: str | None, grant: OidcGrant | None
) -> None:
    """One tenant: grant or raise what the groups give; take back what only they gave."""
    if grant is not None and have != grant.role:
        # Changed in the portal since single sign-on gave it (or removed): the portal's now.
        grant.delete()
        grant = None
    if grant is None:
        if want is not None and role_rank(want) > role_rank(have or ""):
            do_add_member(tenant=tenant, user=user, role=want)
            OidcGrant.objects.create(user=user, tenant=tenant, role=want, replaced_role=have or "")
        return
    try:
        if want is not None and role_rank(want) > role_rank(grant.replaced_role):
            if want != have:  # the groups give another role than before: follow them
                do_change_role(tenant=tenant, user=user, role=want)
                grant.role = want
                grant.save(update_fields=["role", "granted_at"])
            return
        # The groups give no more than the portal had given: back to that, or out.
        if grant.replaced_role:
            do_change_role(tenant=tenant, user=user, role=grant.replaced_role)
        else:
            do_remove_member(tenant=tenant, user=user)
    except TenancyError as refused:  # the last owner stays until another is made
        log.warning("SSO: %s keeps %s in %s: %s", user, grant.role, tenant.slug, refused)
        return
    grant.delete()


def _apply_staff_grant(user: User, wants_staff: bool, grant: OidcGrant | None) -> None:
    """Staff: made when the groups give it, taken away when they stop, if SSO made it."""
    if grant is not None and not user.is_staff:
        grant.delete()  # taken away in the admin since: nothing of single sign-on's left
        grant = None
    if wants_staff and not user.is_staff:
        _set_staff(user, True)
        OidcGrant.objects.create(user=user, tenant=None, role=STAFF)
    elif not wants_staff and grant is not None:
        _set_staff(user, False)
        grant.delete()


def _set_staff(user: User, staff: bool) -> None:
    user.is_staff = staff
    user.save(update_fields=["is_staff"])
    audit.record(
        "user.staff",
        obj=user,
        before={"username": user.get_username(), "is_staff": not staff},
        after={"username": user.get_username(), "is_staff": staff},
    )
