"""Fixtures for every test folder: the Redis server that the settings name."""

from __future__ import annotations

import pytest
from django.conf import settings

from utilities.embedded_redis import ensure_running


@pytest.fixture(scope="session", autouse=True)
def redis_server() -> str:
    """The Redis the tests use: ``REDIS_URL``, else the embedded server, started here.

    Settings only name the embedded server's URL; starting it is the test setup's job.
    """
    if settings.REDIS_IS_EMBEDDED:
        return ensure_running(settings.DATA_DIR)
    return str(settings.REDIS_URL)
