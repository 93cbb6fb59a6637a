"""The forecast holds a job back until the jobs it waits for have finished (pure): its
predicted start follows their predicted finish, through chains, with GPUs to spare."""

from __future__ import annotations

import pytest

from scheduler.dependencies import Outcome, combined, find_cycle, outcome, outcome_of_all
from scheduler.forecast import forecast
from scheduler.pipeline import DependencyHoldBack, QuotaHoldBack
from scheduler.policies.fifo import FifoPolicy
from scheduler.tests.builders import cluster, queued, running, snapshot


def test_a_dependent_job_starts_when_its_dependency_finishes_not_when_gpus_are_free() -> None:
    snap = snapshot(
        0.0,
        cluster(busy=dict.fromkeys(range(4), "a")),
        running("a", tuple(range(4)), remaining_work=100.0),
        queued("b", 2, submit=1.0, remaining_work=50.0),
        queued("c", 2, submit=2.0, remaining_work=10.0),
        queued("free", 2, submit=3.0, remaining_work=10.0),
    )
    waits = {"b": frozenset({"a"}), "c": frozenset({"b"})}
    result = forecast(snap, FifoPolicy(), waits_for=waits)
    assert result.estimates["free"].start == 0.0  # GPUs were free: only dependents wait
    assert result.estimates["b"].start == pytest.approx(100.0, abs=1.0)
    assert result.estimates["c"].start == pytest.approx(150.0, abs=1.0)
    assert result.estimates["c"].finish == pytest.approx(160.0, abs=1.0)
    unconstrained = forecast(snap, FifoPolicy())
    assert unconstrained.estimates["b"].start == 0.0


def test_a_job_waiting_for_a_job_that_never_finishes_gets_no_start() -> None:
    snap = snapshot(
        0.0,
        cluster(busy=dict.fromkeys(range(4), "a")),
        running("a", tuple(range(4))),  # remaining work unknown
        queued("b", 2, submit=1.0, remaining_work=50.0),
    )
    result = forecast(snap, FifoPolicy(), waits_for={"b": frozenset({"a"})})
    assert result.estimates["b"].start is None and result.estimates["b"].reason


def test_the_hold_back_step_says_why_and_passes_the_rest_on() -> None:
    snap = snapshot(0.0, cluster(), queued("a", 1), queued("b", 1), queued("c", 1))
    step = DependencyHoldBack(QuotaHoldBack(None), {"b": frozenset({"a"}), "c": frozenset({"z"})})
    candidates, waits = step.hold_back(snap)
    assert [v.id for v in candidates.snapshot.jobs] == ["a", "c"]  # z has ended: c may start
    assert waits == {"b": "waits for a to end"}


@pytest.mark.parametrize(
    ("kind", "end", "expected"),
    [
        ("after_ok", "completed", Outcome.MET),
        ("after_ok", "failed", Outcome.NEVER),
        ("after_ok", "cancelled", Outcome.NEVER),
        ("after_ok", None, Outcome.WAITING),
        ("after_any", "failed", Outcome.MET),
        ("after_any", "cancelled", Outcome.MET),
        ("after_failed", "failed", Outcome.MET),
        ("after_failed", "completed", Outcome.NEVER),
        ("after_failed", "cancelled", Outcome.NEVER),
    ],
)
def test_the_rule_of_one_dependency(kind: str, end: str | None, expected: Outcome) -> None:
    assert outcome(kind, end) is expected


def test_an_array_meets_a_dependency_when_every_task_does() -> None:
    assert outcome_of_all("after_ok", ["completed", None]) is Outcome.WAITING
    assert outcome_of_all("after_ok", ["completed", "completed"]) is Outcome.MET
    assert outcome_of_all("after_ok", [None, "failed"]) is Outcome.NEVER
    assert combined([Outcome.MET, Outcome.WAITING]) is Outcome.WAITING
    assert combined([Outcome.WAITING, Outcome.NEVER]) is Outcome.NEVER
    with pytest.raises(ValueError):
        outcome("after_soon", None)


def test_find_cycle() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}, "a") == ("a", "b", "c", "a")
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}, "a") is None
    assert find_cycle({}, "a") is None
