"""Each policy rule on small hand-built snapshots, through the pure ``schedule`` path."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.policies import REGISTRY, get_policy
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.throughput import curve
from scheduler.types import Preempt, Scale, Start


def test_registry_names() -> None:
    assert {"fifo", "srtf", "tiresias", "elastic-tiresias"} <= set(REGISTRY)
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")


def test_fifo_blocks_behind_a_head_that_does_not_fit() -> None:
    clu = cluster(busy=dict.fromkeys(range(6), "r"))
    snap = snapshot(
        10, clu, running("r", tuple(range(6))), queued("big", 4, 1), queued("small", 1, 2)
    )
    assert get_policy("fifo").schedule(snap) == []


def test_fifo_starts_in_arrival_order_on_free_gpus() -> None:
    snap = snapshot(0, cluster(), queued("a", 4, 1), queued("b", 2, 2), queued("c", 4, 3))
    decisions = get_policy("fifo").schedule(snap)
    assert [d.job for d in decisions] == ["a", "b"]
    starts = [d for d in decisions if isinstance(d, Start)]
    assert len(starts) == 2
    assert len(set(starts[0].gpus) | set(starts[1].gpus)) == 6


def test_srtf_preempts_the_longer_running_job() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "long"))
    snap = snapshot(
        5,
        clu,
        running("long", tuple(range(8)), remaining_work=1000.0),
        queued("short", 8, 4, remaining_work=10.0),
    )
    decisions = get_policy("srtf").schedule(snap)
    assert Preempt("long") in decisions
    assert Start("short", tuple(range(8))) in decisions


def test_tiresias_demoted_job_yields_to_a_new_job() -> None:
    # "old" has 4000 GPU-seconds: queue 1; the newcomer in queue 0 takes the GPUs.
    clu = cluster(busy=dict.fromkeys(range(8), "old"))
    snap = snapshot(
        100, clu, running("old", tuple(range(8)), attained_service=4000.0), queued("new", 8, 99)
    )
    decisions = get_policy("tiresias", thresholds=(3250, 7200)).schedule(snap)
    assert decisions == [Preempt("old"), Start("new", tuple(range(8)))]


def test_tiresias_same_queue_job_does_not_displace_a_running_one() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "old"))
    snap = snapshot(
        100, clu, running("old", tuple(range(8)), attained_service=100.0), queued("new", 8, 99)
    )
    assert get_policy("tiresias", thresholds=(3250, 7200)).schedule(snap) == []


def test_tiresias_first_fit_skips_a_job_that_does_not_fit() -> None:
    clu = cluster(busy=dict.fromkeys(range(4), "r"))
    snap = snapshot(9, clu, running("r", (0, 1, 2, 3)), queued("big", 8, 1), queued("small", 2, 2))
    decisions = get_policy("tiresias").schedule(snap)
    assert [type(d) for d in decisions] == [Start] and decisions[0].job == "small"


def test_tiresias_thresholds_must_increase() -> None:
    with pytest.raises(ValueError):
        get_policy("tiresias", thresholds=(7200, 3250))


def _elastic_view(id: str, gpus: tuple[int, ...], model: str = "resnet50", **kw: Any):  # type: ignore[no-untyped-def]
    return running(
        id, gpus, throughput=curve(model, 16), max_gpus=8, min_gpus=1, remaining_work=1e5, **kw
    )


def test_elastic_scales_out_onto_idle_gpus_while_gain_is_positive() -> None:
    clu = cluster(busy={0: "a", 1: "a"})
    snap = snapshot(0, clu, _elastic_view("a", (0, 1), requested_gpus=2))
    decisions = get_policy("elastic-tiresias").schedule(snap)
    assert len(decisions) == 1 and isinstance(decisions[0], Scale)
    assert len(decisions[0].gpus) == 8  # up to max_gpus: resnet50 still gains inside a server
    assert decisions[0].gpus[:2] == (0, 1)


def test_elastic_reclaims_extra_gpus_for_a_waiting_job() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "a"))
    a = _elastic_view("a", tuple(range(8)), requested_gpus=4)
    snap = snapshot(0, clu, a, queued("b", 4, 1))
    decisions = get_policy("elastic-tiresias").schedule(snap)
    shrink = [d for d in decisions if isinstance(d, Scale)]
    start = [d for d in decisions if isinstance(d, Start)]
    assert len(shrink) == 1 and len(shrink[0].gpus) == 4
    assert len(start) == 1 and start[0].job == "b" and len(start[0].gpus) == 4


def test_elastic_compacts_low_queue_jobs_when_many_wait_but_not_below_r() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "a"))
    # Everyone is in queue 1 (500 <= service < 10,000): no preemption can help the waiting jobs.
    a = _elastic_view("a", tuple(range(8)), requested_gpus=8, attained_service=600.0)
    waiting = [queued(f"w{i}", 2, float(i), attained_service=600.0) for i in range(3)]
    snap = snapshot(0, clu, a, *waiting)
    policy = get_policy("elastic-tiresias", waiting_threshold=2, r=0.5)
    decisions = policy.schedule(snap)
    scale = [d for d in decisions if isinstance(d, Scale)]
    # 3 waiting > N=2: "a" (queue 1) goes to ceil(0.5 x 8) = 4 GPUs, never fewer.
    assert len(scale) == 1 and len(scale[0].gpus) == 4
    assert sum(isinstance(d, Start) for d in decisions) == 2


def test_elastic_does_not_compact_below_the_threshold() -> None:
    clu = cluster(busy=dict.fromkeys(range(8), "a"))
    a = _elastic_view("a", tuple(range(8)), requested_gpus=8, attained_service=600.0)
    snap = snapshot(0, clu, a, queued("w0", 2, 0.0, attained_service=600.0))
    assert get_policy("elastic-tiresias", waiting_threshold=2).schedule(snap) == []


def test_elastic_never_scales_out_without_gain() -> None:
    # A flat curve: one more GPU gains nothing, so the job stays at its request.
    clu = cluster(busy={0: "a"})
    view = running(
        "a", (0,), throughput={1: 100.0, 2: 100.0, 3: 100.0}, max_gpus=3, remaining_work=10.0
    )
    assert get_policy("elastic-tiresias").schedule(snapshot(0, clu, view)) == []


def test_schedule_is_pure_and_deterministic() -> None:
    snap = snapshot(0, cluster(2), *(queued(f"j{i}", 1 + i % 3, float(i % 2)) for i in range(9)))
    policy = get_policy("tiresias")
    assert policy.schedule(snap) == policy.schedule(snap)
