"""Forms: the login form (rate-limited) and the API token page's new-token form."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from tenancy.login_limits import client_address, is_locked_out, lockout_message
from tenancy.models import TokenScope
from tenancy.tokens import MAX_EXPIRY_DAYS, MAX_NAME_LENGTH


class NewTokenForm(forms.Form):
    """Name, scope and lifetime of a new API token."""

    name = forms.CharField(max_length=MAX_NAME_LENGTH, help_text="Say what uses it: ci, laptop.")
    scope = forms.ChoiceField(
        choices=TokenScope.choices,
        initial=TokenScope.WRITE,
        help_text="A read-only token cannot submit, cancel, scale or upload.",
    )
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", min_value=1, max_value=MAX_EXPIRY_DAYS
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["expires_in_days"].initial = settings.API_TOKEN_DAYS


RATE_LIMITED = "rate_limited"


class RateLimitedAuthenticationForm(AuthenticationForm):
    """Django's login form, refusing before any password check while the sign-in is locked out.

    The refusal has the error code ``rate_limited``: the view answers it with 429.
    """

    def clean(self) -> dict[str, Any]:
        """Refuse a locked-out account or address; otherwise check the password as usual."""
        username = str(self.data.get("username") or "")
        if is_locked_out(username, client_address(self.request)):
            raise ValidationError(lockout_message(), code=RATE_LIMITED)
        cleaned: dict[str, Any] = super().clean()
        return cleaned
