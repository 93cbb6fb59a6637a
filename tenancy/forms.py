"""Forms: the login form (rate-limited), the API token page's, and the tenant pages'.

The tenant forms only parse: the services (``tenancy.services``) decide, and
their refusals are added to the form by the view.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.db import models

from tenancy.login_limits import client_address, refusal
from tenancy.models import Role, Tenant, TokenScope
from tenancy.services import IDENTIFIER_MAX
from tenancy.tenant_settings import SETTINGS, UNSET_DEFAULTS, fill_unset
from tenancy.tokens import MAX_NAME_LENGTH


class NewTokenForm(forms.Form):
    """Name, scope and lifetime of a new API token."""

    name = forms.CharField(max_length=MAX_NAME_LENGTH, help_text="Say what uses it: ci, laptop.")
    scope = forms.ChoiceField(
        choices=TokenScope.choices,
        initial=TokenScope.WRITE,
        help_text="A read-only token cannot submit, cancel, scale or upload.",
    )
    expires_in_days = forms.IntegerField(label="Expires in (days)", min_value=1)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # The site's maximum as the form's bound; a tenant's shorter one is the service's.
        self.fields["expires_in_days"] = forms.IntegerField(
            label="Expires in (days)",
            min_value=1,
            max_value=int(settings.API_TOKEN_MAX_DAYS),
            initial=settings.API_TOKEN_DAYS,
            help_text=f"At most {settings.API_TOKEN_MAX_DAYS} days, or less where a tenant "
            "of yours says so.",
        )


RATE_LIMITED = "rate_limited"


class RateLimitedAuthenticationForm(AuthenticationForm):
    """Django's login form, refusing before any password check while the sign-in is locked out.

    The refusal has the error code ``rate_limited``: the view answers it with 429.
    """

    def clean(self) -> dict[str, Any]:
        """Refuse a locked-out account or address; otherwise check the password as usual."""
        username = str(self.data.get("username") or "")
        refused = refusal(username, client_address(self.request))
        if refused is not None:
            raise ValidationError(refused.message, code=RATE_LIMITED)
        cleaned: dict[str, Any] = super().clean()
        return cleaned


def _model_field(name: str) -> forms.Field:
    """The form field Django makes for ``Tenant.<name>`` (label, help text, bounds)."""
    model_field = Tenant._meta.get_field(name)
    field = model_field.formfield() if isinstance(model_field, models.Field) else None
    if field is None:
        raise LookupError(f"Tenant.{name} has no form field")
    return field


class InviteMemberForm(forms.Form):
    """Who to add to a tenant (an existing user) and with which role."""

    identifier = forms.CharField(
        label="Username or email",
        max_length=IDENTIFIER_MAX,
        help_text="An existing account; nobody is created here.",
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    """A member's new role."""

    role = forms.ChoiceField(choices=Role.choices)


class TenantSettingsForm(forms.Form):
    """Every tenant setting an admin may change (``tenancy.tenant_settings.SETTINGS``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in SETTINGS:
            self.fields[name] = _model_field(name)
            self.fields[name].required &= name not in UNSET_DEFAULTS

    def clean(self) -> dict[str, Any]:
        """Blank optional settings (a per-type quota, request defaults) mean none."""
        cleaned: dict[str, Any] = super().clean() or {}
        fill_unset(cleaned)
        return cleaned


CREATE_FIELDS = ("name", "gpu_quota", "priority_weight", "max_queued_jobs")


class TenantCreateForm(forms.Form):
    """A new tenant: its slug, name, owner (an existing user) and first limits."""

    slug = forms.SlugField(
        max_length=50, help_text="Short unique name: lowercase letters, digits, hyphens."
    )
    owner = forms.CharField(
        label="Owner (username or email)",
        max_length=IDENTIFIER_MAX,
        help_text="An existing account; it becomes the tenant's first owner.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in CREATE_FIELDS:
            self.fields[name] = _model_field(name)
        self.fields["name"].required = False
        self.fields["name"].help_text = "Defaults to the slug."
        self.fields["max_queued_jobs"].initial = settings.DEFAULT_TENANT_MAX_QUEUED_JOBS
