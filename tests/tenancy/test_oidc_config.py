"""The OIDC_* settings: off when unset, refused at start-up when inconsistent or unsafe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tenancy.oidc_config import oidc_config

ROOT = Path(__file__).resolve().parents[2]


def test_unset_is_off() -> None:
    assert oidc_config(issuer="", client_id="") is None


def test_the_discovery_url_defaults_to_the_issuers_well_known_document() -> None:
    config = oidc_config(issuer="https://id.example.org/realms/ml/", client_id="portal")
    assert config is not None
    assert (
        config.discovery_url == "https://id.example.org/realms/ml/.well-known/openid-configuration"
    )
    assert config.scopes == "openid profile email groups"
    assert config.role_map == ()


def test_explicit_endpoints_replace_discovery() -> None:
    config = oidc_config(
        issuer="https://id.example.org",
        client_id="portal",
        authorization_endpoint="https://id.example.org/auth",
        token_endpoint="https://id.example.org/token",
        jwks_uri="https://id.example.org/keys",
    )
    assert config is not None
    assert config.discovery_url == ""


@pytest.mark.parametrize(
    "issuer", ["http://127.0.0.1:8000", "http://localhost:9000/", "http://[::1]:8000"]
)
def test_plain_http_is_allowed_to_a_loopback_provider(issuer: str) -> None:
    assert oidc_config(issuer=issuer, client_id="portal") is not None


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"issuer": "http://id.example.org"}, "OIDC_ISSUER must use https://"),
        ({"issuer": "http://10.0.0.5"}, "OIDC_ISSUER must use https://"),
        ({"issuer": "ftp://id.example.org"}, "OIDC_ISSUER must be an https:// URL"),
        ({"issuer": "id.example.org"}, "OIDC_ISSUER must be an https:// URL"),
        ({"client_id": ""}, "needs both OIDC_ISSUER and OIDC_CLIENT_ID"),
        ({"issuer": ""}, "needs both OIDC_ISSUER and OIDC_CLIENT_ID"),
        ({"scopes": "profile email"}, "OIDC_SCOPES must include 'openid'"),
        ({"token_endpoint": "https://id.example.org/t"}, "need OIDC_AUTHORIZATION_ENDPOINT"),
        ({"discovery_url": "http://id.example.org/d"}, "OIDC_DISCOVERY_URL must use https://"),
        ({"userinfo_endpoint": "http://id.example.org/u"}, "OIDC_USERINFO_ENDPOINT must use"),
        ({"role_map": "ml:acme:boss"}, "unknown role 'boss'"),
        ({"username_claim": ""}, "must not be empty"),
        ({"redirect_uri": "/oidc/callback/"}, "OIDC_REDIRECT_URI must be an absolute URL"),
    ],
)
def test_inconsistent_or_unsafe_settings_are_refused(kwargs: dict[str, Any], says: str) -> None:
    given = {"issuer": "https://id.example.org", "client_id": "portal", **kwargs}
    with pytest.raises(ValueError, match="OIDC") as caught:
        oidc_config(**given)
    assert says in str(caught.value)


def test_a_role_map_without_a_provider_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="OIDC_ROLE_MAP set but OIDC_ISSUER"):
        oidc_config(issuer="", client_id="", role_map="ml:acme:member")


def _start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Load the portal's settings in a fresh process with ``env``, as start-up does."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OIDC_")}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "portal.settings.test", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_malformed_role_map_stops_the_portal_at_start_up_with_a_clear_message() -> None:
    bad = _start(
        {
            "OIDC_ISSUER": "https://id.example.org",
            "OIDC_CLIENT_ID": "portal",
            "OIDC_ROLE_MAP": "ml-team:acme:member,ml-leads:acme",
        }
    )
    assert bad.returncode != 0
    assert (
        "ImproperlyConfigured: single sign-on: OIDC_ROLE_MAP rule 'ml-leads:acme': "
        "expected VALUE:TENANT:ROLE" in bad.stderr
    )
    good = _start(
        {
            "OIDC_ISSUER": "https://id.example.org",
            "OIDC_CLIENT_ID": "portal",
            "OIDC_ROLE_MAP": "ml-team:acme:member",
        }
    )
    assert good.returncode == 0, good.stderr
