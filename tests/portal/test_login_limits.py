"""Login rate limiting per account and per address: a clear message and 429 when limited."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client, override_settings

from tenancy.login_limits import account_key, address_key

pytestmark = pytest.mark.django_db

LIMITS = {
    "LOGIN_FAILURES_PER_ACCOUNT": 3,
    "LOGIN_FAILURES_PER_ADDRESS": 5,
    "LOGIN_FAILURE_WINDOW_SECONDS": 60,
}


def fresh_address() -> str:
    """A client address no earlier run has counted against (the cache outlives a run)."""
    raw = uuid.uuid4().bytes
    return f"10.{raw[0]}.{raw[1]}.{raw[2]}"


@pytest.fixture
def person(make_user: Callable[..., Any]) -> tuple[Any, str]:
    """A user with a fresh name and a strong password; their count starts at zero."""
    name = f"user-{uuid.uuid4().hex[:10]}"
    user = make_user(name)
    user.set_password("correct horse battery")
    user.save()
    cache.delete(account_key(name))
    return user, "correct horse battery"


def attempt(username: str, password: str, address: str, path: str = "/login/") -> Any:
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


@override_settings(**LIMITS)
def test_account_is_locked_after_its_failures_even_with_the_right_password(
    person: tuple[Any, str],
) -> None:
    user, password = person
    name = user.username
    for _ in range(3):  # from three different addresses: the account's count grows
        assert attempt(name, "wrong", fresh_address()).status_code == 200
    locked = attempt(name, password, fresh_address())
    assert locked.status_code == 429
    assert locked["Retry-After"] == "60"
    assert b"Too many failed sign-ins" in locked.content
    assert "_auth_user_id" not in locked.client.session
    # any spelling of the name is the same account
    assert attempt(name.upper(), password, fresh_address()).status_code == 429
    # the window ends: the account may sign in again
    cache.delete(account_key(name))
    assert attempt(name, password, fresh_address()).status_code == 302


@override_settings(**LIMITS)
def test_address_is_locked_after_failures_across_accounts(
    person: tuple[Any, str], make_user: Callable[..., Any]
) -> None:
    user, password = person
    address = fresh_address()
    for n in range(5):  # five accounts tried once each from one address
        assert attempt(f"nobody-{uuid.uuid4().hex[:6]}-{n}", "guess", address).status_code == 200
    assert attempt(user.username, password, address).status_code == 429
    assert attempt(user.username, password, fresh_address()).status_code == 302
    cache.delete(address_key(address))


@override_settings(**LIMITS)
def test_success_clears_the_accounts_count(person: tuple[Any, str]) -> None:
    user, password = person
    address = fresh_address()
    for _ in range(2):
        attempt(user.username, "wrong", address)
    assert attempt(user.username, password, address).status_code == 302
    for _ in range(2):  # two more failures: still under three since the success
        attempt(user.username, "wrong", address)
    assert attempt(user.username, password, address).status_code == 302


@override_settings(**LIMITS)
def test_admin_login_is_limited_too(make_user: Callable[..., Any]) -> None:
    name = f"admin-{uuid.uuid4().hex[:8]}"
    admin = get_user_model().objects.create_user(name, password="admin pass phrase", is_staff=True)
    cache.delete(account_key(name))
    for _ in range(3):
        attempt(name, "wrong", fresh_address(), "/admin/login/")
    refused = attempt(name, "admin pass phrase", fresh_address(), "/admin/login/")
    assert refused.status_code == 200  # the admin form shows its own error ...
    assert "_auth_user_id" not in refused.client.session  # ... and signs no one in
    assert admin.is_staff


@override_settings(**LIMITS)
def test_hostile_usernames_are_counted_not_stored(person: tuple[Any, str]) -> None:
    address = fresh_address()
    for name in ("x" * 10_000, "' OR 1=1 --", "ümlaut\u202e"):
        cache.delete(account_key(name))  # an earlier run's count
        response = attempt(name, "pw", address)
        assert response.status_code == 200
        assert cache.get(account_key(name)) == 1  # an integer under a digest key
    assert attempt("\x00", "pw", address).status_code == 200  # refused by the form itself
    assert cache.get(address_key(address)) == 3
    cache.delete(address_key(address))
