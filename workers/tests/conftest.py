"""Fixtures of the cores' tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.tests.redis_server import OwnRedis
from workers.tests.s3_server import S3Server, moto_s3


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``REDIS_URL``, else an embedded Redis server of the module's own (tests may override)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    from utilities.embedded_redis import ensure_running

    return ensure_running(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """moto's S3 server on loopback, one bucket, for the module's tests."""
    with moto_s3("artifacts") as server:
        yield server


@pytest.fixture(params=["file", "s3"])
def root_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The URL of an empty store: a directory, or a fresh prefix of the S3 bucket."""
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    server: S3Server = request.getfixturevalue("s3")
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return f"{server.url}/{tmp_path.name}"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server of the test's own (append-only), which the test may restart."""
    server = OwnRedis(tmp_path / "own-redis")
    server.start()
    yield server
    server.stop()
