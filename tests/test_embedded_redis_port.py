"""The embedded Redis: a fixed port, ACL users only, and data that outlives a restart.

It keeps its recorded port across quick restarts (the settings read it
first); it answers only the ``portal`` user (``default`` is off); its
append-only file brings back what was written after a crash.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from tests.redis_clients import one_try
from utilities.embedded_redis import (
    PASSWORD_GENERATION,
    USER,
    EmbeddedRedisError,
    ServerRunning,
    _port_is_free,
    answers_ping,
    ensure_running,
    recorded_url,
    restart_if_dead,
    rotate_password,
    server_config,
)


def test_a_port_our_server_just_closed_is_free_but_a_listening_one_is_not() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert not _port_is_free(port)  # someone listens there
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server closes first: its side of the port goes to TIME_WAIT
    listener.close()
    client.close()
    # redis-server binds with SO_REUSEADDR, so it could listen here again at once:
    # the recorded port (and the URL the settings read) stays right.
    assert _port_is_free(port)


# --------------------------------------------------------------------------- ACL and persistence


@contextlib.contextmanager
def own_server(data_dir: Path) -> Iterator[str]:
    """An embedded Redis of this test only (the session's own server stays up)."""
    saved = os.environ.get("REDIS_URL")
    try:
        yield ensure_running(data_dir)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((data_dir / "redis" / "pid").read_text()), signal.SIGTERM)
        if saved is None:
            os.environ.pop("REDIS_URL", None)
        else:
            os.environ["REDIS_URL"] = saved


def restart_if_dead_within(data_dir: Path, seconds: float) -> str | None:
    """Call the supervisor's repair until it notices the death (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        said = restart_if_dead(data_dir)
        if said is not None:
            return said
        time.sleep(0.05)
    return None


def test_only_the_portal_user_is_answered(tmp_path: Path) -> None:
    with own_server(tmp_path) as url:
        assert url.startswith(f"redis://{USER}:")
        port = int((tmp_path / "redis" / "port").read_text())
        password = (tmp_path / "redis" / "password").read_text()
        with pytest.raises(redis.AuthenticationError):  # no credentials: NOAUTH
            one_try(host="127.0.0.1", port=port).ping()
        for user, secret in (("default", ""), ("default", password), (USER, "wrong")):
            with pytest.raises(redis.AuthenticationError):
                one_try(host="127.0.0.1", port=port, username=user, password=secret).ping()
        with pytest.raises(redis.AuthenticationError):  # the old requirepass style
            one_try(host="127.0.0.1", port=port, password=password).ping()
        client = redis.Redis.from_url(url)
        assert client.ping() and client.acl_whoami() == USER
        assert answers_ping(port, password=password) and not answers_ping(port)


def test_the_agents_create_per_job_users_through_the_portal_user(tmp_path: Path) -> None:
    from workers.agent.redis_acl import delete_job_user, job_url

    with own_server(tmp_path) as url:
        admin = redis.Redis.from_url(url)
        tenant = redis.Redis.from_url(job_url(admin, url, "job-7"))
        tenant.set("edl:job-7:leader", "w0")
        assert admin.get("edl:job-7:leader") == b"w0"
        with pytest.raises(redis.exceptions.NoPermissionError):
            tenant.get("agent:acl:secret")
        delete_job_user(admin, "job-7")


def test_what_was_written_survives_a_killed_and_restarted_server(tmp_path: Path) -> None:
    """The runstack supervisor's repair: same port, same password, the data still there."""
    with own_server(tmp_path) as url:
        client = redis.Redis.from_url(url)
        client.rpush("portal", "queued task")
        client.set("edl:job-1:generation", "3")
        time.sleep(1.5)  # appendfsync everysec: a second at most is at risk on a crash
        assert restart_if_dead(tmp_path) is None  # alive: nothing to do
        pid = int((tmp_path / "redis" / "pid").read_text())
        os.kill(pid, signal.SIGKILL)
        said = restart_if_dead_within(tmp_path, 10)
        assert said is not None and "started again" in said and "NEW port" not in said
        assert int((tmp_path / "redis" / "pid").read_text()) != pid
        again = redis.Redis.from_url(url)  # the URL every child holds still works
        assert again.lrange("portal", 0, -1) == [b"queued task"]
        assert again.get("edl:job-1:generation") == b"3"


