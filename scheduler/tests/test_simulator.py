"""Simulator behaviour and seeded golden runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policies import get_policy
from scheduler.simulator import ScalingCost, SimConfig, simulate
from scheduler.throughput import MODEL_NAMES, efficiency, get_model, throughput
from scheduler.traces import TraceJob, edl_synthetic, poisson_workload


def test_one_job_runs_its_duration() -> None:
    res = simulate([TraceJob("a", 5.0, 2, 100.0)], get_policy("tiresias"), SimConfig(total_gpus=4))
    assert res.jobs[0].start == 5.0 and res.jobs[0].end == 105.0
    assert res.summary["gpu_utilization"] == pytest.approx(0.5)


def test_job_larger_than_cluster_never_starts_and_is_reported() -> None:
    res = simulate([TraceJob("a", 0.0, 8, 10.0)], get_policy("fifo"), SimConfig(total_gpus=4))
    assert res.summary["jobs"] == 0 and res.summary["unfinished"] == 1


def test_preemption_cost_lengthens_jct() -> None:
    trace = [TraceJob("long", 0.0, 4, 10_000.0), TraceJob("short", 2000.0, 4, 100.0)]
    free = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=4))
    costly = simulate(
        trace,
        get_policy("tiresias"),
        SimConfig(total_gpus=4, cost=ScalingCost("stop_resume", 40.0)),
    )
    assert free.summary["preemptions"] == 1
    end = {j.id: j.end for j in costly.jobs}
    assert end["long"] == pytest.approx({j.id: j.end for j in free.jobs}["long"] + 40.0)


def test_elastic_uses_idle_gpus_and_finishes_sooner() -> None:
    trace = [TraceJob("a", 0.0, 2, 1000.0, model="resnet50")]
    rigid = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=8))
    elastic = simulate(trace, get_policy("elastic-tiresias"), SimConfig(total_gpus=8, max_scale=4))
    assert elastic.jobs[0].end < rigid.jobs[0].end
    model = get_model("resnet50")
    assert elastic.jobs[0].end == pytest.approx(
        1000.0 * throughput(model, 2) / throughput(model, 8), rel=1e-6
    )


def test_throughput_curve_shape() -> None:
    vgg = get_model("vgg19")
    thr = [throughput(vgg, n) for n in (1, 2, 4, 8, 16, 32)]
    assert thr[1] > thr[0]
    per_gpu_gain = [(b - a) / n for a, b, n in zip(thr, thr[1:], (1, 2, 4, 8, 16), strict=False)]
    assert per_gpu_gain[-1] < per_gpu_gain[0] / 4  # diminishing returns
    effs = [efficiency(vgg, n) for n in (1, 2, 4, 8, 16, 32)]
    assert effs == sorted(effs, reverse=True)


@pytest.mark.parametrize("policy", ["fifo", "srtf", "tiresias", "elastic-tiresias"])
def test_seeded_runs_are_deterministic(policy: str) -> None:
    trace = poisson_workload(jobs=300, total_gpus=64, load=0.9, seed=7).jobs
    a = simulate(trace, get_policy(policy), SimConfig(total_gpus=64))
    b = simulate(trace, get_policy(policy), SimConfig(total_gpus=64))
    assert a.summary == b.summary
    assert a.summary["jobs"] == 300


def test_edl_synthetic_elastic_is_more_efficient_than_static() -> None:
    trace = edl_synthetic(seed=0).jobs
    static = simulate(trace, get_policy("fifo"), SimConfig(total_gpus=32))
    elastic = simulate(
        trace,
        get_policy("elastic-tiresias", waiting_threshold=0),
        SimConfig(total_gpus=32, max_scale=2, cost=ScalingCost("stop_free")),
    )
    assert elastic.summary["cluster_efficiency"] > static.summary["cluster_efficiency"]
    assert elastic.summary["makespan"] < static.summary["makespan"]
    assert elastic.summary["avg_queueing_delay"] < static.summary["avg_queueing_delay"]
    for res in (static, elastic):
        assert max(res.series["busy"]) <= 32


GOLDEN = {
    # seeded Poisson workload (300 jobs, 64 GPUs, load 0.9, seed 7): (avg JCT, makespan)
    "fifo": (4568.9216, 65887.715),
    "srtf": (3382.3882, 67279.463),
    "tiresias": (3512.5277, 67234.446),
    "elastic-tiresias": (2527.6466, 64255.5132),
}


@pytest.mark.parametrize("policy", list(GOLDEN))
def test_golden_seeded_poisson(policy: str) -> None:
    trace = poisson_workload(jobs=300, total_gpus=64, load=0.9, seed=7).jobs
    s = simulate(trace, get_policy(policy), SimConfig(total_gpus=64)).summary
    assert (s["avg_jct"], s["makespan"]) == pytest.approx(GOLDEN[policy], rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.integers(0, 500),
            st.sampled_from([1, 2, 4, 8]),
            st.integers(1, 3000),
            st.sampled_from(MODEL_NAMES),
        ),
        min_size=1,
        max_size=25,
    ),
    n_wait=st.integers(0, 4),
)
def test_elastic_never_overcommits_and_finishes_everything(
    jobs: list[tuple[int, int, int, str]], n_wait: int
) -> None:
    trace = sorted(
        (TraceJob(f"j{i}", float(t), g, float(d), model=m) for i, (t, g, d, m) in enumerate(jobs)),
        key=lambda j: j.submit,
    )
    res = simulate(
        trace,
        get_policy("elastic-tiresias", waiting_threshold=n_wait),
        SimConfig(total_gpus=16, sample_every=0.0, cost=ScalingCost("stop_free")),
    )
    assert res.summary["jobs"] == len(trace)
    assert max(res.series["busy"]) <= 16
    assert all(j.end >= j.submit for j in res.jobs)


def test_starvation_promotion_lets_a_demoted_job_run_between_newcomers() -> None:
    # "long" drops to queue 1 after 812.5 s on 4 GPUs; a stream of short jobs then
    # keeps queue 0 busy. With promotion it returns to queue 0 after waiting as long
    # as it had run, and runs again before the stream ends.
    trace = [TraceJob("long", 0.0, 4, 5000.0)] + [
        TraceJob(f"s{i}", 900.0 + i * 100, 4, 100.0) for i in range(40)
    ]
    plain = simulate(trace, get_policy("tiresias"), SimConfig(total_gpus=4))
    promoted = simulate(
        trace, get_policy("tiresias", starvation_factor=1.0), SimConfig(total_gpus=4)
    )
    long_plain = next(j for j in plain.jobs if j.id == "long")
    long_promoted = next(j for j in promoted.jobs if j.id == "long")
    assert long_plain.preemptions == 1
    assert long_promoted.preemptions > 1
    last_short = max(j.end for j in promoted.jobs if j.id != "long")
    assert last_short > max(j.end for j in plain.jobs if j.id != "long")
