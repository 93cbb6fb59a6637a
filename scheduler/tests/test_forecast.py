"""The forecast on small hand-built snapshots: predicted starts, finishes, queue order."""

from __future__ import annotations

import pytest

from scheduler.forecast import (
    BEYOND_HORIZON,
    NEVER_FITS,
    UNKNOWN_WORK,
    WAITS_ON_UNKNOWN,
    forecast,
)
from scheduler.policies import get_policy
from scheduler.tests.builders import cluster, queued, running, snapshot


def test_a_queued_job_starts_when_the_running_one_finishes() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "r"))
    snap = snapshot(
        100.0,
        clu,
        running("r", tuple(range(8)), remaining_work=300.0),
        queued("q", 8, submit=50.0, remaining_work=120.0),
    )
    result = forecast(snap, get_policy("fifo"))
    assert result.estimates["r"].start is None  # running: already started
    assert result.estimates["r"].finish == pytest.approx(300.0)
    assert result.estimates["q"].start == pytest.approx(300.0)
    assert result.estimates["q"].finish == pytest.approx(420.0)
    assert result.order == ("q",)


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "elastic-tiresias"])
def test_every_production_policy_predicts_the_start_behind_a_full_cluster(policy: str) -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "r"))
    snap = snapshot(
        0.0,
        clu,
        running("r", tuple(range(8)), remaining_work=200.0, attained_service=100_000.0),
        queued("q", 8, submit=1.0, remaining_work=50.0, attained_service=100_000.0),
    )
    estimate = forecast(snap, get_policy(policy)).estimates["q"]
    assert estimate.start is not None and estimate.finish is not None
    assert estimate.finish - estimate.start == pytest.approx(50.0)


def test_unknown_remaining_work_gives_no_finish_and_blocks_the_start_behind_it() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "r"))
    snap = snapshot(
        0.0, clu, running("r", tuple(range(8))), queued("q", 8, submit=1.0, remaining_work=10.0)
    )
    result = forecast(snap, get_policy("fifo"), horizon_s=3600.0)
    assert result.estimates["r"].finish is None
    assert result.estimates["r"].reason == UNKNOWN_WORK
    assert result.estimates["q"].start is None
    assert result.estimates["q"].reason == WAITS_ON_UNKNOWN


def test_a_queued_job_of_unknown_work_still_gets_its_start() -> None:
    clu = cluster(busy=dict.fromkeys(range(4), "r"))
    snap = snapshot(
        0.0, clu, running("r", (0, 1, 2, 3), remaining_work=60.0), queued("q", 8, submit=1.0)
    )
    estimate = forecast(snap, get_policy("fifo")).estimates["q"]
    assert estimate.start == pytest.approx(60.0)
    assert estimate.finish is None and estimate.reason == UNKNOWN_WORK


def test_a_job_larger_than_the_cluster_is_said_to_never_fit() -> None:
    snap = snapshot(0.0, cluster(), queued("huge", 16, remaining_work=10.0))
    result = forecast(snap, get_policy("fifo"))
    assert result.estimates["huge"].start is None
    assert result.estimates["huge"].reason == NEVER_FITS
    assert result.passes == 1  # nothing runs and nothing changed: no pointless stepping


def test_the_horizon_bounds_the_forecast() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "r"))
    snap = snapshot(
        0.0,
        clu,
        running("r", tuple(range(8)), remaining_work=10_000.0),
        queued("q", 8, submit=1.0, remaining_work=10.0),
    )
    result = forecast(snap, get_policy("fifo"), horizon_s=1000.0)
    assert result.horizon_reached
    assert result.estimates["q"].start is None and result.estimates["q"].reason == BEYOND_HORIZON
    assert result.estimates["r"].reason == BEYOND_HORIZON


