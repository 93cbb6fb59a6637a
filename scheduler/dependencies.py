"""When a job's dependencies let it start (pure): the rule the control plane applies to a
pending job and the forecast applies to its virtual clock.

A dependency names another job (or every task of an array) and a kind::

    kind           met when it ends     never met when it ends
    after_ok       completed            failed, cancelled
    after_any      completed, failed,   (always met once it ends)
                   cancelled
    after_failed   failed               completed, cancelled

A dependency on an array is met when every task meets it, and never met as
soon as one task never will.  A job starts when all its dependencies are met;
it is cancelled as soon as one can no longer be.  Jobs' ends are the strings of
``jobs.choices.JobState`` ("completed", "failed", "cancelled"); ``None`` is a
job that has not ended.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

AFTER_OK = "after_ok"
AFTER_ANY = "after_any"
AFTER_FAILED = "after_failed"
KINDS = (AFTER_OK, AFTER_ANY, AFTER_FAILED)

COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
ENDS = frozenset({COMPLETED, FAILED, CANCELLED})

_MEETS: Mapping[str, frozenset[str]] = {
    AFTER_OK: frozenset({COMPLETED}),
    AFTER_ANY: ENDS,
    AFTER_FAILED: frozenset({FAILED}),
}


class Outcome(enum.Enum):
    """Where one dependency, or all of a job's, stands."""

    MET = "met"
    WAITING = "waiting"
    NEVER = "never"


def outcome(kind: str, end: str | None) -> Outcome:
    """Where a dependency of ``kind`` stands on a job whose end is ``end`` (None: running,
    queued or waiting); ValueError for an unknown kind."""
    if kind not in _MEETS:
        raise ValueError(f"unknown dependency kind {kind!r}")
    if end not in ENDS:
        return Outcome.WAITING
    return Outcome.MET if end in _MEETS[kind] else Outcome.NEVER


def outcome_of_all(kind: str, ends: Iterable[str | None]) -> Outcome:
    """Where a dependency of ``kind`` on several jobs (an array's tasks) stands: never as soon
    as one never meets it, met when every one does (an empty array: met)."""
    waiting = False
    for end in ends:
        result = outcome(kind, end)
        if result is Outcome.NEVER:
            return Outcome.NEVER
        waiting = waiting or result is Outcome.WAITING
    return Outcome.WAITING if waiting else Outcome.MET


def combined(outcomes: Iterable[Outcome]) -> Outcome:
    """A job's standing from its dependencies': never if one is, met if all are."""
    waiting = False
    for result in outcomes:
        if result is Outcome.NEVER:
            return Outcome.NEVER
        waiting = waiting or result is Outcome.WAITING
    return Outcome.WAITING if waiting else Outcome.MET


def find_cycle(waits_for: Mapping[str, Iterable[str]], start: str) -> tuple[str, ...] | None:
    """A path ``start → ... → start`` along ``waits_for`` (job → the jobs it waits for), or
    None when no chain of dependencies from ``start`` comes back to it."""
    stack: list[tuple[str, tuple[str, ...]]] = [(start, (start,))]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in waits_for.get(node, ()):
            if nxt == start:
                return (*path, start)
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, (*path, nxt)))
    return None


__all__ = [
    "AFTER_ANY",
    "AFTER_FAILED",
    "AFTER_OK",
    "KINDS",
    "Outcome",
    "combined",
    "find_cycle",
    "outcome",
    "outcome_of_all",
]
