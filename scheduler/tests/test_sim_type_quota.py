"""The typed simulator holds the per-type quota the live tick holds (issue 38): in a mixed
cluster, a tenant's second A100 job waits for its first to end when its A100 quota is
full, while its H100 job and the idle A100s are not what stops it (pure)."""

from __future__ import annotations

import pytest

from scheduler.policies import get_policy
from scheduler.sim_config import SimConfig
from scheduler.sim_types import TypePool, pool_quota, simulate_mixed
from scheduler.traces import TraceJob

A100, H100 = "a100-40g", "h100-80g"
TRACE = [
    TraceJob("first", 0.0, 4, 100.0, model="resnet50", tenant="t"),
    TraceJob("capped", 1.0, 4, 100.0, model="resnet50", tenant="t"),
    TraceJob("fast", 2.0, 4, 100.0, model="resnet50", tenant="t"),
]
TYPES = {"first": A100, "capped": A100, "fast": H100}
POOLS = (TypePool(A100, 8), TypePool(H100, 8))


def _starts(type_quota: dict[str, dict[str, int]] | None, policy: str) -> dict[str, float]:
    cfg = SimConfig(total_gpus=16, quota={"t": 16})
    result = simulate_mixed(TRACE, lambda: get_policy(policy), cfg, POOLS, TYPES, type_quota)
    return {job.id: job.start for sim in result.by_type.values() for job in sim.jobs}


@pytest.mark.parametrize("policy", ["fifo", "tiresias"])
def test_a_full_a100_quota_holds_the_second_a100_job_until_the_first_ends(policy: str) -> None:
    held = _starts({"t": {A100: 4}}, policy)
    assert held["capped"] >= 100.0  # after "first" (100 s on its 4 A100s) ends
    assert held["fast"] == pytest.approx(2.0)  # no H100 quota: it starts on arrival
    free = _starts(None, policy)
    assert free["capped"] == pytest.approx(1.0)  # 4 idle A100s: at once


def test_pool_quota_is_the_lesser_of_the_total_and_the_type_quota() -> None:
    per_type = {"t": {A100: 4}, "u": {H100: 2}}
    assert pool_quota({"t": 16, "v": 3}, per_type, A100) == {"t": 4, "v": 3}
    assert pool_quota({"t": 2}, per_type, A100) == {"t": 2}
    assert pool_quota(None, per_type, H100) == {"u": 2}
    assert pool_quota(None, per_type, "v100") is None
