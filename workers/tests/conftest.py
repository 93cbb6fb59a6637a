"""Fixtures of the cores' tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from workers.tests.redis_server import OwnRedis

if TYPE_CHECKING:
    from devtools.s3_server import S3Server


@dataclass(frozen=True)
class JobDevice:
    """Where the multi-process runtime tests put their workers (``JobRun.device``, ``.comm``)."""

    device: str
    comm: str


DEVICE_ENV, COMM_ENV = "EDL_TEST_DEVICE", "EDL_TEST_COMM"


@pytest.fixture(scope="session")
def job_device() -> JobDevice:
    """``EDL_TEST_DEVICE`` (default ``cpu``; ``cuda:0``, or ``cuda``: one GPU per worker) and
    ``EDL_TEST_COMM`` (default ``auto``; ``gloo`` lets several workers share one GPU).

    ``bench/device_check.sh`` runs the scenario tests on a GPU machine this way.
    """
    return JobDevice(os.environ.get(DEVICE_ENV, "cpu"), os.environ.get(COMM_ENV, "auto"))


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
    # Imported here: only the S3 tests need moto and boto3, and the runtime's tests also
    # run where they are not installed (bench/device_check.sh on a GPU machine).
    from devtools.s3_server import moto_s3

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
