"""The new-token form of the API token page; its rules are the service's (``do_create_token``)."""

from __future__ import annotations

from django import forms
from django.conf import settings

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
