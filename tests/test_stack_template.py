"""The stacks' migrated template (``devtools.stack.migrated_template``): a copy of it is what
``migrate`` makes from nothing, so a stack booted on a copy runs on the schema it would
have built itself."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db.migrations.loader import MigrationLoader

from devtools.stack import migrated_template

URL = os.environ.get("DATABASE_URL", "")
pytestmark = pytest.mark.skipif(
    not URL.startswith(("postgres://", "postgresql://")),
    reason="the template is a PostgreSQL database (DATABASE_URL)",
)


@pytest.fixture
def server() -> str:
    """``DATABASE_URL``'s server, without a database name."""
    return URL.rsplit("/", 1)[0]


@pytest.fixture
def copy(server: str) -> Iterator[str]:
    """A database copied from the template, dropped at the end; its name."""
    name = f"template_copy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template(server)}"')
    yield name
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_copy_has_every_migration_on_disk_applied(server: str, copy: str) -> None:
    on_disk = set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)
    with psycopg.connect(f"{server}/{copy}") as conn:
        applied = set(conn.execute("SELECT app, name FROM django_migrations").fetchall())
    assert on_disk and applied == on_disk


def test_it_is_built_once_and_takes_no_connection(server: str) -> None:
    name = migrated_template(server)
    assert migrated_template(server) == name
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, datallowconn FROM pg_database WHERE datname LIKE 'e2e\\_template\\_%'"
        ).fetchall()
    # Closed to connections (one would block a copy).
    assert (name, False) in rows
