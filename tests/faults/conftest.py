"""Fixtures of the fault tests: the test's own Redis, a scenario clock that prints wall times."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.services import RedisServer, ThrowawayPostgres, postgres_binaries


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the module's own (append-only), which a test may restart."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="package")
def postgres() -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL cluster of the fault tests' own, which they may stop and start.

    One for the package, not one per module: each module's stack has a database of its
    own on it (``stack_on_postgres``), copied from a template migrated once, so the second
    module neither makes a cluster nor migrates again.
    """
    binaries = postgres_binaries()
    if binaries is None:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (initdb, pg_ctl)")
    cluster = ThrowawayPostgres(binaries)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def scenario_clock(request: pytest.FixtureRequest) -> Iterator[Callable[[str], None]]:
    """Prints the scenario's wall time at its end, and ``mark(what)`` lap times within it."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    started = time.monotonic()

    def say(line: str) -> None:
        if reporter is not None:  # shown with or without -s
            reporter.write_line(line)

    def mark(what: str) -> None:
        say(f"  [{request.node.name}] {what}: {time.monotonic() - started:.1f} s")

    yield mark
    say(f"  [{request.node.name}] wall time {time.monotonic() - started:.1f} s")
