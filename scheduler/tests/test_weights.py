"""Job weights in Elastic-Tiresias: heavier jobs take idle GPUs first, lighter ones give extras back first.

Each test is built so that without weights the tie-breaks (view order) pick
the other job: it fails if the weight is not read.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from scheduler.placement import CountPlacement
from scheduler.policies.elastic import ElasticTiresiasPolicy, WeightRule
from scheduler.policies.kept import KeptPolicy
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.tests.test_kept_core import World
from scheduler.types import Decision, JobView, Scale, Start

#: Marginal gains 90, 80, 60, 30, then nothing: flat after 5 GPUs.
CURVE = {1: 100.0, 2: 190.0, 3: 270.0, 4: 330.0, 5: 360.0, 6: 360.0, 7: 360.0, 8: 360.0}

RULES = list(WeightRule)


def _sizes(decisions: list[Decision]) -> dict[str, int]:
    """Job -> GPUs after the decisions that start or resize it."""
    return {d.job: len(d.gpus) for d in decisions if isinstance(d, Scale | Start)}


def _elastic(job: str, gpus: tuple[int, ...], weight: float = 1.0, **kw: Any) -> JobView:
    kw.setdefault("requested_gpus", len(gpus))
    return running(job, gpus, throughput=CURVE, max_gpus=8, remaining_work=1e5, weight=weight, **kw)


def _two_on_one_each(weight_b: float) -> list[JobView]:
    """Jobs a and b on one GPU each (a first in view order); the cluster says how many idle."""
    return [_elastic("a", (0,)), _elastic("b", (1,), weight=weight_b)]


@pytest.mark.parametrize("rule", RULES)
def test_the_heavier_job_takes_the_one_idle_gpu(rule: WeightRule) -> None:
    clu = cluster(1, per_server=3, busy={0: "a", 1: "b"})
    policy = ElasticTiresiasPolicy(weight_rule=rule)
    plain = _sizes(policy.schedule(snapshot(0, clu, *_two_on_one_each(1.0))))
    assert plain == {"a": 2}  # equal claims: view order gives it to a
    weighted = _sizes(policy.schedule(snapshot(0, clu, *_two_on_one_each(2.0))))
    assert weighted == {"b": 2}


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        # weighted gains of b (x2): 180, 160, 120, 60; of a: 90, 80, 60, 30
        (WeightRule.PROPORTIONAL, {"a": 2, "b": 4}),
        # b first while its curve gains: 4 more GPUs to b, none left for a
        (WeightRule.ORDER, {"b": 5}),
    ],
)
def test_the_rule_says_how_far_the_heavier_job_goes_first(
    rule: WeightRule, expected: dict[str, int]
) -> None:
    clu = cluster(1, per_server=6, busy={0: "a", 1: "b"})
    policy = ElasticTiresiasPolicy(weight_rule=rule)
    assert _sizes(policy.schedule(snapshot(0, clu, *_two_on_one_each(1.0)))) == {
        "a": 3,
        "b": 3,
    }
    assert _sizes(policy.schedule(snapshot(0, clu, *_two_on_one_each(2.0)))) == expected


def _extras_and_a_newcomer(weight_b: float) -> list[JobView]:
    """a and b ask 2 and hold 4 each (2 extras) on 8 GPUs; c asks 2 and waits."""
    return [
        _elastic("a", (0, 1, 2, 3), requested_gpus=2),
        _elastic("b", (4, 5, 6, 7), requested_gpus=2, weight=weight_b),
        queued("c", 2, submit=1.0, throughput=CURVE, max_gpus=8, remaining_work=1e5),
    ]


@pytest.mark.parametrize("rule", RULES)
def test_the_lighter_job_gives_its_extras_back_first(rule: WeightRule) -> None:
    busy = {g: ("a" if g < 4 else "b") for g in range(8)}
    clu = cluster(1, per_server=8, busy=busy)
    policy = ElasticTiresiasPolicy(weight_rule=rule)
    plain = _sizes(policy.schedule(snapshot(10, clu, *_extras_and_a_newcomer(1.0))))
    assert plain == {"a": 3, "b": 3, "c": 2}  # equal curves: one extra from each
    weighted = _sizes(policy.schedule(snapshot(10, clu, *_extras_and_a_newcomer(3.0))))
    assert weighted == {"a": 2, "c": 2}


def test_the_kept_core_follows_a_weight_that_changes_between_passes() -> None:
    clu = cluster(1, per_server=3, busy={0: "a", 1: "b"})
    fresh = ElasticTiresiasPolicy()
    kept = KeptPolicy(ElasticTiresiasPolicy())
    first = snapshot(0, clu, *_two_on_one_each(1.0))
    assert kept.schedule(first) == fresh.schedule(first)
    promoted = snapshot(5, clu, *_two_on_one_each(3.0))
    assert kept.schedule(promoted) == fresh.schedule(promoted)
    assert _sizes(kept.schedule(promoted)) == {"b": 2}


class WeightedWorld(World):
    """test_kept_core's living cluster, with jobs of several weights that a sweep promotes."""

    def arrive(self) -> None:
        super().arrive()
        name = f"job-{self.next_id:04d}"
        view, weight = self.jobs[name], self.rng.choice([1.0, 1.0, 3.0, 9.0])
        self.jobs[name] = dataclasses.replace(  # elastic, so that extras are there to move
            view, weight=weight, throughput=CURVE, max_gpus=4 * view.requested_gpus
        )

    def churn(self) -> None:
        super().churn()
        if self.jobs and self.rng.random() < 0.3:  # a promotion
            name = self.rng.choice(sorted(self.jobs))
            view = self.jobs[name]
            self.jobs[name] = dataclasses.replace(view, weight=view.weight * 3)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("seed", range(16))
