"""A transaction PostgreSQL aborts to break a deadlock runs again (``utilities.deadlocks``).

Two threads lock two tenant rows in opposite orders, each holding its first
lock until the other has its own: a real deadlock.  The side under test has
the short ``deadlock_timeout``, so it is the one PostgreSQL aborts.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from tenancy.models import Tenant
from utilities.deadlocks import atomic_retrying, is_deadlock

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's deadlocks"),
]


def lock(pk: int) -> None:
    list(Tenant.objects.select_for_update().filter(pk=pk).values_list("pk"))


def crossed(attempts: int) -> tuple[list[int], list[BaseException]]:
    """Run the crossed lockers; return the tested side's attempts and any thread's error."""
    first = Tenant.objects.create(slug="first", name="first")
    second = Tenant.objects.create(slug="second", name="second")
    both_hold = threading.Barrier(2, timeout=10)
    tries: list[int] = []
    errors: list[BaseException] = []

    def other() -> None:  # first, then second; never the one aborted
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL deadlock_timeout = '5s'")
                lock(first.pk)
                both_hold.wait()
                lock(second.pk)
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            connection.close()

    @atomic_retrying(attempts)
    def tested() -> None:  # second, then first
        tries.append(len(tries) + 1)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL deadlock_timeout = '100ms'")
        lock(second.pk)
        if len(tries) == 1:
            both_hold.wait()
        lock(first.pk)

    def run_tested() -> None:
        try:
            tested()
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=other), threading.Thread(target=run_tested)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return tries, errors


def test_the_side_aborted_by_a_deadlock_runs_again_and_commits() -> None:
    tries, errors = crossed(attempts=3)
    assert errors == []
    assert tries == [1, 2]


def test_without_a_second_attempt_the_deadlock_is_raised() -> None:
    tries, errors = crossed(attempts=1)
    assert tries == [1]
    assert len(errors) == 1 and isinstance(errors[0], OperationalError)
    assert is_deadlock(errors[0])


def test_inside_a_callers_transaction_nothing_is_retried() -> None:
    calls: list[int] = []

    @atomic_retrying(3)
    def aborted() -> Any:
        calls.append(1)
        raise OperationalError("deadlock detected") from _deadlock()

    with pytest.raises(OperationalError), transaction.atomic():
        aborted()
    assert calls == [1]


def _deadlock() -> BaseException:
    error = Exception("deadlock detected")
    error.sqlstate = "40P01"  # type: ignore[attr-defined]
    return error
