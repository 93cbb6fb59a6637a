"""The webhook signature: HMAC-SHA256 over ``"<timestamp>.<body>"`` with the subscription's secret.

A receiver recomputes it from the raw body and the ``X-Portal-Timestamp``
header, compares in constant time, and refuses old timestamps (replays);
docs/notifications.md has the snippet.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

TIMESTAMP_HEADER = "X-Portal-Timestamp"
SIGNATURE_HEADER = "X-Portal-Signature"
EVENT_HEADER = "X-Portal-Event"
DELIVERY_HEADER = "X-Portal-Delivery"


def new_secret() -> str:
    """A fresh per-subscription signing key (32 random bytes, hex)."""
    return secrets.token_hex(32)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Portal-Signature`` value: ``sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, header: str) -> bool:
    """Whether ``header`` is the signature of ``body`` at ``timestamp`` (constant time)."""
    return hmac.compare_digest(signature(secret, timestamp, body), header)
