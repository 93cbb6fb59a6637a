"""The pure rules of API tokens: hashing, display prefix, refusals, the once-a-minute touch."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from tenancy.tokens import (
    PREFIX_LENGTH,
    display_prefix,
    effective_expiry,
    expiry,
    hash_secret,
    needs_touch,
    new_secret,
    refusal,
    strictest_days,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_secrets_are_fresh_and_only_their_hash_and_prefix_are_kept() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100 and all(len(s) == 40 for s in secrets)
    secret = secrets.pop()
    assert hash_secret(secret) == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in hash_secret(secret)
    assert display_prefix(secret) == secret[:PREFIX_LENGTH]


@pytest.mark.parametrize(
    ("revoked_at", "expires_at", "message"),
    [
        (None, NOW + timedelta(seconds=1), None),
        (None, NOW, "token expired on 2026-03-01"),
        (None, NOW - timedelta(days=3), "token expired on 2026-02-26"),
        (NOW - timedelta(days=1), NOW + timedelta(days=9), "token revoked on 2026-02-28"),
        (NOW - timedelta(days=1), NOW - timedelta(days=2), "token revoked on 2026-02-28"),
    ],
)
def test_refusal(revoked_at: datetime | None, expires_at: datetime, message: str | None) -> None:
    assert refusal(revoked_at=revoked_at, expires_at=expires_at, now=NOW) == message


def test_use_is_written_down_at_most_once_a_minute() -> None:
    assert needs_touch(None, NOW)
    assert not needs_touch(NOW - timedelta(seconds=59), NOW)
    assert needs_touch(NOW - timedelta(seconds=60), NOW)
    assert expiry(NOW, 90) == NOW + timedelta(days=90)


def test_a_maximum_lifetime_cuts_a_longer_expiry() -> None:
    made = NOW - timedelta(days=400)
    decade = made + timedelta(days=3650)
    assert effective_expiry(created_at=made, expires_at=decade) == decade
    assert effective_expiry(created_at=made, expires_at=decade, max_days=365) == made + timedelta(
        days=365
    )
    assert effective_expiry(created_at=made, expires_at=made + timedelta(days=9), max_days=365) == (
        made + timedelta(days=9)
    )
    assert refusal(revoked_at=None, expires_at=decade, now=NOW) is None
    assert (
        refusal(revoked_at=None, expires_at=decade, now=NOW, created_at=made, max_days=365)
        == "token expired on 2026-01-25"
    )
    assert strictest_days(365, None) == 365
    assert strictest_days(365, 30) == 30
    assert strictest_days(365, 3650) == 365
