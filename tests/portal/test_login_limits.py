"""Login rate limiting: an address is slowed, then stopped; nobody can lock out an account.

Issue 35: five failed sign-ins from anywhere locked an account for everyone, its owner
included. Failures now count per address and per (account, address) pair.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client, override_settings

from tenancy import login_limits
from tenancy.login_limits import Limits, account_key, address_bucket, address_key, refusal

pytestmark = pytest.mark.django_db

LIMITS = {
    "LOGIN_FAILURES_PER_ACCOUNT": 3,
    "LOGIN_FAILURES_PER_ADDRESS": 5,
    "LOGIN_FAILURE_WINDOW_SECONDS": 60,
    "LOGIN_BACKOFF_AFTER_FAILURES": 100,  # the backoff has tests of its own
    "LOGIN_BACKOFF_MAX_SECONDS": 8,
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
    return user, "correct horse battery"


def attempt(username: str, password: str, address: str, path: str = "/login/") -> Any:
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


@override_settings(**LIMITS)
def test_failures_from_elsewhere_never_lock_the_owner_out(person: tuple[Any, str]) -> None:
    """The finding: anyone's five wrong passwords locked the account for its owner too."""
    user, password = person
    for _ in range(3):  # from many addresses, as many failures as each may have
        stranger = fresh_address()
        for _ in range(3):
            assert attempt(user.username, "wrong", stranger).status_code in (200, 429)
    signed_in = attempt(user.username, password, fresh_address())  # the owner, at home
    assert signed_in.status_code == 302
    assert signed_in.client.session["_auth_user_id"] == str(user.pk)


@override_settings(**LIMITS)
def test_an_account_is_limited_from_the_address_that_failed(person: tuple[Any, str]) -> None:
    user, password = person
    name, address = user.username, fresh_address()
    for _ in range(3):
        assert attempt(name, "wrong", address).status_code == 200
    locked = attempt(name, password, address)
    assert locked.status_code == 429
    assert locked["Retry-After"] == "60"
    assert b"Too many failed sign-ins for this account from this address" in locked.content
    assert "_auth_user_id" not in locked.client.session
    assert attempt(name.upper(), password, address).status_code == 429  # any spelling
    assert attempt(name, password, fresh_address()).status_code == 302  # elsewhere: fine
    # the window ends: that address may sign in again
    cache.delete(account_key(name, address))
    assert attempt(name, password, address).status_code == 302


@override_settings(**LIMITS)
def test_address_is_locked_after_failures_across_accounts(
    person: tuple[Any, str], make_user: Callable[..., Any]
) -> None:
    user, password = person
    address = fresh_address()
    for n in range(5):  # five accounts tried once each from one address
        assert attempt(f"nobody-{uuid.uuid4().hex[:6]}-{n}", "guess", address).status_code == 200
    refused = attempt(user.username, password, address)
    assert refused.status_code == 429
    assert b"Too many failed sign-ins from this address" in refused.content
    assert attempt(user.username, password, fresh_address()).status_code == 302
    cache.delete(address_key(address))


@override_settings(**LIMITS)
def test_success_clears_the_pairs_count_not_the_addresses(person: tuple[Any, str]) -> None:
    user, password = person
    address = fresh_address()
    for _ in range(2):
        attempt(user.username, "wrong", address)
    assert attempt(user.username, password, address).status_code == 302
    for _ in range(2):  # two more failures: still under three since the success
        attempt(user.username, "wrong", address)
    assert attempt(user.username, password, address).status_code == 302
    assert cache.get(address_key(address)) == 4  # the address keeps its count
    cache.delete(address_key(address))


@override_settings(**LIMITS)
def test_admin_login_is_limited_too(make_user: Callable[..., Any]) -> None:
    name = f"admin-{uuid.uuid4().hex[:8]}"
    admin = get_user_model().objects.create_user(name, password="admin pass phrase", is_staff=True)
    address = fresh_address()
    for _ in range(3):
        attempt(name, "wrong", address, "/admin/login/")
    refused = attempt(name, "admin pass phrase", address, "/admin/login/")
    assert refused.status_code == 200  # the admin form shows its own error ...
    assert "_auth_user_id" not in refused.client.session  # ... and signs no one in
    assert admin.is_staff
    elsewhere = attempt(name, "admin pass phrase", fresh_address(), "/admin/login/")
    assert elsewhere.status_code == 302 and "_auth_user_id" in elsewhere.client.session


@override_settings(**LIMITS)
def test_hostile_usernames_are_counted_not_stored(person: tuple[Any, str]) -> None:
    address = fresh_address()
    for name in ("x" * 10_000, "' OR 1=1 --", "ümlaut\u202e"):
        response = attempt(name, "pw", address)
        assert response.status_code == 200
        assert cache.get(account_key(name, address)) == 1  # an integer under a digest key
    assert attempt("\x00", "pw", address).status_code == 200  # refused by the form itself
    assert cache.get(address_key(address)) == 3
    cache.delete(address_key(address))


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@override_settings(
    **{**LIMITS, "LOGIN_FAILURES_PER_ADDRESS": 10, "LOGIN_BACKOFF_AFTER_FAILURES": 2}
)
def test_an_address_is_slowed_before_it_is_stopped(
    person: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user, password = person
    clock = FakeClock(1_000_000.0)
    monkeypatch.setattr(login_limits, "time", clock)
    address = fresh_address()
    names = [f"nobody-{uuid.uuid4().hex[:6]}-{n}" for n in range(8)]
    assert attempt(names[0], "guess", address).status_code == 200
    assert attempt(names[1], "guess", address).status_code == 200  # the second: backoff 1 s
    waits = []
    for name in names[2:6]:
        slowed = attempt(name, "guess", address)
        assert slowed.status_code == 429
        assert b"Try again in" in slowed.content and b"second" in slowed.content
        waits.append(refusal(name, address).retry_after_s)  # type: ignore[union-attr]
        clock.now += waits[-1]  # waited as told: tried again
        assert attempt(name, "guess", address).status_code == 200
    assert waits == [1, 2, 4, 8]  # doubling, up to LOGIN_BACKOFF_MAX_SECONDS
    assert refusal(names[6], address).retry_after_s == 8  # type: ignore[union-attr]
    # The owner on that address waits too; from elsewhere, not at all.
    assert attempt(user.username, password, address).status_code == 429
    assert attempt(user.username, password, fresh_address()).status_code == 302
    cache.delete_many([address_key(address), login_limits._backoff_key(address)])


def test_ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4() -> None:
    assert address_bucket("2001:db8:1:2::1") == address_bucket("2001:db8:1:2:ffff::9")
    assert address_bucket("2001:db8:1:2::1") != address_bucket("2001:db8:1:3::1")
    assert address_bucket("::ffff:10.1.2.3") == address_bucket("10.1.2.3") == "10.1.2.3"
    assert address_bucket("") == "unknown"
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2::77")


def test_backoff_doubles_to_its_maximum() -> None:
    limits = Limits(per_account=5, per_address=20, window_s=900, backoff_after=5, backoff_max_s=60)
    assert [limits.backoff_s(n) for n in range(3, 13)] == [0, 0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert limits.backoff_s(10**9) == 60
