"""Fixtures for every test folder: the Redis server that the settings name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db.models.signals import pre_delete, pre_save

from tests.architecture.writes import guard
from utilities.embedded_redis import ensure_running


@pytest.fixture(scope="session", autouse=True)
def redis_server() -> str:
    """The Redis the tests use: ``REDIS_URL``, else the embedded server, started here.

    Settings only name the embedded server's URL; starting it is the test setup's job.
    """
    if settings.REDIS_IS_EMBEDDED:
        return ensure_running(settings.DATA_DIR)
    return str(settings.REDIS_URL)


@pytest.fixture(scope="session", autouse=True)
def job_write_guard() -> Iterator[None]:
    """Every test proves that only the writer modules save or delete job models."""
    pre_save.connect(guard, weak=False, dispatch_uid="job-write-guard")
    pre_delete.connect(guard, weak=False, dispatch_uid="job-write-guard")
    yield
    pre_save.disconnect(dispatch_uid="job-write-guard")
    pre_delete.disconnect(dispatch_uid="job-write-guard")
