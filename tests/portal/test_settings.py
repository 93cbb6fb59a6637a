"""Settings start nothing: loading them names the embedded Redis without running it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_clients import one_try
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
            one_try(host="127.0.0.1", port=port).ping()
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


# --- Safe defaults: no public key, no public debug pages, a clean deploy check.

OLD_PUBLIC_KEY = "insecure-dev-key-change-me-for-any-real-deployment"
STRONG_KEY = "k8Yq2-deploy-check-key-7fV0pZr9wXc3LmN4bT6hJ1sD5gA8eU2iO0yR7tK3qW9vB"

# Each entry point, loading its settings the way the process it starts would.
ENTRY_POINTS = {
    "manage.py": [sys.executable, "manage.py", "shell", "-c", "from django.conf import settings as s; print(s.DEBUG)"],
    "asgi": [sys.executable, "-c", "import portal.asgi; from django.conf import settings as s; print(s.DEBUG)"],
    "wsgi": [sys.executable, "-c", "import portal.wsgi; from django.conf import settings as s; print(s.DEBUG)"],
    "celery": [sys.executable, "-c", "from portal.celery import app; app.conf.broker_url; from django.conf import settings as s; print(s.DEBUG)"],
}  # fmt: skip


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any settings choice, secret or debug flag."""
    drop = {"DJANGO_SETTINGS_MODULE", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "REDIS_URL"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PORTAL_DATA_DIR=str(tmp_path), **extra)
    return env


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_points_refuse_to_start_without_a_secret_key(entry: str, tmp_path: Path) -> None:
    """Outside ``make run`` no process falls back to DEBUG and a key anyone can read."""
    result = run(ENTRY_POINTS[entry], bare_env(tmp_path))
    assert result.returncode != 0, result.stdout
    assert "SECRET_KEY is not set" in result.stderr
    assert not (tmp_path / "secret_key").exists()


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_points_run_without_debug_given_a_secret_key(entry: str, tmp_path: Path) -> None:
    result = run(ENTRY_POINTS[entry], bare_env(tmp_path, SECRET_KEY=STRONG_KEY))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_dev_settings_keep_a_private_key_per_data_directory(tmp_path: Path) -> None:
    """``make run`` needs no key, and the one it uses is random, private and stable."""
    code = "import django; django.setup(); from django.conf import settings as s; print(s.DEBUG, s.SECRET_KEY)"
    env = bare_env(tmp_path, DJANGO_SETTINGS_MODULE="portal.settings.dev")
    first, second = run([sys.executable, "-c", code], env), run([sys.executable, "-c", code], env)
    assert first.returncode == 0, first.stderr
    debug, key = first.stdout.split()
    assert debug == "True" and len(key) >= 50 and key != OLD_PUBLIC_KEY
    assert second.stdout.split()[1] == key  # sessions survive a restart
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    other = run([sys.executable, "-c", code], {**env, "PORTAL_DATA_DIR": str(tmp_path / "b")})
    assert other.stdout.split()[1] != key  # not a key shared by every checkout


@pytest.mark.parametrize(
    "hosts", ["*", "portal.example.org", "0.0.0.0", ".example.org", "localhost,10.1.2.3"]
)
@pytest.mark.parametrize("module", ["portal.settings.dev", "portal.settings.base"])
def test_debug_with_a_public_host_refuses_to_start(hosts: str, module: str, tmp_path: Path) -> None:
    env = bare_env(tmp_path, DJANGO_SETTINGS_MODULE=module, DEBUG="1", ALLOWED_HOSTS=hosts)
    result = run(ENTRY_POINTS["manage.py"], env)
    assert result.returncode != 0, result.stdout
    assert "DEBUG is on and ALLOWED_HOSTS admits" in result.stderr