def test_a_faster_curve_finishes_sooner_on_more_gpus() -> None:
    curve = {n: float(n) for n in range(1, 9)}  # linear: twice the GPUs, twice the pace
    clu = cluster(busy=dict.fromkeys(range(8), "r"))
    snap = snapshot(
        0.0,
        clu,
        running("r", tuple(range(8)), requested_gpus=4, remaining_work=100.0, throughput=curve),
    )
    assert forecast(snap, get_policy("fifo")).estimates["r"].finish == pytest.approx(50.0)


def test_queue_order_is_the_policys_even_where_a_later_job_starts_sooner() -> None:
    # Tiresias considers "early" first; first fit lets the small "late" job start on the
    # 2 free GPUs meanwhile.  Positions show the policy's order; estimates show the starts.
    clu = cluster(busy=dict.fromkeys(range(6), "r"))
    snap = snapshot(
        0.0,
        clu,
        running("r", tuple(range(6)), remaining_work=500.0),
        queued("early", 8, submit=1.0, remaining_work=10.0),
        queued("late", 2, submit=2.0, remaining_work=10.0),
    )
    result = forecast(snap, get_policy("tiresias"))
    assert result.estimates["late"].start == pytest.approx(0.0)
    assert result.estimates["early"].start == pytest.approx(500.0)
    assert result.order == ("early", "late")


def test_quota_holds_a_job_until_its_tenant_has_room() -> None:
    clu = cluster()
    snap = snapshot(
        0.0,
        clu,
        running("a", (0, 1, 2, 3), tenant="t", remaining_work=100.0),
        queued("b", 4, submit=1.0, tenant="t", remaining_work=10.0),
    )
    free = forecast(snap, get_policy("fifo"))
    assert free.estimates["b"].start == pytest.approx(0.0)  # 4 GPUs are free
    held = forecast(snap, get_policy("fifo"), quota={"t": 4})
    assert held.estimates["b"].start == pytest.approx(100.0)  # only after "a" leaves the quota


def test_bad_parameters_are_refused() -> None:
    snap = snapshot(0.0, cluster())
    with pytest.raises(ValueError, match="forecast needs"):
        forecast(snap, get_policy("fifo"), step_s=0.0)
    with pytest.raises(ValueError, match="forecast needs"):
        forecast(snap, get_policy("fifo"), max_passes=0)


def test_a_las_demotion_is_placed_to_the_second() -> None:
    # Tiresias' queues are cut at 3250 and 7200 GPU-seconds. "long" on 8 GPUs reaches
    # 7200 at t = 900 s and drops below "next" (queue 1, waiting): "next" starts then.
    clu = cluster(busy=dict.fromkeys(range(8), "long"))
    snap = snapshot(
        0.0,
        clu,
        running("long", tuple(range(8)), remaining_work=10_000.0),
        queued("next", 8, submit=1.0, remaining_work=100.0, attained_service=5000.0),
    )
    result = forecast(snap, get_policy("tiresias"))
    start = result.estimates["next"].start
    assert start is not None and abs(start - 900.0) <= 1.0
    finish = result.estimates["long"].finish  # preempted for the 100 s of "next"
    assert finish is not None and abs(finish - 10_100.0) <= 2.0
    coarse = forecast(snap, get_policy("tiresias"), step_s=600.0, max_step_s=600.0)
    coarse_start = coarse.estimates["next"].start
    assert coarse_start is not None and abs(coarse_start - 900.0) <= 1.0  # not at 1200


def test_a_higher_class_blocked_by_its_tenants_quota_is_predicted_to_start_at_once() -> None:
    """Issue 37: the forecast runs the tick's quota step, preemption within a tenant
    included, so the high job's start is the next pass's, not the low job's end."""
    clu = cluster(busy=dict.fromkeys(range(8), "low"))
    snap = snapshot(
        0.0,
        clu,
        running("low", tuple(range(8)), tenant="t", priority=10, remaining_work=86_400.0),
        queued("high", 4, submit=1.0, tenant="t", priority=90, remaining_work=600.0),
    )
    estimate = forecast(snap, get_policy("tiresias"), quota={"t": 8}).estimates["high"]
    assert estimate.start is not None and estimate.start <= 120.0
