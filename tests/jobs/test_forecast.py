"""Predicted start and finish on the live cluster: remaining work, the refresh, pages and API."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from control.forecast import (
    DUE_KEY,
    FORECAST_TASK,
    LOCK_KEY,
    forget_asked,
    maybe_refresh,
    refresh_forecast,
    remaining_work,
)
from control.tasks import forecast_estimates
from control.tick import run_tick
from jobs.live.snapshots import queue_positions, tenant_snapshot
from jobs.models import Job
from jobs.progress import total_steps
from jobs.services import check_job_spec, do_submit_job
from portal.celery import app
from scheduler.curves import record_measurement
from scheduler.forecast import UNKNOWN_WORK
from tenancy.models import Tenant
from tests.jobs.control_helpers import demo_cluster, drain_envelopes
from utilities.realtime import job_group, tenant_group

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Tenant, gpus: int, steps: int = 1000, name: str = "j") -> Job:
    data = {
        "name": name,
        "workload": "resnet18-synthetic",
        "args": {"steps": steps},
        "gpus": gpus,
        "min_gpus": gpus,
        "max_gpus": gpus,
        "batch_size": 32,
    }
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


@pytest.fixture
def fresh_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(DUE_KEY, LOCK_KEY)
    forget_asked()  # another test's request, remembered by this process
    yield client
    client.delete(DUE_KEY, LOCK_KEY)
    forget_asked()


# -- remaining work (pure) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("workload", "args", "batch", "expected"),
    [
        ("resnet18-synthetic", {"steps": 500}, 32, 500),
        ("mlp-digits", {"epochs": 2}, 64, 2 * 29),  # 1797 samples: 29 batches of 64
        ("", {}, 32, None),  # a program: its total is its own
        ("resnet18-synthetic", {"steps": "many"}, 32, None),  # hostile args: unknown, no error
        ("mlp-digits", {}, 64, None),
    ],
)
def test_total_steps(workload: str, args: dict[str, Any], batch: int, expected: int | None) -> None:
    assert total_steps(workload, args, batch) == expected


def test_remaining_work_from_the_measured_rate_and_unknown_without_one() -> None:
    linear = {n: 100.0 * n for n in range(1, 9)}
    # 100 steps x 32 samples left at 320 samples/s on 2 GPUs: 10 s there; a request of 4
    # GPUs runs twice as fast on the curve, so 5 s of requested-size work.
    common = {"total": 200, "step": 100, "batch_size": 32, "requested": 4, "curve": linear}
    assert remaining_work(
        **common, samples_per_s=320.0, parallelism=2, curve_known=False
    ) == pytest.approx(5.0)
    assert remaining_work(**common, samples_per_s=None, parallelism=0, curve_known=False) is None
    # A queued job with a measured curve: samples left at the curve's rate for its request.
    assert remaining_work(
        **common, samples_per_s=None, parallelism=0, curve_known=True
    ) == pytest.approx(3200 / 400)
    assert (
        remaining_work(
            total=None,
            step=0,
            batch_size=32,
            samples_per_s=10.0,
            parallelism=1,
            requested=1,
            curve=None,
            curve_known=False,
        )
        is None
    )


# -- the refresh against the real database and Redis --------------------------------------


def running_on_the_whole_cluster(user: Any, tenant: Tenant, name: str) -> Job:
    """A job placed on all 8 GPUs of the demo cluster by a FIFO tick (its start commands read)."""
    nodes = demo_cluster()
    job = submit(user, tenant, gpus=8, name=name)
    run_tick(policy="fifo")
    for node in nodes:
        drain_envelopes(node)  # the start commands: not these tests' subject
    return job


@override_settings(SCHEDULER_POLICY="fifo")
def test_refresh_writes_start_behind_the_running_job_and_positions(
    alice: Any, acme: Tenant, fresh_redis: redis.Redis
) -> None:
    first = running_on_the_whole_cluster(alice, acme, "first")
    second = submit(alice, acme, gpus=8, name="second")
    third = submit(alice, acme, gpus=8, name="third", steps=1)
    # 600 of 1000 steps done at 320 samples/s: 400 x 32 / 320 = 40 s left.
    Job.objects.filter(pk=first.pk).update(step=600, samples_per_s=320.0)
    now = timezone.now()
    changed = refresh_forecast(now)
    assert changed is not None and set(changed) == {first.pk, second.pk, third.pk}
    first.refresh_from_db()
    second.refresh_from_db()
    third.refresh_from_db()
    assert first.state == "running" and first.queue_position is None
    assert first.estimated_start is None
    # Stored cut to the second, less the time the job has run since its last report (the
    # test's own setup, a fraction of a second): within 2 s of 40, whatever the clock's phase.
    assert abs((first.estimated_finish - now).total_seconds() - 40) <= 2
    assert second.estimated_start == first.estimated_finish  # starts when the first ends
    assert second.estimated_finish is None and second.estimate_reason == UNKNOWN_WORK
    assert (second.queue_position, third.queue_position) == (1, 2)
    assert third.estimated_start is None  # waits behind a job of unknown length
    assert first.estimated_at == second.estimated_at is not None
    assert queue_positions() == {second.pk: 1, third.pk: 2}
    # A second refresh with nothing new changes nothing and announces nothing.
    assert refresh_forecast(now) == []


@override_settings(SCHEDULER_POLICY="fifo")
def test_an_estimate_that_moves_by_a_second_edge_is_kept_and_a_real_move_is_written(
    alice: Any, acme: Tenant, fresh_redis: redis.Redis
) -> None:
    first = running_on_the_whole_cluster(alice, acme, "first")
    second = submit(alice, acme, gpus=8, name="second")
    Job.objects.filter(pk=first.pk).update(step=600, samples_per_s=320.0)  # 40 s left
    edge = timezone.now().replace(microsecond=900_000)  # just before a second's edge
    assert refresh_forecast(edge)
    second.refresh_from_db()
    stored = second.estimated_start
    # The same 40 s, 0.3 s later, across the edge: cut to the second it would move by 1 s.
    assert refresh_forecast(edge + timedelta(seconds=0.3)) == []
    second.refresh_from_db()
    assert second.estimated_start == stored
    # It reports 5 s later that it went at half the rate: its end, and the next start, move on.
    Job.objects.filter(pk=first.pk).update(
        step=625, samples_per_s=160.0, measured_curve={"8": 160.0}, last_service_at=edge
    )
    assert set(refresh_forecast(edge + timedelta(seconds=5)) or []) == {first.pk, second.pk}
    second.refresh_from_db()
    assert second.estimated_start - stored > timedelta(seconds=30)


def progress(job: Job, at: Any, step: int, samples_per_s: float) -> None:
    """A progress report as ``_progress`` stores it: step, rate, the size's running average."""
    job.refresh_from_db()
    job.measured_curve = record_measurement(job.measured_curve, 8, samples_per_s)
    Job.objects.filter(pk=job.pk).update(
        step=step, samples_per_s=samples_per_s, measured_curve=job.measured_curve,
        last_service_at=at,
    )  # fmt: skip