def test_a_clean_restart_keeps_everything(tmp_path: Path) -> None:
    with own_server(tmp_path) as url:
        redis.Redis.from_url(url).set("k", "v")
        state = tmp_path / "redis"
        os.kill(int((state / "pid").read_text()), signal.SIGTERM)  # a clean stop
        assert restart_if_dead_within(tmp_path, 10) is not None
        assert redis.Redis.from_url(url).get("k") == b"v"
        assert (state / "appendonly.aof").stat().st_size > 0
        assert state.stat().st_mode & 0o777 == 0o700  # the data is this user's alone


def test_the_configuration_refuses_a_password_that_could_break_it() -> None:
    assert "user default off" in server_config("abc123")
    with pytest.raises(EmbeddedRedisError):
        server_config('x" ~* +@all\nuser evil on nopass')


# --------------------------------------------------------------------------- password rotation


def stop_and_wait(data_dir: Path, url: str) -> None:
    """SIGTERM the embedded server of ``data_dir`` and wait until it answers no more."""
    port = int((data_dir / "redis" / "port").read_text())
    password = (data_dir / "redis" / "password").read_text()
    os.kill(int((data_dir / "redis" / "pid").read_text()), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while answers_ping(port, password=password):
        assert time.monotonic() < deadline, f"the server of {url} did not stop"
        time.sleep(0.05)


def test_a_password_an_older_version_made_is_replaced_before_the_server_starts(
    tmp_path: Path,
) -> None:
    """Such a password may have been shown in a job log: it is never used again."""
    state = tmp_path / "redis"
    state.mkdir(mode=0o700)
    old = "0ld" * 16
    (state / "password").write_text(old)  # no generation recorded: an older version's
    url = recorded_url(tmp_path)
    assert old not in url
    assert (state / "password-generation").read_text() == str(PASSWORD_GENERATION)
    assert (state / "password").stat().st_mode & 0o777 == 0o600
    assert recorded_url(tmp_path) == url  # made once
    with own_server(tmp_path) as running:
        assert running == url and redis.Redis.from_url(url).ping()


def test_a_running_server_keeps_its_old_password_until_it_stops(tmp_path: Path) -> None:
    with own_server(tmp_path) as url:
        (tmp_path / "redis" / "password-generation").unlink()  # as an older version left it
        assert recorded_url(tmp_path) == url  # its clients hold it: not changed under them
        assert ensure_running(tmp_path) == url
        stop_and_wait(tmp_path, url)
        renewed = ensure_running(tmp_path)  # the next start: a new password
        assert renewed != url and redis.Redis.from_url(renewed).ping()
        old = urlsplit(url)
        with pytest.raises(redis.AuthenticationError):
            one_try(host="127.0.0.1", port=old.port, username=USER, password=old.password).ping()


def test_rotation_refuses_a_running_server_and_renews_a_stopped_ones(tmp_path: Path) -> None:
    with own_server(tmp_path) as url:
        with pytest.raises(ServerRunning, match="stop the stack"):
            rotate_password(tmp_path)
        assert recorded_url(tmp_path) == url
        embedded_here = override_settings(REDIS_IS_EMBEDDED=True, DATA_DIR=tmp_path)
        with embedded_here, pytest.raises(CommandError, match="is running"):
            call_command("rotateredispassword")
        stop_and_wait(tmp_path, url)
        out = io.StringIO()
        with override_settings(REDIS_IS_EMBEDDED=True, DATA_DIR=tmp_path):
            call_command("rotateredispassword", stdout=out)
        assert "new password" in out.getvalue()
        assert recorded_url(tmp_path) != url


def test_rotating_a_redis_of_ones_own_prints_the_steps() -> None:
    out = io.StringIO()
    with override_settings(REDIS_IS_EMBEDDED=False):
        call_command("rotateredispassword", stdout=out)
    assert "ACL SETUSER" in out.getvalue() and "REDIS_URL" in out.getvalue()
