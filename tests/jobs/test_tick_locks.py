"""A tick killed mid-way never stalls scheduling; two ticks never overlap.

The fault suite found that a Celery worker SIGKILLed inside a tick left the
tick's Redis lock (then 60 s) behind, so every tick after the restart was
skipped for a minute. The Redis lock now expires after ``TICK_LOCK_SECONDS``,
and the real mutual exclusion is a PostgreSQL advisory lock that the server
drops with the dead worker's connection.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs.control.tick import ADVISORY_LOCK_ID, run_tick
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
        assert run_tick(policy="fifo").ran is False  # another tick is inside its transaction
        job.refresh_from_db()
        assert job.state == "queued"
    finally:
        other.close()  # the worker dies: PostgreSQL drops its session's locks
    assert run_tick(policy="fifo").ran is True
    assert Job.objects.get(pk=job.pk).state == "running"
