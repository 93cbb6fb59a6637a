"""Run a transaction again when PostgreSQL broke a deadlock by aborting it.

Two transactions that lock the same rows in opposite orders wait for each
other; after ``deadlock_timeout`` PostgreSQL aborts one of them (SQLSTATE
``40P01``) and the other goes on.  Where the orders cannot be made the same
(a job's end locks its row first, as the report handler must, and then its
sweep; a person's cancel locks the sweep's jobs and the sweep), the aborted
side is run again from the start: everything it did was rolled back, so a new
attempt sees the winner's committed work and decides afresh::

    @atomic_retrying()
    def do_cancel_sweep(...): ...     one transaction; aborted by a deadlock: again

Only an outermost transaction is retried: inside another one the abort
belongs to the caller's transaction, which is raised as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import OperationalError, transaction

P = ParamSpec("P")
R = TypeVar("R")

DEADLOCK_SQLSTATE = "40P01"
"""PostgreSQL's code for a transaction aborted to break a deadlock."""


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's wrapper or the driver's error below it) is a broken deadlock."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) == DEADLOCK_SQLSTATE:
            return True
        seen = seen.__cause__
    return False


def atomic_retrying(attempts: int = 3) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the function in ``transaction.atomic()``, up to ``attempts`` times while a
    deadlock aborts it (outermost transactions only; see the module docstring)."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            outermost = not transaction.get_connection().in_atomic_block
            for attempt in range(1, attempts + 1):
                try:
                    with transaction.atomic():
                        return func(*args, **kwargs)
                except OperationalError as exc:
                    if not (outermost and attempt < attempts and is_deadlock(exc)):
                        raise
            raise AssertionError("unreachable: the last attempt returns or raises")

        return run

    return wrap
