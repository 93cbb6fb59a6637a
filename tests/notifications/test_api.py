"""``/api/v1/subscriptions/``: your own only, bad input refused with nothing created, test events."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from notifications.models import Delivery, Subscription
from notifications.services import do_attempt_delivery
from notifications.signing import verify
from tests.notifications.receiver import Receiver

pytestmark = pytest.mark.django_db

URL = "/api/v1/subscriptions/"


def test_create_list_retrieve_and_delete(
    alice: Any, acme: Any, token_client: Callable[[Any], Any], receiver: Receiver
) -> None:
    client = token_client(alice)
    answer = client.post(
        URL,
        {
            "tenant": "acme",
            "events": ["failed", "completed"],
            "channel": "webhook",
            "url": receiver.url,
        },
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    assert created["tenant"] == "acme" and created["events"] == ["completed", "failed"]
    assert len(created["secret"]) == 64
    listed = client.get(URL).json()["results"]
    assert [s["id"] for s in listed] == [created["id"]]
    assert "secret" not in listed[0]  # only the owner's detail view carries it
    assert client.get(f"{URL}{created['id']}/").json()["secret"] == created["secret"]
    assert client.delete(f"{URL}{created['id']}/").status_code == 204
    assert not Subscription.objects.exists()
    # One audit row each, with the fields before/after and never the secret.
    made, gone = AuditEntry.objects.filter(action__startswith="subscription.").order_by("id")
    assert (made.action, made.actor_name, made.tenant_slug) == (
        "subscription.create",
        "alice",
        "acme",
    )
    assert made.after["url"] == receiver.url and made.after["events"] == ["completed", "failed"]
    assert (gone.action, gone.before["channel"], gone.after) == (
        "subscription.delete",
        "webhook",
        {},
    )
    assert created["secret"] not in json.dumps([made.after, gone.before])


def test_an_email_subscription_defaults_to_the_users_address(
    alice: Any, token_client: Callable[[Any], Any]
) -> None:
    alice.email = "alice@example.com"
    alice.save()
    answer = token_client(alice).post(
        URL, {"events": ["completed"], "channel": "email"}, format="json"
    )
    assert answer.status_code == 201, answer.json()
    assert answer.json()["email"] == "alice@example.com"
    assert answer.json()["tenant"] is None and answer.json()["secret"] == ""


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"url": "ftp://example.com/x"}, "url", "Only http:// and https://"),
        ({"url": "javascript:alert(1)"}, "url", "Only http:// and https://"),
        ({"url": "file:///etc/passwd"}, "url", "Only http:// and https://"),
        ({"url": "http://"}, "url", "not a valid http(s) URL"),
        ({"url": "http://exa mple.com/"}, "url", "not a valid http(s) URL"),
        ({"url": "https://example.com/" + "a" * 2000}, "url", "2000"),
        ({"url": ""}, "url", "needs a URL"),
        ({"events": ["completed", "exploded"]}, "events", "Unknown event 'exploded'"),
        ({"events": []}, "events", "at least one"),
        ({"events": "completed"}, "events", ""),
        ({"tenant": "globex"}, "tenant", "No tenant 'globex' among yours"),
        ({"tenant": "nope"}, "tenant", "No tenant 'nope' among yours"),
        ({"events": ["queued_long"]}, "queued_minutes", "queued_long needs queued_minutes"),
        ({"queued_minutes": 5}, "queued_minutes", "applies to queued_long only"),
        ({"queued_minutes": 0, "events": ["queued_long"]}, "queued_minutes", ""),
        ({"channel": "pigeon"}, "channel", ""),
        ({"channel": "email", "email": "not-an-address"}, "email", "not a valid email"),
        ({"channel": "email", "email": ""}, "email", "needs an address"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_creates_nothing(
    alice: Any,
    globex: Any,
    token_client: Callable[[Any], Any],
    body: dict[str, Any],
    field: str,
    words: str,
) -> None:
    request = {"events": ["completed"], "channel": "webhook", "url": "https://ci.example.com/h"}
    request.update(body)
    answer = token_client(alice).post(URL, request, format="json")
    assert answer.status_code == 400, answer.json()
    assert field in answer.json()["errors"], answer.json()
    assert words in answer.json()["message"]
    assert not Subscription.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="subscription.").exists()


def test_another_tenants_user_cannot_see_test_or_delete_it(
    alice: Any,
    bob: Any,
    token_client: Callable[[Any], Any],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
) -> None:
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    intruder = token_client(bob)
    assert intruder.get(URL).json()["results"] == []
    assert intruder.get(f"{URL}{sub.pk}/").status_code == 404
    assert intruder.post(f"{URL}{sub.pk}/test/").status_code == 404
    assert intruder.get(f"{URL}{sub.pk}/deliveries/").status_code == 404
    assert intruder.delete(f"{URL}{sub.pk}/").status_code == 404
    assert Subscription.objects.filter(pk=sub.pk).exists()
    assert not Delivery.objects.exists()
    assert not AuditEntry.objects.filter(action="subscription.delete").exists()


def test_an_admin_sees_only_their_own_but_may_subscribe_to_any_tenant(
    alice: Any,
    globex: Any,
    make_user: Callable[..., Any],
    token_client: Callable[[Any], Any],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
) -> None:
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    admin = token_client(make_user("root", staff=True))
    assert admin.get(f"{URL}{sub.pk}/").status_code == 404
    answer = admin.post(
        URL,
        {"tenant": "globex", "events": ["failed"], "channel": "webhook", "url": receiver.url},
        format="json",
    )
    assert answer.status_code == 201, answer.json()


def test_the_test_button_sends_a_signed_test_event(
    alice: Any,
    token_client: Callable[[Any], Any],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    client = token_client(alice)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        answer = client.post(f"{URL}{sub.pk}/test/")
    assert answer.status_code == 202
    assert len(callbacks) == 1  # its deliver task, enqueued after commit
    assert receiver.requests == []  # the request itself sent nothing
    delivery = Delivery.objects.get(pk=answer.json()["id"])
    assert do_attempt_delivery(delivery_id=delivery.pk, now=timezone.now())
    [request] = receiver.requests
    headers = request.headers
    assert verify(
        sub.secret, headers["X-Portal-Timestamp"], request.body, headers["X-Portal-Signature"]
    )
    assert json.loads(request.body)["type"] == "job.test"
    [row] = AuditEntry.objects.filter(action="subscription.test")
    assert (row.actor_name, row.object_id) == ("alice", str(sub.pk))
    assert row.after["event_id"] == delivery.event_id
    log = client.get(f"{URL}{sub.pk}/deliveries/").json()["results"]
    assert [(d["event_type"], d["state"]) for d in log] == [("test", "delivered")]


def test_a_read_only_token_cannot_subscribe(alice: Any, token_client: Callable[[Any], Any]) -> None:
    from rest_framework.test import APIClient

    from tenancy.token_services import do_create_token

    issued = do_create_token(user=alice, name="ro", scope="read", expires_in_days=1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issued.secret}")
    answer = client.post(
        URL,
        {"events": ["completed"], "channel": "webhook", "url": "https://x.example/"},
        format="json",
    )
    assert answer.status_code == 403
    assert not Subscription.objects.exists()
