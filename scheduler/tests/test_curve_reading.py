"""Reading throughput curves: speedup, per-GPU efficiency, relative speeds (one home for all)."""

from __future__ import annotations

import pytest

from scheduler.curves import gpu_efficiency, relative_speeds, speedup

CURVE = {"1": 100.0, "2": 180.0, "4": 300.0}


def test_speedup_interpolates_and_extends_linearly() -> None:
    assert speedup(CURVE, 2) == pytest.approx(1.8)
    assert speedup(CURVE, 3) == pytest.approx(2.4)  # halfway between 1.8 and 3.0
    assert speedup(CURVE, 8) == pytest.approx(6.0)  # 4-GPU per-GPU rate, extended
    assert speedup(None, 5) == 5.0 and speedup(CURVE, 0) == 0.0
    assert speedup({2: 200.0, 4: 300.0}, 4) == pytest.approx(3.0)  # thr(1) from the 2-GPU point


def test_gpu_efficiency_prefers_the_measurement() -> None:
    assert gpu_efficiency(CURVE, 4, None) == 0.75
    assert gpu_efficiency(CURVE, 4, 200.0) == 0.5
    assert gpu_efficiency(CURVE, 4, 900.0) == 1.0  # capped
    assert gpu_efficiency({}, 4, 200.0) is None


def test_relative_speeds_hold_the_last_known_size() -> None:
    speeds = relative_speeds({1: 100.0, 2: 180.0, 4: 300.0}, 2, 5)
    assert speeds == pytest.approx([0.0, 100 / 180, 1.0, 1.0, 300 / 180, 300 / 180])
    assert relative_speeds({4: 300.0}, 2, 4) == pytest.approx([0.0, 0.0, 0.0, 0.0, 1.0])
