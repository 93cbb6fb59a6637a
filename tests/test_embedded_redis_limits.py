"""The embedded Redis is bounded: memory (full means refused, never evicted) and connections.

Each test runs a server of its own; the shared server of ``REDIS_URL`` is never reconfigured.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from utilities.embedded_redis import (
    DEFAULT_MAXCLIENTS,
    EVICTION_POLICY,
    EmbeddedRedisError,
    ServerLimits,
    ensure_running,
    server_config,
)


@contextlib.contextmanager
def own_server(data_dir: Path, limits: ServerLimits | None = None) -> Iterator[redis.Redis]:
    """An embedded server of this test only; ``REDIS_URL`` is left as it was."""
    saved = os.environ.get("REDIS_URL")
    try:
        url = ensure_running(data_dir, limits=limits)
    finally:
        if saved is None:
            os.environ.pop("REDIS_URL", None)
        else:
            os.environ["REDIS_URL"] = saved
    try:
        yield redis.Redis.from_url(url, decode_responses=True)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((data_dir / "redis" / "pid").read_text()), signal.SIGTERM)


def settings(client: redis.Redis) -> dict[str, str]:
    found = client.config_get("max*")
    return {name: str(found[name]) for name in ("maxmemory", "maxmemory-policy", "maxclients")}


def test_a_new_server_is_bounded_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_MAXMEMORY_MB", raising=False)
    monkeypatch.delenv("REDIS_MAXCLIENTS", raising=False)
    with own_server(tmp_path) as client:
        found = settings(client)
    assert int(found["maxmemory"]) > 0, "no maxmemory: one job's keys can take the machine"
    assert found["maxmemory-policy"] == EVICTION_POLICY == "noeviction"
    assert 16 <= int(found["maxclients"]) <= DEFAULT_MAXCLIENTS


def test_the_limits_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_MAXMEMORY_MB", "48")
    monkeypatch.setenv("REDIS_MAXCLIENTS", "300")
    assert ServerLimits.from_env() == ServerLimits(maxmemory=48 * 2**20, maxclients=300)
    with own_server(tmp_path) as client:
        assert settings(client) == {
            "maxmemory": str(48 * 2**20),
            "maxmemory-policy": "noeviction",
            "maxclients": "300",
        }
    assert "maxmemory 50331648\n" in server_config("abc123", ServerLimits.from_env())


@pytest.mark.parametrize(
    ("name", "value"),
    [("REDIS_MAXMEMORY_MB", "lots"), ("REDIS_MAXMEMORY_MB", "0"), ("REDIS_MAXCLIENTS", "-5")],
)
def test_a_bad_limit_is_a_clear_error(name: str, value: str) -> None:
    with pytest.raises(EmbeddedRedisError, match=name if value != "0" else "maxmemory"):
        ServerLimits.from_env({name: value})


def test_a_running_server_started_without_limits_gets_them(tmp_path: Path) -> None:
    """A server an older version started (no limits) is bounded by the next ensure_running."""
    with own_server(tmp_path, ServerLimits(maxmemory=64 * 2**20, maxclients=200)) as client:
        client.config_set("maxmemory", 0)  # as an older version left it
        client.config_set("maxmemory-policy", "allkeys-lru")
        saved = os.environ.get("REDIS_URL")
        try:
            ensure_running(tmp_path, limits=ServerLimits(maxmemory=96 * 2**20, maxclients=250))
        finally:
            if saved is None:
                os.environ.pop("REDIS_URL", None)
            else:
                os.environ["REDIS_URL"] = saved
        assert settings(client) == {
            "maxmemory": str(96 * 2**20),
            "maxmemory-policy": "noeviction",
            "maxclients": "250",
        }
