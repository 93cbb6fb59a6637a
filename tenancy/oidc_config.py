"""The single sign-on settings, checked once at start-up (pure; no Django).

``portal/settings/base.py`` reads the ``OIDC_*`` variables and calls
``oidc_config``; a mistake raises ``ValueError`` there, so the portal does not
start half-configured.  Unset ``OIDC_ISSUER`` and ``OIDC_CLIENT_ID``: SSO is off
(``None``), and the login page is the password form alone.  docs/sso.md lists the
variables.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from tenancy.oidc_roles import RoleRule, parse_role_map

DISCOVERY_PATH = "/.well-known/openid-configuration"
_LOOPBACK_NAMES = frozenset({"localhost"})


@dataclass(frozen=True)
class OidcConfig:
    """One OpenID Connect provider the portal trusts for sign-in."""

    issuer: str  # the ``iss`` of its ID tokens, exactly
    client_id: str
    client_secret: str
    scopes: str  # space-separated; always includes ``openid``
    discovery_url: str  # "" when the endpoints below are given explicitly
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    username_claim: str
    groups_claim: str
    role_map: tuple[RoleRule, ...]
    redirect_uri: str  # "" = this portal's /oidc/callback/ as the browser reached it


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_provider_url(name: str, url: str) -> str:
    """Return ``url`` if it is https, or http to a loopback host (tests, a laptop).

    A provider reached over plain http elsewhere would hand out its tokens, and our
    code, to whoever sits on the path.
    """
    parts = urlsplit(url)
    if not parts.hostname or parts.scheme not in {"https", "http"}:
        raise ValueError(f"{name} must be an https:// URL, not {url!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(
            f"{name} must use https:// (plain http only to a loopback host), not {url!r}"
        )
    return url


def oidc_config(
    *,
    issuer: str,
    client_id: str,
    client_secret: str = "",
    scopes: str = "openid profile email groups",
    discovery_url: str = "",
    authorization_endpoint: str = "",
    token_endpoint: str = "",
    userinfo_endpoint: str = "",
    jwks_uri: str = "",
    username_claim: str = "preferred_username",
    groups_claim: str = "groups",
    role_map: str = "",
    redirect_uri: str = "",
) -> OidcConfig | None:
    """The provider the ``OIDC_*`` variables describe, None when SSO is off.

    Raises ``ValueError`` with the variable's name on anything inconsistent.
    """
    explicit = {
        "OIDC_AUTHORIZATION_ENDPOINT": authorization_endpoint,
        "OIDC_TOKEN_ENDPOINT": token_endpoint,
        "OIDC_JWKS_URI": jwks_uri,
    }
    if not issuer and not client_id:
        stray = [n for n, v in explicit.items() if v]
        stray += ["OIDC_ROLE_MAP"] * bool(role_map) + ["OIDC_DISCOVERY_URL"] * bool(discovery_url)
        if stray:
            raise ValueError(f"{', '.join(stray)} set but OIDC_ISSUER and OIDC_CLIENT_ID are not")
        return None
    if not issuer or not client_id:
        raise ValueError("single sign-on needs both OIDC_ISSUER and OIDC_CLIENT_ID")
    check_provider_url("OIDC_ISSUER", issuer)
    scope_list = scopes.split()
    if "openid" not in scope_list:
        raise ValueError(f"OIDC_SCOPES must include 'openid', not {scopes!r}")
    if any(explicit.values()):
        missing = [name for name, value in explicit.items() if not value]
        if missing:
            raise ValueError(f"explicit OIDC endpoints need {', '.join(missing)} as well")
        if discovery_url:
            raise ValueError("give OIDC_DISCOVERY_URL or the explicit endpoints, not both")
    else:
        discovery_url = discovery_url or issuer.rstrip("/") + DISCOVERY_PATH
    for name, url in [
        ("OIDC_DISCOVERY_URL", discovery_url),
        *explicit.items(),
        ("OIDC_USERINFO_ENDPOINT", userinfo_endpoint),
    ]:
        if url:
            check_provider_url(name, url)
    if redirect_uri and urlsplit(redirect_uri).scheme not in {"https", "http"}:
        raise ValueError(f"OIDC_REDIRECT_URI must be an absolute URL, not {redirect_uri!r}")
    if not username_claim or not groups_claim:
        raise ValueError("OIDC_USERNAME_CLAIM and OIDC_GROUPS_CLAIM must not be empty")
    return OidcConfig(
        issuer=issuer,
        client_id=client_id,
        client_secret=client_secret,
        scopes=" ".join(scope_list),
        discovery_url=discovery_url,
        authorization_endpoint=authorization_endpoint,
        token_endpoint=token_endpoint,
        userinfo_endpoint=userinfo_endpoint,
        jwks_uri=jwks_uri,
        username_claim=username_claim,
        groups_claim=groups_claim,
        role_map=parse_role_map(role_map),
        redirect_uri=redirect_uri,
    )
