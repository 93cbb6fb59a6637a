"""Fixtures of the cores' tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``REDIS_URL``, else an embedded Redis server of the module's own (tests may override)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    from utilities.embedded_redis import ensure_running

    return ensure_running(tmp_path_factory.mktemp("redis"))
