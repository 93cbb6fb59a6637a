"""The account's Notifications pages: create, see the log, test, delete; others' are 404."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from notifications.models import Delivery, Subscription

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_nav_links_to_the_page(alice: Any) -> None:
    html = signed_in(alice).get("/account/token/").content.decode()
    assert 'href="/account/notifications/"' in html


def test_create_test_and_delete_on_the_page(alice: Any, acme: Any) -> None:
    client = signed_in(alice)
    page = client.get("/account/notifications/")
    assert page.status_code == 200 and "My jobs only" in page.content.decode()
    answer = client.post(
        "/account/notifications/",
        {
            "tenant": "acme",
            "events": ["completed", "failed"],
            "channel": "webhook",
            "url": "https://ci.example.com/hook",
        },
    )
    sub = Subscription.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/account/notifications/{sub.pk}/"
    detail = client.get(answer["Location"]).content.decode()
    assert sub.secret in detail and "https://ci.example.com/hook" in detail
    assert client.post(f"/account/notifications/{sub.pk}/test/").status_code == 302
    assert Delivery.objects.get().event_type == "test"
    assert "test_" in client.get(f"/account/notifications/{sub.pk}/").content.decode()
    assert client.post(f"/account/notifications/{sub.pk}/delete/").status_code == 302
    assert not Subscription.objects.exists()


def test_bad_input_on_the_page_shows_the_error_and_creates_nothing(alice: Any, globex: Any) -> None:
    client = signed_in(alice)
    answer = client.post(
        "/account/notifications/",
        {"events": ["completed"], "channel": "webhook", "url": "gopher://x.example/"},
    )
    assert answer.status_code == 400
    assert "Only http:// and https://" in answer.content.decode()
    answer = client.post(
        "/account/notifications/",
        {
            "tenant": "globex",
            "events": ["completed"],
            "channel": "webhook",
            "url": "https://x.example/",
        },
    )
    assert answer.status_code == 400  # not a choice: globex is not among alice's tenants
    assert not Subscription.objects.exists()


def test_another_users_subscription_is_a_404(
    alice: Any, bob: Any, subscribe: Callable[..., Subscription]
) -> None:
    sub = subscribe(alice, events=["completed"], url="https://ci.example.com/hook")
    client = signed_in(bob)
    assert sub.secret not in client.get("/account/notifications/").content.decode()
    assert client.get(f"/account/notifications/{sub.pk}/").status_code == 404
    assert client.post(f"/account/notifications/{sub.pk}/test/").status_code == 404
    assert client.post(f"/account/notifications/{sub.pk}/delete/").status_code == 404
    assert Subscription.objects.filter(pk=sub.pk).exists() and not Delivery.objects.exists()
