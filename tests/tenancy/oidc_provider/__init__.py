"""A small, real OpenID Connect provider that tests start on loopback (see ``server``)."""

from tests.tenancy.oidc_provider.server import Provider, ProviderUser

__all__ = ["Provider", "ProviderUser"]