@override_settings(SCHEDULER_POLICY="fifo")
def test_an_estimate_holds_still_while_nothing_but_time_and_noise_changes(
    alice: Any, acme: Tenant, fresh_redis: redis.Redis
) -> None:
    """Issue 37: between reports the running job is where its rate says, not where its last
    report left it; a report whose rate wobbles by a few percent moves nothing."""
    first = running_on_the_whole_cluster(alice, acme, "first")
    second = submit(alice, acme, gpus=8, name="second")
    t0 = timezone.now().replace(microsecond=0)
    progress(first, t0, 100, 320.0)  # 900 x 32 / 320 = 90 s left
    assert refresh_forecast(t0)
    second.refresh_from_db()
    stored = second.estimated_start
    assert abs((stored - t0).total_seconds() - 90) <= 1
    for seconds in (10, 20, 29):  # no report yet: the job goes on as measured
        assert refresh_forecast(t0 + timedelta(seconds=seconds)) == [], seconds
    # Reports every 30 s, each rate 4% off the last (the job's true rate is steady).
    for k, (step, rate) in enumerate(((400, 333.0), (700, 307.0)), start=1):
        at = t0 + timedelta(seconds=30 * k)
        progress(first, at, step, rate)
        assert refresh_forecast(at + timedelta(seconds=1)) == [], (step, rate)
    second.refresh_from_db()
    assert second.estimated_start == stored


