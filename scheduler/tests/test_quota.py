"""Tenant quotas over one tick's decisions (pure)."""

from __future__ import annotations

from scheduler.quota import (
    Blocked,
    QuotaBook,
    QuotaRoom,
    enforce_quotas,
    quota_need,
    quota_share,
    within_quota_preemptions,
)
from scheduler.tests.builders import running
from scheduler.types import Decision, JobState, JobView, Preempt, Scale, Start


def test_starts_over_quota_are_dropped_and_preemptions_free_their_share() -> None:
    views = {
        "old": JobView("old", 0.0, 4, tenant="t", gpus=(0, 1, 2, 3), state=JobState.RUNNING),
        "a": JobView("a", 1.0, 4, tenant="t"),
        "b": JobView("b", 2.0, 4, tenant="t"),
        "grow": JobView("grow", 0.0, 2, tenant="u", gpus=(4, 5), state=JobState.RUNNING),
    }
    book = QuotaBook(quota={"t": 8, "u": 2}, in_use={"t": 8, "u": 2})
    decisions: list[Decision] = [Start("a", (6, 7, 8, 9)), Preempt("old"), Start("b", (10, 11, 12, 13)),
                 Scale("grow", (4, 5, 14))]  # fmt: skip
    kept, dropped = enforce_quotas(decisions, views, book)
    assert kept == [decisions[0], decisions[1], decisions[3]]  # growth is not a start
    assert dropped == {"b": "tenant t holds 8 of its 8-GPU quota"}
    assert book.in_use == {"t": 8, "u": 2}  # the book itself is not changed


# --- preemption within a tenant's quota (issue 37) ---------------------------------------


def test_a_higher_class_preempts_its_own_tenants_lower_class_job_to_fit_its_quota() -> None:
    low = running("low", tuple(range(8)), tenant="a", priority=10, queue_since=5.0)
    book = QuotaBook(quota={"a": 8}, in_use={"a": 8})
    high = Blocked(job="high", tenant="a", priority=90, need=4)
    room = within_quota_preemptions([high], [low], book)
    assert room.preempts == [Preempt("low")] and room.stopped_for == {"low": "high"}
    assert "low" in room.waits["high"] and "8-GPU quota" in room.waits["high"]


def test_never_the_same_class_another_tenant_or_more_than_needed() -> None:
    jobs = [
        running("same", (0, 1), tenant="a", priority=90, queue_since=1.0),
        running("other", (2, 3, 4, 5), tenant="b", priority=10, queue_since=1.0),
        running("old-low", (6, 7), tenant="a", priority=10, queue_since=1.0),
        running("new-low", (8, 9), tenant="a", priority=20, queue_since=9.0),
        running("normal", (10, 11), tenant="a", priority=50, queue_since=9.0),
    ]
    book = QuotaBook(quota={"a": 8, "b": 8}, in_use={"a": 8, "b": 4})
    # 2 GPUs of quota are needed: one low job, the most recently started, goes.
    room = within_quota_preemptions([Blocked("high", "a", 90, 2)], jobs, book)
    assert room.preempts == [Preempt("new-low")]
    # A normal job may take from low ones only, and never from its own class.
    room = within_quota_preemptions([Blocked("n", "a", 60, 4)], jobs, book)
    assert room.preempts == [Preempt("new-low"), Preempt("old-low")]
    # Not enough below it to fit: nothing is preempted for nothing.
    nothing = QuotaRoom()
    assert within_quota_preemptions([Blocked("n", "a", 60, 6)], jobs, book) == nothing
    # A low job preempts nobody; a job of a tenant with no quota rule neither.
    assert within_quota_preemptions([Blocked("l", "a", 10, 2)], jobs, book) == nothing
    assert within_quota_preemptions([Blocked("x", "c", 90, 2)], jobs, book) == nothing


def test_two_blocked_jobs_do_not_count_one_victim_twice() -> None:
    jobs = [running("low", (0, 1, 2, 3), tenant="a", priority=10, queue_since=1.0)]
    book = QuotaBook(quota={"a": 4}, in_use={"a": 4})
    room = within_quota_preemptions(
        [Blocked("h1", "a", 90, 4), Blocked("h2", "a", 90, 4)], jobs, book
    )
    assert room.preempts == [Preempt("low")] and set(room.waits) == {"h1"}


def test_the_hold_back_rule_counts_what_a_job_holds_up_to_its_request() -> None:
    book = QuotaBook(quota={"a": 4})
    book.count("a", 6, 2)  # 6 held, 2 asked for: 4 of them are idle extras
    book.count("a", 1, 4)  # growing: it holds 1 of its 4
    assert book.in_use == {"a": 3}
    assert book.hold_reason("a", 1) is None
    assert book.hold_reason("a", 2) == "tenant a holds 3 of its 4-GPU quota"
    assert book.hold_reason("no-quota", 100) is None  # a tenant with no quota: no rule
    assert (quota_share(6, 2), quota_share(1, 4)) == (2, 1)
    assert (quota_need(2, 8), quota_need(0, 8)) == (2, 8)  # its minimum, else its request
