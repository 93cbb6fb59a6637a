"""Fixtures of the queue tests: a real broker."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def redis_url() -> str:
    """``REDIS_URL`` (a real broker: the tests start real Celery workers on it)."""
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("needs REDIS_URL (a real broker)")
    return url
