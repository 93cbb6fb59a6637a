"""Tenant-facing pages: login, the dashboard and the API token page."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from jobs.live.snapshots import tenant_snapshot
from jobs.models import Job
from tenancy.forms import RATE_LIMITED, NewTokenForm, RateLimitedAuthenticationForm
from tenancy.login_limits import Limits
from tenancy.models import ApiToken, Tenant
from tenancy.services import TenancyError
from tenancy.token_services import do_create_token, do_revoke_token


class LoginView(auth_views.LoginView):
    """The login page; a locked-out sign-in (``tenancy.login_limits``) is a 429 with a message."""

    template_name = "login.html"
    form_class = RateLimitedAuthenticationForm

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        """Show the errors; 429 with ``Retry-After`` when the sign-in was rate-limited."""
        response = super().form_invalid(form)
        if form.has_error("__all__", RATE_LIMITED):
            response.status_code = 429
            response["Retry-After"] = str(Limits.from_settings().window_s)
        return response


def _selected_tenant(request: HttpRequest) -> Tenant | None:
    tenants = Tenant.objects.restrict(request.user)
    slug = request.GET.get("tenant")
    if slug:
        return tenants.filter(slug=slug).first()
    return tenants.first()


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The tenant dashboard: its jobs live (state, parallelism, progress, queue), quota, JCT."""
    tenant = _selected_tenant(request)
    snapshot = None
    if tenant is not None:
        snapshot = tenant_snapshot(tenant, Job.objects.restrict(request.user))
    return render(request, "dashboard.html", {"tenant": tenant, "snap": snapshot})


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    """The user's API tokens: list them, make one (its secret shown this once), revoke one."""
    form = NewTokenForm(request.POST or None)
    secret = None
    if request.method == "POST" and form.is_valid():
        try:
            issued = do_create_token(user=request.user, **form.cleaned_data)
        except TenancyError as error:
            form.add_error(None, str(error))
        else:
            secret = issued.secret
            form = NewTokenForm()
    tokens = ApiToken.objects.restrict(request.user)
    context = {"form": form, "secret": secret, "tokens": tokens, "now": timezone.now()}
    return render(request, "token.html", context, status=400 if form.errors else 200)


@login_required
@require_POST
def revoke_api_token(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the user's tokens (another user's is a 404) and go back to the list."""
    token = get_object_or_404(ApiToken.objects.restrict(request.user), pk=token_id)
    do_revoke_token(user=request.user, token_id=token.pk)
    return redirect("api-token")
