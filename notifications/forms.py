"""The account page's new-subscription form (``services.check_subscription`` judges it)."""

from __future__ import annotations

from typing import Any

from django import forms

from notifications.choices import Channel, EventType
from notifications.models import URL_MAX_LENGTH
from notifications.services import MAX_QUEUED_MINUTES
from tenancy.models import Tenant


class SubscriptionForm(forms.Form):
    """Scope, events and channel of a new subscription."""

    tenant = forms.ChoiceField(
        label="Jobs", required=False, help_text="Your own jobs, or every job of a tenant of yours."
    )
    events = forms.MultipleChoiceField(
        choices=EventType.choices, widget=forms.CheckboxSelectMultiple
    )
    queued_minutes = forms.IntegerField(
        label="Queued longer than (minutes)",
        required=False,
        min_value=1,
        max_value=MAX_QUEUED_MINUTES,
        help_text="Only for “Job queued longer than N minutes”.",
    )
    channel = forms.ChoiceField(choices=Channel.choices, initial=Channel.WEBHOOK)
    url = forms.CharField(
        label="Webhook URL",
        required=False,
        max_length=URL_MAX_LENGTH,
        help_text="http:// or https://; it receives a signed JSON POST.",
    )
    email = forms.CharField(
        label="Email address", required=False, max_length=254, help_text="Default: your address."
    )

    def __init__(self, *args: Any, tenants: list[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", "My jobs only")] + [(t.slug, f"Tenant {t.slug}") for t in tenants]
        self.fields["tenant"].choices = choices  # type: ignore[attr-defined]
