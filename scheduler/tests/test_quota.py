"""Tenant quotas over one tick's decisions (pure)."""

from __future__ import annotations

from fabric.allocator import VClosAllocator
from fabric.topology import FabricSpec
from scheduler.pipeline import AllocatorBind
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


# --- growth back toward the request, and starts cut to what fits --------------------------


def test_a_job_growing_back_toward_its_request_is_checked_for_the_share_it_adds() -> None:
    """Shrunk to 2 of its 8, it may grow by the 2 GPUs of quota left, not back to 8."""
    views = {"e": running("e", (0, 1), tenant="t", requested_gpus=8, min_gpus=2)}
    book = QuotaBook(quota={"t": 6}, in_use={"t": 4})  # e's 2 and 2 of another job's
    kept, waits = enforce_quotas([Scale("e", (0, 1, 2, 3, 4, 5, 6, 7))], views, book)
    assert kept == [Scale("e", (0, 1, 2, 3))]
    assert waits == {"e": "tenant t holds 4 of its 6-GPU quota"}
    # At its quota it does not grow at all; above its request the extras do not count.
    full = QuotaBook(quota={"t": 4}, in_use={"t": 4})
    kept, waits = enforce_quotas([Scale("e", (0, 1, 2))], views, full)
    assert kept == [] and waits == {"e": "tenant t holds 4 of its 4-GPU quota"}
    small = {"s": running("s", (0, 1), tenant="t", requested_gpus=2)}
    assert enforce_quotas([Scale("s", (0, 1, 2, 3))], small, full) == (
        [Scale("s", (0, 1, 2, 3))],
        {},
    )


def test_a_shrink_frees_its_share_for_the_growth_and_starts_after_it() -> None:
    views = {
        "big": running("big", (0, 1, 2, 3), tenant="t", requested_gpus=4),
        "e": running("e", (4,), tenant="t", requested_gpus=4, min_gpus=1),
        "q": JobView("q", 1.0, 2, tenant="t"),
    }
    book = QuotaBook(quota={"t": 5}, in_use={"t": 5})
    decisions: list[Decision] = [
        Start("q", (8, 9)), Scale("e", (4, 5, 6)), Scale("big", (0, 1)),
    ]  # fmt: skip
    kept, waits = enforce_quotas(decisions, views, book)
    # 5 - 2 (big shrinks first) + 2 (q starts) = 5: e's growth, after q's start, finds none.
    assert kept == [decisions[0], decisions[2]]
    assert waits == {"e": "tenant t holds 5 of its 5-GPU quota"}
    # Without the shrink, q's start does not fit either.
    assert enforce_quotas(decisions[:2], views, book)[0] == []


def test_an_elastic_start_over_the_quota_starts_on_what_fits_from_its_minimum() -> None:
    views = {"e": JobView("e", 0.0, 8, tenant="t", min_gpus=2)}
    book = QuotaBook(quota={"t": 6}, in_use={"t": 3})
    kept, waits = enforce_quotas([Start("e", tuple(range(8)), base=0)], views, book)
    assert kept == [Start("e", (0, 1, 2), base=2)] and waits == {}  # its minimum: a fallback
    # A base within the cut stays the size it may start on; one above it gives way to the
    # minimum, and a minimum that is the cut itself leaves none.
    with_extras = [Start("e", tuple(range(10)), base=1)]
    assert enforce_quotas(with_extras, views, book)[0] == [Start("e", (0, 1, 2), base=1)]
    cut_below_base = [Start("e", tuple(range(10)), base=8)]
    assert enforce_quotas(cut_below_base, views, book)[0] == [Start("e", (0, 1, 2), base=2)]
    at_minimum = QuotaBook(quota={"t": 6}, in_use={"t": 4})
    assert enforce_quotas([Start("e", tuple(range(8)))], views, at_minimum)[0] == [
        Start("e", (0, 1))
    ]
    # Below its minimum, or a job with none (all or nothing): dropped, with the reason.
    tight = QuotaBook(quota={"t": 6}, in_use={"t": 5})
    assert enforce_quotas([Start("e", tuple(range(8)))], views, tight) == (
        [],
        {"e": "tenant t holds 5 of its 6-GPU quota"},
    )
    rigid = {"r": JobView("r", 0.0, 8, tenant="t")}
    assert enforce_quotas([Start("r", tuple(range(8)))], rigid, book)[0] == []


def test_a_cut_start_with_no_vclos_shape_binds_on_its_minimum() -> None:
    """Cut to 6 GPUs, a size no shape of this fabric has: the allocator places its base."""
    spec = FabricSpec(leaves=2, spines=2, servers_per_leaf=2, gpus_per_server=2)
    views = {"e": JobView("e", 0.0, 8, tenant="t", min_gpus=2)}
    book = QuotaBook(quota={"t": 8}, in_use={"t": 2})  # 2 held on another cluster
    kept, _ = enforce_quotas([Start("e", tuple(range(8)))], views, book)
    assert kept == [Start("e", tuple(range(6)), base=2)]
    binding, waits = AllocatorBind(spec, VClosAllocator(spec)).bind(None, kept)
    assert waits == {} and binding.refused == []
    (bound,) = binding.bound
    assert (len(bound.new_gpus), bound.planned) == (2, 6)
