"""Settings start nothing: loading them names the embedded Redis without running it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from utilities.embedded_redis import answers_ping

ROOT = Path(__file__).resolve().parents[2]


def test_loading_settings_starts_no_redis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(PORTAL_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings.dev")
    code = (
        "import django; django.setup(); from django.conf import settings; print(settings.REDIS_URL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    port = int((tmp_path / "redis" / "port").read_text())
    password = (tmp_path / "redis" / "password").read_text()
    assert out.stdout.strip() == f"redis://portal:{password}@127.0.0.1:{port}/0"  # recorded port
    assert not (tmp_path / "redis" / "pid").exists()
    assert not answers_ping(port)


def test_embedded_redis_answers_only_with_its_password(tmp_path: Path) -> None:
    """No client without the password is answered: not even a tenant program on this host."""
    import redis

    from utilities.embedded_redis import ensure_running

    saved = os.environ.get("REDIS_URL")
    try:
        url = ensure_running(tmp_path)
        port = int((tmp_path / "redis" / "port").read_text())
        password_file = tmp_path / "redis" / "password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "redis" / "conf").stat().st_mode & 0o777 == 0o600
        assert not answers_ping(port)
        assert answers_ping(port, password=password_file.read_text())
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port).ping()
        assert redis.Redis.from_url(url).ping()
        assert ensure_running(tmp_path) == url  # a second caller reuses it
    finally:
        # Only this test's server: the session's own embedded Redis stays up.
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((tmp_path / "redis" / "pid").read_text()), signal.SIGTERM)
        if saved is None:
            os.environ.pop("REDIS_URL", None)
        else:
            os.environ["REDIS_URL"] = saved
