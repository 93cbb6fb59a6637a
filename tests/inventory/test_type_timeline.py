"""The cluster view's per-type utilization over time: each job's GPUs count toward its
type (``Job.ran_on_type``) in the replay, and the series is each type's share in use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from portal.cluster_timeline import Replay, typed_series

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_job_counts_toward_its_type_and_a_retyped_job_moves_its_gpus() -> None:
    replay = Replay(types={1: "a100", 2: "h100"})
    assert replay.apply(
        [
            (1, 1, at(0), "running", 2),
            (2, 2, at(1), "running", 4),
            (3, 1, at(2), "", 4),  # scaled out on its type
            (4, 2, at(3), "completed", 0),
        ]
    )
    assert replay.typed == [
        {"a100": 2},
        {"a100": 2, "h100": 4},
        {"a100": 4, "h100": 4},
        {"a100": 4, "h100": 0},
    ]
    replay.types[1] = "h100"  # restarted on the other type: its share moves with it
    assert replay.apply([(5, 1, at(4), "", 4)])
    assert replay.typed[-1] == {"a100": 0, "h100": 4}
    series = replay.series(at(1.5), at(10), 8, {"a100": 4, "h100": 4})
    assert series["utilization_by_type"] == {
        "a100": [0.5, 1.0, 1.0, 0.0, 0.0],
        "h100": [1.0, 1.0, 0.0, 1.0, 1.0],
    }
    assert len(series["t"]) == 5


def test_an_untyped_job_counts_on_a_one_type_cluster_only() -> None:
    rows = [{"": 2}, {"": 2, "a100": 2}]
    assert typed_series(rows, {"default": 4}) == {"default": [0.5, 0.5]}
    assert typed_series(rows, {"a100": 4, "h100": 4}) == {"a100": [0.0, 0.5], "h100": [0.0, 0.0]}
    assert typed_series(rows, {"a100": 0}) == {"a100": [None, None]}
