"""Test sends are limited per user: beyond the allowance a clear 429 with Retry-After."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from notifications.models import Delivery, Subscription
from notifications.services import allowance_key, allowance_window

pytestmark = pytest.mark.django_db


@pytest.fixture
def allowance(settings: Any, alice: Any) -> Iterator[int]:
    """Two test sends per hour for alice, her count for this hour starting from zero."""
    settings.NOTIFICATION_TESTS_PER_WINDOW = 2
    settings.NOTIFICATION_TEST_WINDOW_S = 3600
    keys = [allowance_key(alice.pk, allowance_window(timezone.now())[1] + d) for d in (0, 3600)]
    cache.delete_many(keys)
    yield 2
    cache.delete_many(keys)


def test_the_api_answers_429_with_retry_after_past_the_allowance(
    alice: Any,
    token_client: Callable[[Any], Any],
    subscribe: Callable[..., Subscription],
    allowance: int,
) -> None:
    sub = subscribe(alice, events=["completed"], channel="email", email="a@example.com")
    client = token_client(alice)
    url = f"/api/v1/subscriptions/{sub.pk}/test/"
    assert [client.post(url).status_code for _ in range(allowance)] == [202] * allowance
    refused = client.post(url)
    assert refused.status_code == 429, refused.content
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert "Too many test sends" in refused.json()["detail"]
    assert Delivery.objects.filter(subscription=sub).count() == allowance  # nothing queued


def test_the_page_answers_429_with_retry_after_past_the_allowance(
    alice: Any, subscribe: Callable[..., Subscription], allowance: int
) -> None:
    sub = subscribe(alice, events=["completed"], channel="email", email="a@example.com")
    client = Client()
    client.force_login(alice)
    url = f"/account/notifications/{sub.pk}/test/"
    assert [client.post(url).status_code for _ in range(allowance)] == [302] * allowance
    refused = client.post(url)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert "Too many test sends" in refused.content.decode()
    assert Delivery.objects.filter(subscription=sub).count() == allowance
