"""Throughput curves the live policy sees (pure)."""

from __future__ import annotations

import pytest

from scheduler.curves import (
    SpeedTables,
    policy_curve,
    record_measurement,
    relative_speeds,
    view_speeds,
)
from scheduler.placement import CountPlacement
from scheduler.policies import get_policy
from scheduler.tests.builders import cluster, queued, running, snapshot


def test_measurements_are_a_running_average_per_size() -> None:
    curve = record_measurement({}, 2, 100.0)
    assert curve == {"2": 100.0}
    curve = record_measurement(curve, 2, 200.0, weight=0.25)
    assert curve == {"2": 125.0}
    curve = record_measurement(curve, 4, 150.0)
    assert record_measurement(curve, 0, 5.0) == curve == {"2": 125.0, "4": 150.0}
    assert record_measurement(curve, 3, -1.0) == curve


def test_profile_beats_measurement_beats_the_linear_prior() -> None:
    assert dict(policy_curve({}, {}, 3)) == {1: 1.0, 2: 2.0, 3: 3.0}
    curve = policy_curve({2: 90.0}, {2: 200.0, 4: 100.0}, 6)
    assert curve[2] == 90.0  # the profile wins
    assert curve[1] == pytest.approx(45.0)  # below the smallest known: scaled from it
    assert curve[3] == pytest.approx(95.0)  # between known sizes: interpolated
    assert curve[6] == pytest.approx(150.0)  # above: linear from the largest measured


def test_speed_tables_remember_a_curve_object_and_forget_unused_ones() -> None:
    measured = policy_curve({}, {2: 200.0, 4: 300.0}, 6)
    prior = policy_curve({}, {}, 6)
    tables = SpeedTables()
    first = tables.table(measured, 2, 6)
    assert first == view_speeds(measured, 2, 6) == relative_speeds(measured, 2, 6)
    assert tables.table(measured, 2, 6) is first  # the same curve object: made once
    assert tables.table(dict(measured), 2, 6) is not first  # an equal copy is another curve
    assert tables.table(measured, 4, 6) == view_speeds(measured, 4, 6)  # another request
    assert tables.table(prior, 1, 8) == view_speeds(prior, 1, 8)
    tables.sweep()  # every entry was used since the last sweep
    assert len(tables) == 4
    assert tables.table(prior, 1, 8) is tables.table(prior, 1, 8)
    tables.sweep()  # only the prior's table was used since
    assert len(tables) == 1


def test_a_pass_with_speed_tables_decides_what_a_pass_without_decides() -> None:
    curve = policy_curve({}, {1: 100.0, 2: 180.0, 3: 200.0}, 8)
    jobs = [
        running("a", (0, 1), submit=0.0, min_gpus=1, max_gpus=8, throughput=curve),
        running("b", (2,), submit=1.0, min_gpus=1, max_gpus=4, throughput=curve),
        queued("c", 2, submit=2.0, min_gpus=1, max_gpus=6, throughput=policy_curve({}, {}, 6)),
    ]
    snap = snapshot(10.0, cluster(1, 8, busy={0: "a", 1: "a", 2: "b"}), *jobs)
    policy = get_policy("elastic-tiresias")
    tables = SpeedTables()
    plain = policy.schedule(snap, placement=CountPlacement())
    assert plain  # something to compare: the idle GPUs are handed out
    for _ in range(3):  # memo filled, then hit
        assert policy.schedule(snap, placement=CountPlacement(), speeds=tables) == plain
        tables.sweep()
    assert len(tables) == 3
