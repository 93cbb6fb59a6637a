"""A tick killed mid-way never stalls scheduling; two ticks never overlap.

The fault suite found that a Celery worker SIGKILLed inside a tick left the
tick's Redis lock (then 60 s) behind, so every tick after the restart was
skipped for a minute. The Redis lock now expires after ``TICK_LOCK_SECONDS``,
and the real mutual exclusion is a PostgreSQL advisory lock that the server
drops with the dead worker's connection.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from control.tick import ADVISORY_LOCK_ID, run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_redis_lock_of_a_killed_tick_expires_within_a_few_ticks() -> None:
    assert settings.TICK_SECONDS <= settings.TICK_LOCK_SECONDS <= 30


def other_connection() -> psycopg.Connection[Any]:
    """A second session on the test database, as another Celery worker would hold."""
    params = connection.settings_dict
    return psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        password=params["PASSWORD"] or None,
        autocommit=True,
    )


def sessions_holding_the_tick_lock() -> int:
    """How many sessions on this test database hold the tick's advisory lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks JOIN pg_database ON pg_database.oid = database"
            " WHERE datname = current_database() AND locktype = 'advisory' AND objid = %s",
            [ADVISORY_LOCK_ID],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def wait_until_no_session_holds_the_tick_lock(deadline_s: float = 10.0) -> None:
    """Wait for the server to end a closed session, as it does in its own time.

    Closing a connection only asks the server to end its session; the backend
    exits (and drops its locks) a moment later.  Under load that moment came
    after the next tick had already tried the lock (CI, 2026-12-03).
    """
    give_up = time.monotonic() + deadline_s
    while sessions_holding_the_tick_lock():
        assert time.monotonic() < give_up, "the closed session still holds the tick's lock"
        time.sleep(0.02)


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="the advisory lock is PostgreSQL's; SQLite runs write transactions one at a time",
)
def test_a_tick_skips_while_another_session_holds_the_lock_and_runs_once_it_died(
    alice: Any, acme: Any
) -> None:
    demo_cluster()
    spec = check_job_spec(tenant=acme, data={"name": "t", "workload": "mlp-digits", "gpus": 2})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    other = other_connection()
    other.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_LOCK_ID])
    try:
        assert sessions_holding_the_tick_lock() == 1
        assert run_tick(policy="fifo").ran is False  # another tick is inside its transaction
        job.refresh_from_db()
        assert job.state == "queued"
    finally:
        other.close()  # the worker dies: PostgreSQL drops its session's locks
    wait_until_no_session_holds_the_tick_lock()
    assert run_tick(policy="fifo").ran is True
    assert Job.objects.get(pk=job.pk).state == "running"
