"""The what-if page speaks in names and moves with simulated time (issue 19, item 9)."""

from __future__ import annotations

from typing import Any

import pytest

from portal import whatif
from portal.whatif import compare, run_label, run_title, simulated_horizon
from scheduler.traces import TraceJob

TRACE = tuple(
    TraceJob(id=f"j{i}", submit=600.0 * i, gpus=1 + i % 4, duration=3600.0 + 300 * i)
    for i in range(40)
)
PARAMS: dict[str, Any] = {
    "policies": ["fifo", "tiresias"],
    "placements": ["count"],
    "total_gpus": 8,
    "gpus_per_server": 4,
    "leaves": 2,
    "elastic": False,
}


def test_rows_and_headings_use_names_not_keys() -> None:
    assert run_label("tiresias", "count") == "Tiresias"
    assert run_label("fifo", "vclos") == "FIFO on vClos"
    assert run_title(PARAMS) == "FIFO vs Tiresias"
    assert run_title({**PARAMS, "placements": ["count", "ecmp"]}) == (
        "FIFO vs Tiresias (GPU count, ECMP)"
    )
    assert "count" not in run_title(PARAMS)


def test_progress_moves_with_simulated_time_within_each_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(whatif, "PROGRESS_EVERY_S", 0.0)  # every scheduling pass reports
    heard: list[tuple[float, str]] = []
    report = compare(TRACE, PARAMS, lambda fraction, words: heard.append((fraction, words)))
    fractions = [f for f, _ in heard]
    assert fractions == sorted(fractions), "the bar never goes back"
    # within the first run (of two) the bar moves, not only at its start and end
    inside_first = [f for f in fractions if 0 < f < 0.5]
    assert len(set(inside_first)) > 5
    assert max(fractions) < 1.0  # full only when the report is in
    assert any("h of about" in words and "FIFO (1 of 2)" in words for _, words in heard)
    assert [r["label"] for r in report["results"]] == ["FIFO", "Tiresias"]
    assert [r["policy"] for r in report["results"]] == ["fifo", "tiresias"]  # keys unchanged


def test_the_horizon_covers_arrivals_and_work() -> None:
    # the last job arrives at 23 400 s and runs 15 300 s; 40 jobs' GPU-seconds over 8 GPUs less
    assert simulated_horizon(TRACE, 8) == pytest.approx(
        max(23_400 + 15_300, sum(j.gpus * j.duration for j in TRACE) / 8)
    )
    assert simulated_horizon((), 8) == 1.0
