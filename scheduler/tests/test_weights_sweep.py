"""A simulated run with a feed (scheduler.sim_feed), and an ASHA sweep fed through it (sim_sweep)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler import asha
from scheduler.policies import get_policy
from scheduler.sim_feed import FedJob
from scheduler.sim_sweep import AshaFeed, TrialShape, job_id, trial_of
from scheduler.simulator import SimConfig, SimResult, simulate
from scheduler.traces import TraceJob


class Chain:
    """A feed that answers each named job's end with the jobs given for it."""

    def __init__(self, then: dict[str, Sequence[FedJob]]) -> None:
        self.then = then
        self.calls: list[tuple[str, float]] = []

    def ended(self, job: str, now: float) -> Sequence[FedJob]:
        self.calls.append((job, now))
        return self.then.get(job, ())


def _ends(result: SimResult) -> dict[str, tuple[float, float]]:
    """Each finished job's (start, end)."""
    return {j.id: (j.start, j.end) for j in result.jobs}


def test_a_fed_job_arrives_when_it_is_fed_ahead_of_later_trace_jobs() -> None:
    trace = [TraceJob("a", 0.0, 2, 100.0), TraceJob("late", 1000.0, 2, 50.0)]
    feed = Chain({"a": [FedJob(TraceJob("b", 0.0, 2, 30.0))]})  # its submit becomes its feed time
    result = simulate(trace, get_policy("fifo"), SimConfig(total_gpus=2), feed=feed)
    ends = _ends(result)
    assert ends["b"] == (100.0, 130.0)  # not behind "late" at 1,000 s
    assert ends["late"] == (1000.0, 1050.0)
    assert [j for j, _ in feed.calls] == ["a", "b", "late"]
    assert {j.id: j.submit for j in result.jobs}["b"] == 100.0


def test_a_fed_jobs_weight_reaches_the_policy() -> None:
    # Two elastic 1-GPU jobs fed at once on 3 GPUs: the heavier one takes the idle GPU.
    trace = [TraceJob("seed", 0.0, 3, 10.0, model="resnet50")]
    fed = [
        FedJob(TraceJob("light", 0.0, 1, 1000.0, model="resnet50")),
        FedJob(TraceJob("heavy", 0.0, 1, 1000.0, model="resnet50"), weight=3.0),
    ]
    cfg = SimConfig(total_gpus=3, elastic=True, max_scale=0)
    both = _ends(simulate(trace, get_policy("elastic-tiresias"), cfg, feed=Chain({"seed": fed})))
    assert both["heavy"][1] < both["light"][1]
    plain = [FedJob(f.job) for f in fed]
    even = _ends(simulate(trace, get_policy("elastic-tiresias"), cfg, feed=Chain({"seed": plain})))
    assert even["light"][1] < even["heavy"][1]  # unweighted, view order favours the first


def _sweep(weighted: bool, trials: int = 9) -> tuple[AshaFeed, dict[str, tuple[float, float]]]:
    plan = asha.Plan(
        strategy=asha.ASHA, mode=asha.MINIMIZE, eta=3, min_steps=100, max_steps=900,
        max_trials=trials, max_running=3,
    )  # fmt: skip
    # Trial i's loss falls with steps and is lower for higher i: no curves cross.
    feed = AshaFeed(
        plan, TrialShape("resnet50", 2, 1.0), lambda i, s: 1.0 / s - i, weighted=weighted
    )
    cfg = SimConfig(total_gpus=6, elastic=weighted, max_scale=0)
    policy = get_policy("elastic-tiresias" if weighted else "tiresias")
    return feed, _ends(simulate(feed.first(), policy, cfg, feed=feed))


def test_an_asha_sweep_runs_rung_by_rung_and_ends_with_its_best_trial() -> None:
    feed, ends = _sweep(weighted=False)
    best = feed.best()
    assert best is not None and best.index == 8 and best.rung == 2  # the best curve wins
    assert feed.reached[8] == ends[job_id(8, 2)][1]
    rung_jobs = sorted(trial_of(j) for j in ends)
    assert sum(1 for _, r in rung_jobs if r == 0) == 9  # every trial ran its first rung
    assert sum(1 for _, r in rung_jobs if r == 2) < 9  # the losers stopped before the top
    # rung 1 resumes where rung 0 ended: 200 more steps at 1 s, on its 2 GPUs, not elastic
    start, end = ends[job_id(8, 1)]
    assert end - start == 200.0
    statuses = {t.status for t in feed.trials}
    assert asha.TrialStatus.STOPPED in statuses and asha.TrialStatus.COMPLETED in statuses


def _promotion_after_three(weighted: bool) -> list[FedJob]:
    """What the sweep feeds when trials 0, 1 and 2 have ended rung 0, in that order."""
    plan = asha.Plan(
        strategy=asha.ASHA, mode=asha.MINIMIZE, eta=3, min_steps=100, max_steps=900,
        max_trials=9, max_running=3,
    )  # fmt: skip
    feed = AshaFeed(
        plan, TrialShape("resnet50", 2, 1.0), lambda i, s: 1.0 / s - i, weighted=weighted
    )
    assert [j.id for j in feed.first()] == ["t000r0", "t001r0", "t002r0"]
    assert [(f.job.id, f.weight) for f in feed.ended("t000r0", 100.0)] == [("t003r0", 1.0)]
    assert [(f.job.id, f.weight) for f in feed.ended("t001r0", 100.0)] == [("t004r0", 1.0)]
    return list(feed.ended("t002r0", 100.0))


def test_a_weighted_sweep_feeds_a_promotion_at_eta_to_its_rung() -> None:
    promoted = _promotion_after_three(weighted=True)
    assert [(f.job.id, f.weight, f.job.duration) for f in promoted] == [("t002r1", 3.0, 200.0)]
    plain = _promotion_after_three(weighted=False)
    assert [(f.job.id, f.weight) for f in plain] == [("t002r1", 1.0)]
