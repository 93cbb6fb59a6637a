"""The forecast's pass holds the live tick's per-type quotas (issue 38): a job its tenant's
quota of one GPU type caps is forecast to start when the job holding that quota ends, not
now, while GPUs of that type sit idle (pure)."""

from __future__ import annotations

import pytest

from scheduler.forecast import forecast
from scheduler.policies import get_policy
from scheduler.tests.builders import queued, running, snapshot, typed_cluster
from scheduler.types import Cluster, JobView

A100, H100 = "a100-40g", "h100-80g"


def _cluster_and_jobs() -> tuple[Cluster, tuple[JobView, ...]]:
    # Two A100 servers (GPUs 0-7) and two H100 servers (8-15); the holder runs on 0-3.
    busy = dict.fromkeys(range(4), "holder")
    cluster = typed_cluster(((A100, 2), (H100, 2)), per_server=4, busy=busy)
    holder = running("holder", (0, 1, 2, 3), tenant="t", remaining_work=100.0, gpu_types=(A100,))
    capped = queued("capped", 4, submit=1.0, tenant="t", remaining_work=50.0, gpu_types=(A100,))
    other = queued("other", 4, submit=2.0, tenant="t", remaining_work=50.0, gpu_types=(H100,))
    return cluster, (holder, capped, other)


@pytest.mark.parametrize("policy", ["fifo", "tiresias"])
def test_a_type_quota_capped_job_starts_when_the_holder_of_that_quota_ends(policy: str) -> None:
    cluster, jobs = _cluster_and_jobs()
    state = snapshot(0.0, cluster, *jobs)
    capped = forecast(state, get_policy(policy), quota={"t": 16}, type_quota={"t": {A100: 4}})
    assert capped.estimates["capped"].start == pytest.approx(100.0, abs=1.0)
    assert capped.estimates["capped"].finish == pytest.approx(150.0, abs=1.0)
    assert capped.estimates["other"].start == 0.0  # H100s: no quota of that type
    # The same cluster without the per-type quota: the 4 idle A100s take it now.
    free = forecast(state, get_policy(policy), quota={"t": 16})
    assert free.estimates["capped"].start == 0.0


def test_a_type_quota_alone_without_totals_holds_too() -> None:
    cluster, jobs = _cluster_and_jobs()
    result = forecast(
        snapshot(0.0, cluster, *jobs), get_policy("fifo"), type_quota={"t": {A100: 6}}
    )
    assert result.estimates["capped"].start == pytest.approx(100.0, abs=1.0)  # 4 + 4 > 6
