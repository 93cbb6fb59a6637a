"""Throughput curves the live policy sees (pure)."""

from __future__ import annotations

import pytest

from scheduler.curves import policy_curve, record_measurement


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
