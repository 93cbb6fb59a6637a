"""The two single sign-on pages: ``/oidc/login/`` (off to the provider) and its callback.

Both are 404s while single sign-on is off (``OIDC_ISSUER`` unset).  A refused
sign-in shows the login page again with the reason, status 400, and signs no one in.
"""

from __future__ import annotations

from django.contrib.auth import REDIRECT_FIELD_NAME, login
from django.contrib.auth.forms import AuthenticationForm
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET

from audit.context import acting_as, system_actor
from tenancy.oidc import SsoError, current_config, do_sso_sign_in, finish_sign_in, start_sign_in
from tenancy.oidc_config import OidcConfig

NEXT_KEY = "oidc_next"  # where to go after the callback, kept in the session
BACKEND = "tenancy.login_limits.RateLimitedModelBackend"  # the session's backend (get_user)


def _config() -> OidcConfig:
    config = current_config()
    if config is None:
        raise Http404("single sign-on is off")
    return config


def _safe_next(request: HttpRequest, target: str | None) -> str:
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return reverse("dashboard")


def _refused(request: HttpRequest, reason: str) -> HttpResponse:
    context = {
        "form": AuthenticationForm(request),
        "sso_error": f"Single sign-on failed: {reason}.",
    }
    return render(request, "login.html", context, status=400)


@require_GET
def sso_login(request: HttpRequest) -> HttpResponse:
    """Send the browser to the provider's sign-in page (state, nonce, PKCE in the session)."""
    config = _config()
    request.session[NEXT_KEY] = _safe_next(request, request.GET.get(REDIRECT_FIELD_NAME))
    redirect_uri = config.redirect_uri or request.build_absolute_uri(reverse("oidc-callback"))
    try:
        return start_sign_in(request, config, redirect_uri)
    except SsoError as error:
        return _refused(request, str(error))


@require_GET
def sso_callback(request: HttpRequest) -> HttpResponse:
    """Check what the provider sent back, sign the user in, grant the mapped roles."""
    config = _config()
    try:
        claims = finish_sign_in(request, config)
        # No one is signed in yet: the grants are the portal's, on the provider's word.
        with acting_as(system_actor(f"single sign-on ({config.issuer})")):
            signed_in = do_sso_sign_in(config=config, claims=claims)
    except SsoError as error:
        return _refused(request, str(error))
    target = _safe_next(request, request.session.pop(NEXT_KEY, None))
    login(request, signed_in.user, backend=BACKEND)  # a new session key: no fixation
    return redirect(target)


urlpatterns = [
    path("login/", sso_login, name="oidc-login"),
    path("callback/", sso_callback, name="oidc-callback"),
]
