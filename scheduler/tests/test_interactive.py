"""Interactive sessions and preemption: batch work of the same or a lower class never takes
a session's GPUs, a higher class still may; in Tiresias and Elastic-Tiresias, fresh cores
and kept ones alike (the tick's)."""

from __future__ import annotations

import pytest

from scheduler.policies import get_policy
from scheduler.policies.base import Policy
from scheduler.policies.kept import KeptPolicy
from scheduler.priority import HIGH, LOW, NORMAL, las_level, may_preempt
from scheduler.tests.builders import cluster, queued, running, snapshot
from scheduler.types import Preempt, Snapshot, Start

LAS = ("tiresias", "elastic-tiresias")
LONG = 1e7  # GPU-seconds: far past every LAS threshold


def policies(name: str) -> list[Policy]:
    return [get_policy(name), KeptPolicy(get_policy(name))]


def test_the_rule() -> None:
    assert not may_preempt(NORMAL, NORMAL, victim_interactive=True)
    assert not may_preempt(LOW, NORMAL, victim_interactive=True)
    assert may_preempt(HIGH, NORMAL, victim_interactive=True)
    assert may_preempt(NORMAL, NORMAL, victim_interactive=False)  # the policy's order decides
    assert (las_level(2, True), las_level(2, False)) == (0, 2)


def _cluster_with(newcomer_priority: int, interactive: bool, other_priority: int = 50) -> Snapshot:
    """8 GPUs: a long-running session (4) and a fresh batch job (4); a newcomer wants 4."""
    clu = cluster(1, 8, busy={**dict.fromkeys(range(4), "lab"), **dict.fromkeys(range(4, 8), "b")})
    return snapshot(
        1000.0,
        clu,
        running(
            "lab",
            (0, 1, 2, 3),
            submit=0.0,
            queue_since=1.0,
            priority=50,
            attained_service=LONG,
            min_gpus=4,
            max_gpus=4,
            interactive=interactive,
        ),
        running("b", (4, 5, 6, 7), submit=2.0, queue_since=3.0, priority=other_priority),
        queued("new", 4, submit=999.0, priority=newcomer_priority),
    )


@pytest.mark.parametrize("name", LAS)
def test_batch_of_its_class_never_preempts_a_session(name: str) -> None:
    for policy in policies(name):
        decisions = policy.schedule(_cluster_with(50, interactive=True))
        assert Preempt("lab") not in decisions, policy
        assert not [d for d in decisions if isinstance(d, Start)]
        # Control: the same long job as batch work is demoted and the newcomer takes its GPUs.
        batch = get_policy(name).schedule(_cluster_with(50, interactive=False))
        assert Preempt("lab") in batch


@pytest.mark.parametrize("name", LAS)
def test_a_lower_class_never_preempts_a_session(name: str) -> None:
    for policy in policies(name):
        decisions = policy.schedule(_cluster_with(10, interactive=True))
        assert not [d for d in decisions if isinstance(d, Preempt)], policy


@pytest.mark.parametrize("name", LAS)
def test_a_higher_class_still_may(name: str) -> None:
    # The other running job is high too: the session is the only lower-class holder.
    for policy in policies(name):
        decisions = policy.schedule(_cluster_with(90, interactive=True, other_priority=90))
        assert Preempt("lab") in decisions, policy
        assert [d.job for d in decisions if isinstance(d, Start)] == ["new"]
