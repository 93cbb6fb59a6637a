"""make test's parallel phase: each pytest-xdist worker has its own Redis database.

``portal.settings.test`` moves ``REDIS_URL``'s database number up by the worker's index
(``gw0`` keeps it, ``gw1`` takes the next), so the tick lock, agent queues and Celery
queues of one worker are never another's; a URL with no number counts as database 0.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from portal.settings.parallel import worker_redis_url
from portal.settings.test import XDIST_WORKER


@pytest.mark.parametrize(
    ("url", "index", "expected"),
    [
        ("redis://127.0.0.1:6379/0", 0, "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/0", 1, "redis://127.0.0.1:6379/1"),
        ("redis://127.0.0.1:6379/4", 2, "redis://127.0.0.1:6379/6"),
        ("redis://127.0.0.1:6379", 1, "redis://127.0.0.1:6379/1"),
        ("redis://:secret@host:6380/3", 1, "redis://:secret@host:6380/4"),
    ],
)
def test_a_worker_takes_the_database_its_index_above(url: str, index: int, expected: str) -> None:
    assert worker_redis_url(url, index) == expected


def test_this_process_uses_the_database_its_worker_names() -> None:
    """The settings and the environment (which subprocesses inherit) agree."""
    if os.environ.get("REDIS_URL") is None:
        pytest.skip("no REDIS_URL: the embedded server")
    assert os.environ["REDIS_URL"] == settings.REDIS_URL
    if XDIST_WORKER:
        assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] == f"asgi-{XDIST_WORKER}"
        assert settings.DATA_DIR.name == XDIST_WORKER
