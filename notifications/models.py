"""Subscriptions to jobs' events, and the log of every delivery and attempt.

A :class:`Subscription` belongs to one user. Its scope is one tenant the user
belongs to (every job of that tenant) or, with no tenant, the jobs the user
submitted. Each event that matches makes one :class:`Delivery`; each try to
hand it over (an HTTP POST, an SMTP conversation) is one :class:`DeliveryAttempt`.
Writes go through ``notifications.services`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models

from notifications.choices import Channel, DeliveryState
from tenancy.models import Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

URL_MAX_LENGTH = 2000
SECRET_LENGTH = 64  # hex characters: 32 random bytes


class SubscriptionQuerySet(models.QuerySet["Subscription"]):
    """Queries over subscriptions."""

    def restrict(self, user: AbstractBaseUser | AnonymousUser) -> SubscriptionQuerySet:
        """The subscriptions ``user`` may see, test and delete: their own only (admins too)."""
        if not user.is_authenticated:
            return self.none()
        return self.filter(owner_id=user.pk)


class Subscription(models.Model):
    """One user's wish to hear about some events of some jobs, on one channel."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="subscriptions"
    )
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="subscriptions",
        help_text="Every job of this tenant; empty: only the jobs the owner submitted.",
    )
    events = models.JSONField(default=list, help_text="EventType values.")
    queued_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="For queued_long: minutes queued before it fires."
    )
    channel = models.CharField(max_length=10, choices=Channel.choices)
    url = models.URLField(max_length=URL_MAX_LENGTH, blank=True, default="")
    secret = models.CharField(
        max_length=SECRET_LENGTH, blank=True, default="", help_text="HMAC key of a webhook."
    )
    email = models.EmailField(blank=True, default="")
    created_at = models.DateTimeField()

    objects = SubscriptionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        target = self.url if self.channel == Channel.WEBHOOK else self.email
        return f"{self.channel} {target} of {self.owner_id}"

    @property
    def target(self) -> str:
        """Where deliveries go: the webhook's URL or the email address."""
        return self.url if self.channel == Channel.WEBHOOK else self.email

    @property
    def scope(self) -> str:
        """The scope in words: a tenant's slug, or "my jobs"."""
        return self.tenant.slug if self.tenant_id and self.tenant else "my jobs"


class Delivery(models.Model):
    """One event to hand to one subscription, with its payload as sent (and re-sent)."""

    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.CharField(
        max_length=64, help_text="The event's id in the payload; unique per subscription."
    )
    event_type = models.CharField(max_length=20)
    job = models.ForeignKey(
        "jobs.Job",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The job the event is about (none for a test event).",
    )
    payload = models.JSONField()
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="When a pending delivery is tried (again)."
    )
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "event_id"], name="one_delivery_per_event"
            )
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id} to subscription {self.subscription_id}"


class DeliveryAttempt(models.Model):
    """One try to hand a delivery over: the HTTP status (or the error) and how long it took."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    duration_ms = models.FloatField()
    ok = models.BooleanField(default=False)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        outcome = self.status_code if self.status_code is not None else self.error
        return f"attempt of delivery {self.delivery_id} at {self.at:%H:%M:%S}: {outcome}"
