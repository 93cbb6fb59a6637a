"""``{% sso_enabled as on %}``: whether the login page offers single sign-on."""

from __future__ import annotations

from django import template

from tenancy.oidc import current_config

register = template.Library()


@register.simple_tag
def sso_enabled() -> bool:
    """True when ``OIDC_ISSUER`` and ``OIDC_CLIENT_ID`` configure a provider."""
    return current_config() is not None
