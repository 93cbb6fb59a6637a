"""Boot and stop ``manage.py runstack`` for the end-to-end tests and the benchmarks.

    test / bench ──start_stack(env)──> manage.py runstack ──> daphne, Celery worker and
         │                               (stack.log)          beat, node agents, and the
         └──wait_http, stop_stack──────────────────────────── embedded Redis if no REDIS_URL

``stack_env`` gives a stack its own database (a new PostgreSQL database when
``DATABASE_URL`` is set, else SQLite in its data directory) and an emptied Redis
database; ``stop_stack`` stops it as Ctrl-C does and kills what it left behind.

A new PostgreSQL database is a copy of a migrated template (``migrated_template``),
made once per set of migration files: runstack's ``migrate`` then has nothing to apply,
and a boot costs seconds less than migrating from nothing (about 15 s on two busy cores).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import django
import psycopg
import redis

from utilities.embedded_redis import free_port
from workers.signing import key_to_text, master_secret, node_key

__all__ = [
    "ROOT",
    "agent_key",
    "free_port",
    "kill_strays",
    "migrated_template",
    "stack_env",
    "start_stack",
    "stop_stack",
    "wait_http",
]

ROOT = Path(__file__).resolve().parent.parent


def wait_http(url: str, timeout: float) -> int:
    """The HTTP status of ``url`` once it answers; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status)
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout} s")


def start_stack(tmp_path: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Run ``manage.py runstack`` with ``env``, its output in ``tmp_path/stack.log``."""
    log = (tmp_path / "stack.log").open("w+")
    return subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def kill_strays(root: Path) -> list[int]:
    """SIGKILL every process whose command line names ``root``; return their pids.

    Training workers run in their own sessions so that a restarted agent adopts
    them; a stack stopped while a job still ran (a test that failed before it
    cancelled its jobs) leaves them training on every core for hours. Every
    worker's command line names its store under the stack's data directory.
    """
    mark = str(root).encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile, or not ours to read
    return killed


def stop_stack(proc: subprocess.Popen[bytes], root: Path) -> None:
    """Stop ``runstack`` as Ctrl-C does (then harder), and whatever it left running under ``root``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
    kill_strays(root)


TEMPLATE_PREFIX = "e2e_template_"
_TEMPLATE_LOCK = 7_146_501  # pg_advisory_lock key: one process builds a template at a time


def _migrations_digest() -> str:
    """A digest of every migration file of this checkout and of Django's version."""
    digest = hashlib.sha256(django.__version__.encode())
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def migrated_template(base: str) -> str:
    """The name of a database on the server ``base`` (a URL without a database name) that
    holds every migration of this checkout; built on first use, then reused.

    A copy (``CREATE DATABASE ... TEMPLATE``) is what ``migrate`` would have made from
    nothing. The name carries a digest of the migration files, so an added or edited
    migration builds a new template, and the older ones are dropped. Nothing connects to
    a template once built (``ALLOW_CONNECTIONS false``): a connection would block copies.
    """
    name = TEMPLATE_PREFIX + _migrations_digest()
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [_TEMPLATE_LOCK])
        try:
            names = [row[0] for row in conn.execute("SELECT datname FROM pg_database")]
            if name not in names:
                partial = f"{name}_partial"
                conn.execute(f'DROP DATABASE IF EXISTS "{partial}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{partial}"')
                with tempfile.TemporaryDirectory(prefix="e2e-template-") as data_dir:
                    env = {
                        **os.environ,
                        "DATABASE_URL": f"{base}/{partial}",
                        "DJANGO_SETTINGS_MODULE": "portal.settings.dev",
                        "PORTAL_DATA_DIR": data_dir,
                    }
                    subprocess.run(
                        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
                        cwd=ROOT, env=env, check=True, capture_output=True,
                    )  # fmt: skip
                conn.execute(f'ALTER DATABASE "{partial}" RENAME TO "{name}"')
                conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            for old in names:
                if old.startswith(TEMPLATE_PREFIX) and old != name:
                    # a run of an older checkout may be copying it right now
                    with contextlib.suppress(psycopg.errors.ObjectInUse):
                        conn.execute(f'DROP DATABASE IF EXISTS "{old}"')
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [_TEMPLATE_LOCK])
    return name


def _throwaway_database(tmp_path: Path) -> tuple[str | None, Callable[[], None]]:
    """A fresh database for the stack: a migrated PostgreSQL database, or SQLite in tmp."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return None, lambda: None
    base = url.rsplit("/", 1)[0]
    name = f"e2e_{uuid.uuid4().hex[:8]}"
    template = migrated_template(base)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def drop() -> None:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{base}/{name}", drop


def stack_env(
    tmp_path: Path, redis_db: int, **overrides: str
) -> tuple[dict[str, str], Callable[[], None]]:
    """The stack's environment (a fresh database, an emptied Redis db) and how to drop the db.

    The machine's own ``DATABASE_URL``/``REDIS_URL`` name the services; without
    them the stack runs on SQLite and the embedded Redis of ``tmp_path``.
    """
    db_url, drop_db = _throwaway_database(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    defaults = {
        "PORTAL_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings.dev",
        "PYTHONUNBUFFERED": "1",
        "TICK_SECONDS": "1",
        "AGENT_HEARTBEAT_SECONDS": "2",
        "SCHEDULER_POLICY": "elastic-tiresias",
        "OMP_NUM_THREADS": "1",
        "DEBUG": "0",
        # The agents' keys derive from it: agents the tests start take agent_key(env, node).
        "AGENT_SIGNING_KEY": "e2e-agent-signing-key",
    }
    env.update({**defaults, **overrides})
    if db_url:
        env["DATABASE_URL"] = db_url
    if os.environ.get("REDIS_URL"):
        redis_url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + f"/{redis_db}"
        redis.Redis.from_url(redis_url).flushdb()
        env["REDIS_URL"] = redis_url
    return env, drop_db


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``manage.py ARGS`` in the stack's environment ``env`` (its data dir, so the
    embedded Redis, if any, is shared); its standard output, stripped."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def agent_key(env: dict[str, str], node: str) -> str:
    """The ``AGENT_KEY`` of ``node``'s agent under the stack's environment ``env``."""
    master = master_secret(env.get("AGENT_SIGNING_KEY", ""), env.get("SECRET_KEY", ""))
    return key_to_text(node_key(master, node))