def test_debug_on_loopback_hosts_starts(tmp_path: Path) -> None:
    env = bare_env(
        tmp_path,
        DJANGO_SETTINGS_MODULE="portal.settings.dev",
        ALLOWED_HOSTS="127.0.0.1,localhost,[::1],127.0.0.2",
    )
    result = run(ENTRY_POINTS["manage.py"], env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("[::1]", True),
        ("::1", True),
        ("testserver", True),
        ("localhost.evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("*", False),
        # RFC 6761: names under .localhost are loopback (browsers resolve them so, without
        # DNS): the local lab hosts (LAB_HOST_TEMPLATE=lab-{id}.localhost) under DEBUG.
        (".localhost", True),
        ("lab-7.localhost", True),
        ("localhost.", False),
        ("0.0.0.0", False),
        ("[::]", False),
        ("192.168.1.10", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    from portal.settings.safety import is_loopback_host

    assert is_loopback_host(host) is loopback


def prod_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return bare_env(
        tmp_path,
        DJANGO_SETTINGS_MODULE="portal.settings.prod",
        SECRET_KEY=STRONG_KEY,
        ALLOWED_HOSTS="portal.example.org",
        DATABASE_URL="postgres://portal:pw@127.0.0.1:5432/portal",
        REDIS_URL="redis://:pw@127.0.0.1:6379/0",
        **{"LAB_HOST_TEMPLATE": "{id}.labs.example.net", **extra},
    )


def test_check_deploy_is_clean_under_prod_settings(tmp_path: Path) -> None:
    """HSTS, SSL redirect, secure cookies, a real key: Django's own deploy check finds nothing."""
    argv = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "DEBUG"]
    result = run(argv, prod_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr


def test_check_deploy_warns_while_labs_share_the_portals_origin(tmp_path: Path) -> None:
    argv = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    result = run(argv, prod_env(tmp_path, LAB_HOST_TEMPLATE=""))
    assert result.returncode != 0
    assert "portal.W001" in result.stderr + result.stdout
    assert "LAB_HOST_TEMPLATE" in result.stderr + result.stdout


def test_a_lab_host_template_widens_allowed_hosts_by_the_labs_domain_alone(
    tmp_path: Path,
) -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.ALLOWED_HOSTS, s.PORTAL_HOSTS)"
    )
    done = run([sys.executable, "-c", code], prod_env(tmp_path))
    assert done.stdout.strip() == (
        "['portal.example.org', '.labs.example.net'] ['portal.example.org']"
    ), done.stderr
    bad = run([sys.executable, "-c", code], prod_env(tmp_path, LAB_HOST_TEMPLATE="labs.{id}.net"))
    assert bad.returncode != 0 and "first label" in bad.stderr


def test_prod_trusts_the_proxy_header_only_when_told(tmp_path: Path) -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SECURE_PROXY_SSL_HEADER)"
    )
    plain = run([sys.executable, "-c", code], prod_env(tmp_path))
    assert plain.stdout.strip() == "None", plain.stderr
    opted = run([sys.executable, "-c", code], prod_env(tmp_path, SECURE_PROXY_SSL_HEADER="1"))
    assert opted.stdout.strip() == "('HTTP_X_FORWARDED_PROTO', 'https')", opted.stderr


def test_make_run_selects_the_dev_settings() -> None:
    """The only place DEBUG is the default: ``make run`` names ``dev`` itself."""
    dry = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "DJANGO_SETTINGS_MODULE=portal.settings.dev" in dry.stdout


def test_the_live_channel_layer_is_chosen_by_name_and_a_wrong_name_is_refused() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from portal.settings.live import DEFAULT_LAYER, channel_layers

    url = "redis://127.0.0.1:6379/2"
    pubsub = channel_layers(DEFAULT_LAYER, redis_url=url, socket_timeout_s=30)["default"]
    assert pubsub["BACKEND"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    assert pubsub["CONFIG"]["hosts"] == [{"address": url, "socket_timeout": 30}]
    core = channel_layers("core", redis_url=url, socket_timeout_s=30)["default"]
    assert core["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert (core["CONFIG"]["capacity"], core["CONFIG"]["expiry"]) == (1000, 30)
    with pytest.raises(
        ImproperlyConfigured, match="LIVE_CHANNEL_LAYER must be one of core, pubsub"
    ):
        channel_layers("rabbit", redis_url=url, socket_timeout_s=30)