def test_a_kept_core_moves_weighted_extras_as_a_fresh_core(rule: WeightRule, seed: int) -> None:
    rng = random.Random(f"weights-{seed}")
    fresh = ElasticTiresiasPolicy(weight_rule=rule)
    kept = KeptPolicy(ElasticTiresiasPolicy(weight_rule=rule))
    world = WeightedWorld(rng, fair=rng.random() < 0.5)
    for step in range(40):
        snapshot = world.snapshot()
        expected = fresh.schedule(snapshot, placement=CountPlacement())
        assert kept.schedule(snapshot, placement=CountPlacement()) == expected, f"step {step}"
        world.apply(expected)
        world.churn()


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_weight_that_is_not_a_positive_finite_number_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="weight"):
        queued("x", 1, weight=bad)


def test_an_unknown_weight_rule_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="proportional, order"):
        ElasticTiresiasPolicy(weight_rule="heaviest")


def _light_with_extras_heavy_on_base(weight_b: float, tenant_b: str = "") -> list[JobView]:
    """a asks 1 and holds 3 (2 extras); b asks 1 and holds 1; no GPU idle."""
    return [
        _elastic("a", (0, 1, 2), requested_gpus=1),
        _elastic("b", (3,), weight=weight_b, tenant=tenant_b),
    ]


@pytest.mark.parametrize(
    ("rule", "weight", "expected"),
    [
        # b's weighted gains 270, 240 beat a's losses 80, 90: both extras move
        (WeightRule.PROPORTIONAL, 3.0, {"a": 1, "b": 3}),
        # 99 beats 80, then 88 loses to 90: one moves
        (WeightRule.PROPORTIONAL, 1.1, {"a": 2, "b": 2}),
        # heavier at all: every extra of the lighter job moves while b gains
        (WeightRule.ORDER, 1.1, {"a": 1, "b": 3}),
    ],
)
def test_extras_move_from_a_lighter_job_to_a_heavier_one(
    rule: WeightRule, weight: float, expected: dict[str, int]
) -> None:
    clu = cluster(1, per_server=4, busy={0: "a", 1: "a", 2: "a", 3: "b"})
    policy = ElasticTiresiasPolicy(weight_rule=rule)
    assert policy.schedule(snapshot(0, clu, *_light_with_extras_heavy_on_base(1.0))) == []
    moved = policy.schedule(snapshot(0, clu, *_light_with_extras_heavy_on_base(weight)))
    assert _sizes(moved) == expected
    first = moved[0]
    assert isinstance(first, Scale) and first.job == "a"  # the shrink is bound first


@pytest.mark.parametrize("rule", RULES)
def test_extras_never_move_to_another_tenants_heavier_job(rule: WeightRule) -> None:
    clu = cluster(1, per_server=4, busy={0: "a", 1: "a", 2: "a", 3: "b"})
    views = _light_with_extras_heavy_on_base(3.0, tenant_b="other")
    assert ElasticTiresiasPolicy(weight_rule=rule).schedule(snapshot(0, clu, *views)) == []
