"""A job's ``sched_weight`` reaches the live tick: the heavier job of a tenant gets the extras.

The pure rule is tested in ``scheduler/tests/test_weights*.py``; here, that the
database column is what the tick's snapshot (kept and rebuilt alike) and the
forecast show the policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from control import incremental
from control.incremental import compare_policies
from control.tick import run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the kept state reads PostgreSQL's row versions"
    ),
]

FABRIC = {"leaves": 4, "spines": 4, "servers_per_leaf": 2, "gpus_per_server": 4}  # 32 GPUs
POLICY = "elastic-tiresias"


@pytest.fixture(autouse=True)
def fresh_process(settings: Any) -> Iterator[None]:
    settings.TICK_INCREMENTAL = True
    settings.TICK_VERIFY_EVERY = 1  # every tick compares the kept state with a rebuild
    incremental.forget()
    yield
    incremental.forget()


def submit(user: Any, tenant: Any, name: str) -> Job:
    data = {"name": name, "workload": "mlp-digits", "gpus": 2, "min_gpus": 1, "max_gpus": 24}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def test_the_heavier_job_of_a_tenant_takes_the_lighter_ones_extras(
    alice: Any, acme: Any, caplog: Any
) -> None:
    demo_cluster(FABRIC)
    acme.profile_jobs = False
    acme.save()
    light, heavy = submit(alice, acme, "light"), submit(alice, acme, "heavy")
    Job.objects.filter(pk=heavy.pk).update(sched_weight=4.0)  # a promoted trial's weight
    state = incremental.kept_state()
    for _ in range(4):
        assert run_tick(policy=POLICY).ran
    light.refresh_from_db()
    heavy.refresh_from_db()
    assert heavy.parallelism > light.parallelism >= 1, (heavy.parallelism, light.parallelism)
    assert state.mismatches == 0
    cluster = state.cluster()
    assert cluster is not None
    snapshot = state.policy_input(cluster, timezone.now()).snapshot
    assert {v.id: v.weight for v in snapshot.jobs} == {
        f"job-{light.pk}": 1.0,
        f"job-{heavy.pk}": 4.0,
    }
    assert compare_policies(state.policies.values(), snapshot) == []
