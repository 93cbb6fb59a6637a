"""Fixtures for every test folder: the Redis server that the settings name."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db.models.signals import pre_delete, pre_save

from tests.architecture.writes import guard
from utilities.embedded_redis import ensure_running
from workers.agent.network import RUN_ROOT, remove_made_since


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


@pytest.fixture(scope="session", autouse=True)
def no_job_networks_left() -> Iterator[None]:
    """Remove the job networks this session's agents made and left (a killed test stack's
    agents never settle their jobs; a real node's next agent does, ``Agent.restore``)."""
    started = time.time()
    yield
    remove_made_since(RUN_ROOT, started)