def test_a_refresh_while_another_runs_does_nothing(fresh_redis: redis.Redis) -> None:
    lock = fresh_redis.lock(LOCK_KEY, timeout=30)
    assert lock.acquire(blocking=False)
    try:
        assert refresh_forecast() is None
        assert forecast_estimates() == {"ran": False, "changed": []}
    finally:
        lock.release()


def test_estimates_of_a_job_that_left_the_queue_are_cleared(
    alice: Any, acme: Tenant, fresh_redis: redis.Redis
) -> None:
    demo_cluster()
    job = submit(alice, acme, gpus=2)
    refresh_forecast()
    job.refresh_from_db()
    assert job.queue_position == 1 and job.estimated_at is not None
    Job.objects.filter(pk=job.pk).update(state="cancelled")
    refresh_forecast()
    job.refresh_from_db()
    assert (job.queue_position, job.estimated_at, job.estimated_start) == (None, None, None)


@override_settings(FORECAST_SECONDS=10)
def test_maybe_refresh_sends_one_task_per_interval_on_the_whatif_queue(
    whatif_queue: Any, fresh_redis: redis.Redis
) -> None:
    assert app.amqp.router.route({}, FORECAST_TASK)["queue"].name == "whatif"
    now, clock = timezone.now(), [100.0]
    maybe_refresh(now, clock=lambda: clock[0])
    clock[0] += 1
    maybe_refresh(now + timedelta(seconds=1), clock=lambda: clock[0])  # not due yet
    message = whatif_queue.get(timeout=5)
    assert message.headers["task"] == FORECAST_TASK
    message.ack()
    with pytest.raises(whatif_queue.Empty):
        whatif_queue.get(timeout=0.5)
    fresh_redis.delete(DUE_KEY)  # the interval has passed (in Redis)...
    maybe_refresh(now, clock=lambda: clock[0])  # ...not by this process's clock: not asked
    with pytest.raises(whatif_queue.Empty):
        whatif_queue.get(timeout=0.5)
    assert fresh_redis.get(DUE_KEY) is None
    clock[0] += 9  # ...and now by its clock too
    maybe_refresh(now, clock=lambda: clock[0])
    assert whatif_queue.get(timeout=5).headers["task"] == FORECAST_TASK
    assert fresh_redis.pttl(DUE_KEY) > 0


@override_settings(FORECAST_SECONDS=10)
def test_maybe_refresh_asks_redis_when_another_process_asked_last(
    whatif_queue: Any, fresh_redis: redis.Redis
) -> None:
    """Only the process that set the key skips Redis: here another set it, and each call
    asks Redis (which says no) until the key is gone, then this one sends."""
    clock = [100.0]
    fresh_redis.set(DUE_KEY, "1", px=10_000)  # another process's request
    maybe_refresh(timezone.now(), clock=lambda: clock[0])
    with pytest.raises(whatif_queue.Empty):
        whatif_queue.get(timeout=0.5)
    fresh_redis.delete(DUE_KEY)  # its interval has passed
    maybe_refresh(timezone.now(), clock=lambda: clock[0])  # same clock: asked, and sent
    assert whatif_queue.get(timeout=5).headers["task"] == FORECAST_TASK


@override_settings(FORECAST_SECONDS=0)
def test_maybe_refresh_is_off_with_no_interval(whatif_queue: Any, fresh_redis: redis.Redis) -> None:
    maybe_refresh(timezone.now())
    with pytest.raises(whatif_queue.Empty):
        whatif_queue.get(timeout=0.5)


# -- what users see --------------------------------------------------------------------------


