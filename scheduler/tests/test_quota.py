"""Tenant quotas over one tick's decisions (pure)."""

from __future__ import annotations

from scheduler.quota import QuotaBook, enforce_quotas
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
