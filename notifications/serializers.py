"""Serializers of ``/api/v1/subscriptions/``: subscriptions, deliveries and their attempts."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from notifications.choices import Channel
from notifications.models import URL_MAX_LENGTH, Delivery, DeliveryAttempt, Subscription
from notifications.services import MAX_QUEUED_MINUTES
from tenancy.models import Tenant


class SubscriptionSerializer(serializers.ModelSerializer[Subscription]):
    """A subscription in a list: never its secret (``tenant`` null: your own jobs only)."""

    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    events = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Subscription
        fields = [
            "id",
            "tenant",
            "events",
            "queued_minutes",
            "channel",
            "url",
            "email",
            "created_at",
        ]
        read_only_fields = fields


class SubscriptionDetailSerializer(SubscriptionSerializer):
    """One subscription as its owner sees it, with the webhook's signing secret."""

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class SubscriptionCreateSerializer(serializers.Serializer[Any]):
    """A new subscription. ``notifications.services.check_subscription`` judges the values."""

    tenant = serializers.CharField(
        max_length=50,
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="Slug of a tenant you belong to: all its jobs. Empty or null: your own jobs.",
    )
    events = serializers.ListField(
        child=serializers.CharField(max_length=40),
        max_length=20,
        help_text="completed, failed, retried, preempted, runtime_limit, queued_long.",
    )
    queued_minutes = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_QUEUED_MINUTES
    )
    channel = serializers.ChoiceField(choices=Channel.choices)
    url = serializers.CharField(
        max_length=URL_MAX_LENGTH, required=False, allow_blank=True, help_text="Webhook URL."
    )
    email = serializers.CharField(
        max_length=254, required=False, allow_blank=True, help_text="Default: your address."
    )


class DeliveryAttemptSerializer(serializers.ModelSerializer[DeliveryAttempt]):
    """One try to hand a delivery over."""

    class Meta:
        model = DeliveryAttempt
        fields = ["at", "ok", "status_code", "error", "duration_ms"]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer[Delivery]):
    """One event handed (or being handed) to the subscription, with every attempt."""

    job = serializers.IntegerField(source="job_id", read_only=True, allow_null=True)
    attempt_log = DeliveryAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "event_id",
            "event_type",
            "job",
            "state",
            "attempts",
            "next_attempt_at",
            "created_at",
            "finished_at",
            "attempt_log",
        ]
        read_only_fields = fields