def test_api_page_and_dashboard_show_estimates_to_their_tenant_only(
    alice: Any, bob: Any, acme: Tenant, globex: Tenant, fresh_redis: redis.Redis
) -> None:
    runs = running_on_the_whole_cluster(alice, acme, "runs")
    waits = submit(alice, acme, gpus=8, name="waits")
    other = submit(bob, globex, gpus=4, name="other")
    Job.objects.filter(pk=runs.pk).update(step=500, samples_per_s=320.0)
    refresh_forecast()
    runs.refresh_from_db()
    waits.refresh_from_db()
    assert waits.estimated_start is not None and runs.estimated_finish is not None

    api = APIClient()
    api.force_authenticate(alice)
    body = api.get(f"/api/v1/jobs/{waits.pk}/").json()
    assert body["queue_position"] == waits.queue_position
    assert body["estimated_start"] is not None and body["estimated_finish"] is None
    assert body["estimate_reason"] == UNKNOWN_WORK
    listed = {row["id"] for row in api.get("/api/v1/jobs/").json()["results"]}
    assert other.pk not in listed  # another tenant's job (and its estimate) stays hidden
    assert api.get(f"/api/v1/jobs/{other.pk}/").status_code == 404

    page = Client()
    page.force_login(alice)
    html = page.get(f"/jobs/{waits.pk}/").content.decode()
    assert "Estimated start" in html
    assert waits.estimated_start.isoformat()[:19] in html
    dashboard = page.get("/").content.decode()
    assert runs.estimated_finish.isoformat()[:19] in dashboard
    rows = {r["id"]: r for r in tenant_snapshot(acme, Job.objects.restrict(alice))["jobs"]}
    assert rows[waits.pk]["estimated_start"] == waits.estimated_start.isoformat()
    assert rows[runs.pk]["estimated_start"] is None
    assert other.pk not in rows


def test_clients_cannot_set_estimates_or_positions(
    alice: Any, acme: Tenant, fresh_redis: redis.Redis
) -> None:
    demo_cluster()
    job = submit(alice, acme, gpus=2)
    refresh_forecast()
    job.refresh_from_db()
    before = (job.queue_position, job.estimated_start, job.estimated_at)
    api = APIClient()
    api.force_authenticate(alice)
    forged = {"queue_position": 0, "estimated_start": "2000-01-01T00:00:00Z"}
    response = api.patch(f"/api/v1/jobs/{job.pk}/", forged, format="json")
    assert response.status_code == 400
    assert "Unknown field(s): estimated_start, queue_position" in response.content.decode()
    job.refresh_from_db()
    assert (job.queue_position, job.estimated_start, job.estimated_at) == before


def test_maybe_refresh_inside_a_transaction_waits_for_the_commit(
    whatif_queue: Any, fresh_redis: redis.Redis
) -> None:
    with transaction.atomic():
        maybe_refresh(timezone.now())
        assert fresh_redis.get(DUE_KEY) is None  # nothing sent, nothing marked yet
    assert whatif_queue.get(timeout=5).headers["task"] == FORECAST_TASK


def test_changed_estimates_are_announced_to_their_own_tenant_and_page_only(
    alice: Any, bob: Any, acme: Tenant, globex: Tenant, fresh_redis: redis.Redis, monkeypatch: Any
) -> None:
    sent: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    monkeypatch.setattr(
        "control.forecast.broadcast_on_commit",
        lambda groups, payload: sent.append((tuple(groups), payload)),
    )
    demo_cluster()
    mine = submit(alice, acme, gpus=2, name="mine")
    theirs = submit(bob, globex, gpus=2, name="theirs")
    refresh_forecast()
    by_group = dict(sent)
    tenant_msg = by_group[(tenant_group(acme.pk),)]
    assert tenant_msg["type"] == "forecast.updated"
    assert [entry["job"] for entry in tenant_msg["jobs"]] == [mine.pk]  # not globex's job
    assert [e["job"] for e in by_group[(tenant_group(globex.pk),)]["jobs"]] == [theirs.pk]
    assert by_group[(job_group(mine.pk),)]["job"] == mine.pk
    assert len(sent) == 4  # two tenants, two job pages
    sent.clear()
    refresh_forecast()
    assert sent == []  # nothing changed: nothing announced
