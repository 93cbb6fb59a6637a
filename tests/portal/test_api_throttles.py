"""API throttles: per user (token or session) and per anonymous address, 429 with Retry-After."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import cache
from django.test import override_settings
from rest_framework.test import APIClient

from tenancy.throttles import AnonAddressThrottle, PerUserThrottle

pytestmark = pytest.mark.django_db

RATES = {"anon": "2/minute", "user": "3/minute"}


def forget(user: Any = None, address: str = "") -> None:
    """Drop an earlier run's counts (the cache outlives a run; pks repeat across test DBs)."""
    if user is not None:
        cache.delete(PerUserThrottle.cache_format % {"scope": "user", "ident": user.pk})
    if address:
        cache.delete(AnonAddressThrottle.cache_format % {"scope": "anon", "ident": address})


@override_settings(API_THROTTLE_RATES=RATES)
def test_user_is_throttled_across_token_and_session_and_others_are_not(
    token_client: Callable[[Any], APIClient], alice: Any, bob: Any
) -> None:
    forget(alice)
    forget(bob)
    by_token = token_client(alice)
    by_session = APIClient()
    by_session.force_login(alice)
    assert [c.get("/api/v1/jobs/").status_code for c in (by_token, by_session, by_token)] == [
        200,
        200,
        200,
    ]
    refused = by_session.get("/api/v1/jobs/")
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 0
    assert "throttled" in refused.json()["message"].lower()
    assert token_client(bob).get("/api/v1/jobs/").status_code == 200


@override_settings(API_THROTTLE_RATES=RATES)
def test_anonymous_clients_are_throttled_per_address() -> None:
    raw = uuid.uuid4().bytes
    address, other = f"10.1.{raw[0]}.{raw[1]}", f"10.2.{raw[0]}.{raw[1]}"
    forget(address=address)
    forget(address=other)
    client = APIClient(REMOTE_ADDR=address)
    assert [client.get("/api/schema/").status_code for _ in range(2)] == [200, 200]
    assert client.get("/api/schema/").status_code == 429
    assert APIClient(REMOTE_ADDR=other).get("/api/schema/").status_code == 200


def test_rates_are_read_when_a_request_comes() -> None:
    with override_settings(API_THROTTLE_RATES={"anon": "7/hour", "user": "9/second"}):
        assert AnonAddressThrottle().get_rate() == "7/hour"
        assert (PerUserThrottle().num_requests, PerUserThrottle().duration) == (9, 1)
