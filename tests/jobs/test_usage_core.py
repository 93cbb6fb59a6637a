"""The pure core of usage accounting: held intervals, days, decay, roll-ups, ranges."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.usage import (
    Change,
    Held,
    ParallelismEvent,
    UsageRangeError,
    UsageRow,
    changes_from_events,
    check_range,
    decayed_gpu_seconds,
    held_intervals,
    roll_up,
    split_by_day,
)

T0 = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_held_seconds_follow_each_change_to_the_second() -> None:
    changes = [Change(at(0), 4), Change(at(600), 2), Change(at(1500), 0), Change(at(2000), 3)]
    held = held_intervals(changes, since=at(0), until=at(2100))
    assert held == [
        Held(at(0), at(600), 4),
        Held(at(600), at(1500), 2),
        Held(at(2000), at(2100), 3),
    ]
    assert sum(h.gpu_seconds for h in held) == 4 * 600 + 2 * 900 + 3 * 100


def test_intervals_are_clipped_to_the_range() -> None:
    changes = [Change(at(0), 4), Change(at(600), 2), Change(at(1500), 0)]
    held = held_intervals(changes, since=at(300), until=at(1000))
    assert held == [Held(at(300), at(600), 4), Held(at(600), at(1000), 2)]
    assert held_intervals(changes, since=at(1500), until=at(9000)) == []
    assert held_intervals(changes, since=at(-500), until=at(0)) == []  # nothing before the first


def test_changes_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="time order"):
        held_intervals([Change(at(10), 1), Change(at(5), 2)], since=at(0), until=at(20))


def test_the_next_events_from_is_what_was_held_and_now_counts_last() -> None:
    events = [
        ParallelismEvent(at(0), 0, 4),  # started at 4
        ParallelismEvent(at(100), 4, 3),  # a runtime claim the control plane never applied
        ParallelismEvent(at(400), 4, 2),  # scaled: it held 4 all along
    ]
    assert changes_from_events(events, current=2) == [Change(at(0), 4), Change(at(400), 2)]
    # Still running: it holds what the job row says now, after its last event.
    assert changes_from_events(events[:1], current=4) == [Change(at(0), 4)]
    assert changes_from_events([], current=0) == []


def test_a_day_boundary_splits_an_interval_in_utc() -> None:
    held = [Held(at(0), at(3 * 3600), 2)]  # 22:00 to 01:00 the next day
    assert split_by_day(held) == {date(2026, 3, 1): 2 * 7200.0, date(2026, 3, 2): 2 * 3600.0}
    # Another time zone for the same instants changes nothing.
    plus5 = held[0].start.astimezone(timezone(timedelta(hours=5)))
    assert split_by_day([Held(plus5, held[0].end, 2)]) == split_by_day(held)


def test_decay_integrates_exactly() -> None:
    half_life = 3600.0
    now = at(7200)
    # One GPU over the last half-life: H/ln2 * (1 - 1/2).
    value = decayed_gpu_seconds([Held(at(3600), now, 1)], now=now, half_life_s=half_life)
    assert value == pytest.approx(half_life / math.log(2) * 0.5, rel=1e-12)
    # The half-life before weighs half as much; seconds after now do not count.
    older = decayed_gpu_seconds([Held(at(0), at(3600), 1)], now=now, half_life_s=half_life)
    assert older == pytest.approx(value / 2, rel=1e-12)
    assert decayed_gpu_seconds([Held(now, at(9000), 8)], now=now, half_life_s=half_life) == 0
    with pytest.raises(ValueError):
        decayed_gpu_seconds([], now=now, half_life_s=0)


@given(st.integers(1, 10_000), st.integers(0, 10_000), st.integers(1, 64))
def test_a_very_long_half_life_counts_plain_seconds(length: int, age: int, gpus: int) -> None:
    now = at(length + age)
    value = decayed_gpu_seconds([Held(at(0), at(length), gpus)], now=now, half_life_s=1e12)
    assert value == pytest.approx(gpus * length, rel=1e-6)


def test_roll_up_groups_and_sums_rows() -> None:
    day1, day2 = date(2026, 3, 1), date(2026, 3, 2)
    rows = [
        UsageRow(1, "a", "acme", "alice", day1, 100.0),
        UsageRow(1, "a", "acme", "alice", day2, 50.0),
        UsageRow(2, "b", "acme", "carol", day2, 3600.0),
        UsageRow(3, "c", "globex", "bob", day1, 7.5),
    ]
    assert roll_up(rows, "tenant") == [
        {"tenant": "acme", "gpu_seconds": 3750.0, "gpu_hours": round(3750 / 3600, 6)},
        {"tenant": "globex", "gpu_seconds": 7.5, "gpu_hours": round(7.5 / 3600, 6)},
    ]
    assert [(r["day"], r["gpu_seconds"]) for r in roll_up(rows, "day")] == [
        ("2026-03-01", 107.5),
        ("2026-03-02", 3650.0),
    ]
    assert [r["user"] for r in roll_up(rows, "user")] == ["alice", "bob", "carol"]
    first = roll_up(rows, "job")[0]
    assert first == {
        "job": 1,
        "job_name": "a",
        "tenant": "acme",
        "user": "alice",
        "gpu_seconds": 150.0,
        "gpu_hours": round(150 / 3600, 6),
    }
    with pytest.raises(UsageRangeError) as refused:
        roll_up(rows, "planet")
    assert refused.value.field == "group_by"


def test_range_parsing_defaults_and_bounds() -> None:
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    assert check_range(None, None, now=now) == (now - timedelta(days=30), now)
    since, until = check_range("2026-03-01", "2026-03-02T06:00:00Z", now=now)
    assert (since, until) == (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, 6, tzinfo=UTC))
    naive, _ = check_range("2026-03-01T01:00:00", None, now=now)
    assert naive == datetime(2026, 3, 1, 1, tzinfo=UTC)
    shifted, _ = check_range("2026-03-01T05:00:00+05:00", None, now=now)
    assert shifted == datetime(2026, 3, 1, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("since", "until", "field"),
    [
        ("yesterday", None, "since"),
        (None, "2026-13-01", "until"),
        ("2026-03-05", "2026-03-01", "since"),
        ("2026-03-01", "2026-03-01", "since"),
        ("2024-01-01", "2026-01-01", "until"),
        ("2026-03-01\x00", None, "since"),
        ("9" * 500, None, "since"),
    ],
)
def test_bad_ranges_name_their_parameter(since: str | None, until: str | None, field: str) -> None:
    with pytest.raises(UsageRangeError) as refused:
        check_range(since, until, now=datetime(2026, 3, 10, tzinfo=UTC))
    assert refused.value.field == field
