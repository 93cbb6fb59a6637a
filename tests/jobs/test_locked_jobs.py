"""The tick's locked read of the jobs it writes gives the objects the ORM's query gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Model
from django.test.utils import CaptureQueriesContext

from control.locked_jobs import locked_jobs
from jobs.models import Job
from tests.jobs.test_programs import submit_program
from tests.jobs.test_tick_incremental import submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def store(tmp_path: Path, settings: Any) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path / 'artifacts'}"


def values(instance: Model | None) -> dict[str, Any] | None:
    if instance is None:
        return None
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def test_the_jobs_with_their_tenant_and_code_as_the_orm_loads_them(alice: Any, acme: Any) -> None:
    built_in = submit(alice, acme, gpus=2, lo=1, hi=4)
    program = submit_program(alice, acme, "torchrun", lo=1, hi=2, gpus=2)
    Job.objects.filter(pk=built_in.pk).update(args={"epochs": 3}, allocation={"gpus": [1, 2]})
    ids = [program.pk, built_in.pk, 10**9]  # in no order, one gone
    with transaction.atomic():
        expected = list(
            Job.objects.select_for_update(of=("self",))
            .select_related("tenant", "code")
            .filter(pk__in=ids)
            .order_by("pk")
        )
        got = locked_jobs(ids)
        assert [job.pk for job in got] == [job.pk for job in expected]  # id order
        with CaptureQueriesContext(connection) as queries:
            for mine, theirs in zip(got, expected, strict=True):
                assert values(mine) == values(theirs)
                assert values(mine.tenant) == values(theirs.tenant)
                assert values(mine.code) == values(theirs.code)
        assert not queries.captured_queries  # tenant and code came with the rows
    assert got[1].code is not None and got[0].code is None
    assert got[0].args == {"epochs": 3} and got[0].allocation == {"gpus": [1, 2]}  # JSON parsed
    assert not got[0]._state.adding and got[0]._state.db == connection.alias


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the statement is PostgreSQL's")
def test_the_rows_are_locked_until_the_transaction_ends(alice: Any, acme: Any) -> None:
    job = submit(alice, acme, gpus=1, lo=1, hi=1)
    with transaction.atomic():
        locked_jobs([job.pk])
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = %s AND l.pid = pg_backend_pid() AND l.mode = 'RowShareLock'",
                [Job._meta.db_table],
            )
            assert cursor.fetchone() == (1,)
