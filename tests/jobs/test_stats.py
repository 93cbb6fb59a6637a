"""JCT statistics: the pure summary and the per-tenant / cluster services."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devtools.job_steps import move
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import (
    check_job_spec,
    cluster_jct_stats,
    do_submit_job,
    tenant_jct_stats,
)
from jobs.stats import jct_stats, percentile, summarize


def test_summary_matches_hand_computation() -> None:
    stats = summarize([10.0, 20.0, 30.0, 40.0, 100.0])
    assert stats.count == 5
    assert stats.mean == 40.0
    assert stats.median == 30.0
    assert stats.p95 == pytest.approx(88.0)  # 40 + 0.8 * 60
    assert summarize([]).mean is None
    assert percentile([5.0], 95) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)


@pytest.mark.django_db
def test_services_count_completed_jobs_per_tenant(
    alice: Any, bob: Any, acme: Any, globex: Any
) -> None:
    t0 = timezone.now() - timedelta(hours=1)

    def finished(user: Any, tenant: Any, seconds: float, state: str = JobState.COMPLETED) -> None:
        spec = check_job_spec(
            tenant=tenant, data={"name": "j", "workload": "mlp-digits", "gpus": 1}
        )
        job = do_submit_job(user=user, tenant=tenant, spec=spec, at=t0)
        move(job_id=job.pk, to_state=JobState.RUNNING, reason="r", parallelism=1, at=t0)
        move(job_id=job.pk, to_state=state, reason="done", at=t0 + timedelta(seconds=seconds))

    finished(alice, acme, 100)
    finished(alice, acme, 300)
    finished(alice, acme, 999, state=JobState.FAILED)  # failures have no JCT
    finished(bob, globex, 50)
    assert tenant_jct_stats(acme).as_dict() == {
        "count": 2,
        "mean": 200.0,
        "median": 200.0,
        "p95": pytest.approx(290.0),
    }
    assert tenant_jct_stats(globex).count == 1
    cluster = cluster_jct_stats()
    assert cluster.count == 3 and cluster.mean == pytest.approx(150.0)
    assert cluster_jct_stats(since=timezone.now()).count == 0


@pytest.mark.django_db
def test_the_databases_summary_is_the_pure_one_in_one_query(alice: Any, acme: Any) -> None:
    """PostgreSQL aggregates (one row however long the history); SQLite reads the durations."""
    t0 = timezone.now() - timedelta(days=1)
    durations = [7.5, 61.0, 3600.25, 12.0, 999.0, 45.5, 300.0]
    for seconds in durations:
        spec = check_job_spec(tenant=acme, data={"name": "j", "workload": "mlp-digits", "gpus": 1})
        job = do_submit_job(user=alice, tenant=acme, spec=spec, at=t0)
        move(job_id=job.pk, to_state=JobState.RUNNING, reason="r", parallelism=1, at=t0)
        move(
            job_id=job.pk,
            to_state=JobState.COMPLETED,
            reason="done",
            at=t0 + timedelta(seconds=seconds),
        )
    with CaptureQueriesContext(connection) as captured:
        stats = jct_stats(Job.objects.filter(tenant=acme))
    assert len(captured) == 1
    expected = summarize(durations)
    assert stats.count == expected.count
    for name in ("mean", "median", "p95"):
        assert getattr(stats, name) == pytest.approx(getattr(expected, name), abs=1e-6), name
    assert jct_stats(Job.objects.filter(tenant=acme), since=timezone.now()).count == 0
