"""The policy core kept between ticks: the tick's source hands it out, the verify pass checks it.

``scheduler/tests/test_kept_core.py`` checks that a kept core decides as a fresh
one on random snapshot sequences; here, that the control plane's kept state
keeps one per policy, and that its periodic comparison with a full rebuild
catches a kept core that went wrong, counts it and starts a fresh one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from control import incremental
from control.incremental import FullRebuild, KeptState, compare_policies
from control.policy import live_policy
from control.tick import run_tick
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from scheduler.placement import CountPlacement
from scheduler.policies.kept import KeptPolicy
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)
needs_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the kept state reads PostgreSQL's row versions"
)

FABRIC = {"leaves": 4, "spines": 4, "servers_per_leaf": 2, "gpus_per_server": 4}  # 32 GPUs
POLICY = "elastic-tiresias"


@pytest.fixture(autouse=True)
def fresh_process(settings: Any) -> Iterator[None]:
    """Each test starts as a new scheduler process would, ticking incrementally."""
    settings.TICK_INCREMENTAL = True
    settings.TICK_VERIFY_EVERY = 10_000  # only the tests' own comparisons, unless one says
    incremental.forget()
    yield
    incremental.forget()


def submit(user: Any, tenant: Any, gpus: int, lo: int, hi: int) -> Job:
    data = {"name": f"j{gpus}", "workload": "mlp-digits", "gpus": gpus, "min_gpus": lo}
    spec = check_job_spec(tenant=tenant, data={**data, "max_gpus": hi})
    return do_submit_job(user=user, tenant=tenant, spec=spec)


def test_each_source_hands_out_the_live_policy(settings: Any) -> None:
    """The full rebuild: ``live_policy`` (a fresh core each pass).  The kept state: one kept
    core per policy and ageing period, the same object tick after tick."""
    settings.CLASS_AGEING_SECONDS = 3600
    fresh = FullRebuild().policy(POLICY)
    assert not isinstance(fresh, KeptPolicy)
    assert (fresh.name, fresh.class_ageing_s) == (POLICY, 3600.0)
    state = KeptState()
    kept = state.policy(POLICY)
    assert isinstance(kept, KeptPolicy)
    assert (kept.name, kept.class_ageing_s) == (POLICY, 3600.0)
    assert state.policy(POLICY) is kept
    settings.SCHEDULER_POLICY = POLICY
    assert state.policy() is kept  # the settings' policy by default
    settings.CLASS_AGEING_SECONDS = 0
    other = state.policy(POLICY)
    assert other is not kept and other.class_ageing_s is None
    assert state.policy("fifo").name == "fifo"
    state.reset(state.spec)
    assert state.policy(POLICY) is not other  # a reset drops the kept cores


@needs_postgresql
def test_the_kept_core_follows_ticks_and_a_diverged_one_is_caught_and_rebuilt(
    alice: Any, acme: Any, settings: Any, caplog: Any
) -> None:
    demo_cluster(FABRIC)
    acme.profile_jobs = False
    acme.save()
    for _ in range(3):
        submit(alice, acme, gpus=2, lo=1, hi=16)
    state = incremental.kept_state()
    for _ in range(3):
        assert run_tick(policy=POLICY).ran
        cluster = state.cluster()
        assert cluster is not None
        snapshot = state.policy_input(cluster, timezone.now()).snapshot
        assert compare_policies(state.policies.values(), snapshot) == []
        kept = state.policy(POLICY)
        placement = CountPlacement()
        assert kept.schedule(snapshot, placement=placement) == live_policy(POLICY).schedule(
            snapshot, placement=placement
        )
    assert kept.rebuilds == 1  # one core, kept across the ticks
    # Behind its back, a running job leaves the kept core (its view stays as it was, so
    # no pass puts it back): the core counts its GPUs free and hands them out.
    restored = kept.kept
    assert restored is not None
    running = next(rec for rec in restored.records.values() if rec.running)
    restored.core.remove(running, snapshot.now)
    assert compare_policies([kept], snapshot) == [f"policy {POLICY}"]
    settings.TICK_VERIFY_EVERY = 1
    with caplog.at_level(logging.WARNING, logger="control.incremental"):
        assert run_tick(policy=POLICY).ran
    assert f"differs from the database in policy {POLICY}" in caplog.text
    assert state.mismatches == 1
    # Dropped with the state; the same tick's pass then kept a fresh one.
    assert kept not in state.policies.values()
    assert all(p.rebuilds <= 1 for p in state.policies.values())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="control.incremental"):
        assert run_tick(policy=POLICY).ran  # verified again: now the same
    assert "differs" not in caplog.text
    assert state.mismatches == 1
