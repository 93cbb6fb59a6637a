"""Enumerations of the notifications app: what one can subscribe to, and how one hears of it."""

from __future__ import annotations

from django.db import models


class EventType(models.TextChoices):
    """A job event a subscription can ask for (a webhook's ``type`` is ``job.<value>``)."""

    COMPLETED = "completed", "Job completed"
    FAILED = "failed", "Job failed"
    RETRIED = "retried", "Job requeued after a failure"
    PREEMPTED = "preempted", "Job preempted"
    RUNTIME_LIMIT = "runtime_limit", "Job stopped at its run-time limit"
    QUEUED_LONG = "queued_long", "Job queued longer than N minutes"


TEST_EVENT = "test"
"""The type of a "send test event" delivery: it goes to its one subscription only."""


class Channel(models.TextChoices):
    """How a subscription is told."""

    WEBHOOK = "webhook", "Webhook (signed JSON POST)"
    EMAIL = "email", "Email"


class DeliveryState(models.TextChoices):
    """Where a delivery is: waiting for (another) attempt, delivered, or given up."""

    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Gave up"
