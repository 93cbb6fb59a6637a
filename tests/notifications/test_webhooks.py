"""Jobs' events reach a real webhook receiver, signed; failures are retried on the clock."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from control.limits import stop_jobs_at_limit
from devtools.job_steps import move
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.outbox import Outbox
from notifications.choices import DeliveryState
from notifications.models import Delivery, Subscription
from notifications.services import (
    HANDLE_EVENT_TASK,
    do_attempt_delivery,
    do_fan_out_job_event,
)
from notifications.signing import verify
from notifications.tasks import deliver, handle_job_event
from tests.notifications.conftest import queued_tasks
from tests.notifications.receiver import DeadEndpoint, Receiver

pytestmark = pytest.mark.django_db


def run_chain(event: JobEvent, callbacks_of: Any) -> list[Delivery]:
    """What the worker does: the event's fan-out task, then each delivery's task."""
    with callbacks_of(execute=False):
        ids = handle_job_event(event.pk)
    for delivery_id in ids:
        assert deliver(delivery_id) in ("delivered", "pending", "failed")
    return list(Delivery.objects.filter(pk__in=ids))


@pytest.mark.parametrize(("ending", "expected"), [("completed", "completed"), ("failed", "failed")])
def test_an_ending_job_reaches_the_receiver_signed(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
    portal_queue: Any,
    django_capture_on_commit_callbacks: Any,
    ending: str,
    expected: str,
) -> None:
    sub = subscribe(alice, events=["completed", "failed"], url=receiver.url, tenant=acme)
    job = submit(alice, acme)
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    queued_tasks(portal_queue)  # whatever the start enqueued
    with django_capture_on_commit_callbacks(execute=True):
        move(job_id=job.pk, to_state=ending, reason="over")
    event = JobEvent.objects.filter(job=job, to_state=ending).get()
    # After commit, one task per event on the portal queue: nothing was sent inline.
    assert receiver.requests == []
    assert (HANDLE_EVENT_TASK, [event.pk]) in queued_tasks(portal_queue)

    [delivery] = run_chain(event, django_capture_on_commit_callbacks)
    assert delivery.state == DeliveryState.DELIVERED
    [request] = receiver.requests
    assert request.path == "/hooks/gpu"
    headers = request.headers
    assert verify(
        sub.secret, headers["X-Portal-Timestamp"], request.body, headers["X-Portal-Signature"]
    )
    assert not verify(
        "another-secret", headers["X-Portal-Timestamp"], request.body, headers["X-Portal-Signature"]
    )
    assert abs(int(headers["X-Portal-Timestamp"]) - time.time()) < 60
    body = json.loads(request.body)
    assert body["type"] == f"job.{expected}" == headers["X-Portal-Event"]
    assert body["id"] == f"evt_{event.pk}"
    assert body["job"]["id"] == job.pk and body["job"]["tenant"] == "acme"
    assert body["job"]["state"] == ending
    assert body["job"]["links"]["page"].endswith(f"/jobs/{job.pk}/")

    # The task again (a redelivered message): no second delivery, no second POST.
    assert handle_job_event(event.pk) == []
    assert len(receiver.requests) == 1


def test_the_delivery_log_shows_retries_against_a_failing_receiver(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
    token_client: Callable[[Any], Any],
) -> None:
    receiver.statuses = [500, 503]
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    job = submit(alice, acme)
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    move(job_id=job.pk, to_state=JobState.COMPLETED, reason="done")
    event = JobEvent.objects.get(job=job, to_state=JobState.COMPLETED)
    t0 = timezone.now()
    [delivery_id] = do_fan_out_job_event(job_event_id=event.pk, now=t0)

    first = do_attempt_delivery(delivery_id=delivery_id, now=t0)
    assert first is not None and first.outcome.status_code == 500
    assert first.next_attempt_at == t0 + timedelta(seconds=30)
    # Not due yet: nothing is sent.
    assert do_attempt_delivery(delivery_id=delivery_id, now=t0 + timedelta(seconds=29)) is None
    second = do_attempt_delivery(delivery_id=delivery_id, now=t0 + timedelta(seconds=30))
    assert second is not None and second.outcome.status_code == 503
    assert second.next_attempt_at == t0 + timedelta(seconds=30 + 60)  # doubled
    third = do_attempt_delivery(delivery_id=delivery_id, now=t0 + timedelta(seconds=90))
    assert third is not None and third.state == DeliveryState.DELIVERED
    assert do_attempt_delivery(delivery_id=delivery_id, now=t0 + timedelta(hours=1)) is None
    assert len(receiver.requests) == 3
    # Every attempt carries the same event id and its own fresh signature.
    assert len({json.loads(r.body)["id"] for r in receiver.requests}) == 1

    answer = token_client(alice).get(f"/api/v1/subscriptions/{sub.pk}/deliveries/")
    assert answer.status_code == 200
    [logged] = answer.json()["results"]
    assert logged["state"] == "delivered" and logged["attempts"] == 3
    assert [a["status_code"] for a in logged["attempt_log"]] == [500, 503, 200]
    assert [a["ok"] for a in logged["attempt_log"]] == [False, False, True]

    page = token_client(alice)
    page.force_login(alice)
    html = page.get(f"/account/notifications/{sub.pk}/").content.decode()
    assert "HTTP 500" in html and "HTTP 503" in html and "HTTP 200" in html


def test_a_delivery_is_given_up_after_the_retry_window(
    alice: Any,
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
    settings: Any,
) -> None:
    settings.WEBHOOK_RETRY_FOR_S = 100
    receiver.statuses = [500] * 10
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    from notifications.services import do_send_test_event

    t0 = timezone.now()
    delivery = do_send_test_event(subscription=sub, now=t0)
    at = t0
    states = []
    for _ in range(10):
        result = do_attempt_delivery(delivery_id=delivery.pk, now=at)
        assert result is not None
        states.append(result.state)
        if result.next_attempt_at is None:
            break
        at = result.next_attempt_at
    # 0 s, 30 s, 90 s, then the last try at the window's end (100 s), then gives up.
    assert states == ["pending", "pending", "pending", "failed"]
    assert at == t0 + timedelta(seconds=100)
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.FAILED and delivery.attempts == 4


def test_a_refused_connection_is_logged_as_an_error(
    alice: Any, subscribe: Callable[..., Subscription], dead_endpoint: DeadEndpoint
) -> None:
    url = dead_endpoint.url
    dead_endpoint.close()  # nobody listens any more: connection refused
    sub = subscribe(alice, events=["completed"], url=url)
    from notifications.services import do_send_test_event

    delivery = do_send_test_event(subscription=sub, now=timezone.now())
    result = do_attempt_delivery(delivery_id=delivery.pk, now=timezone.now())
    assert result is not None and result.outcome.status_code is None
    assert "ConnectionRefusedError" in result.outcome.error
    assert delivery.attempt_log.get().error.startswith("ConnectionRefusedError")


def test_a_dead_endpoint_does_not_slow_transition(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    dead_endpoint: DeadEndpoint,
    portal_queue: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    for _ in range(5):
        subscribe(alice, events=["completed", "preempted"], url=dead_endpoint.url, tenant=acme)
    job = submit(alice, acme)
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        move(job_id=job.pk, to_state=JobState.QUEUED, reason="preempted")
        move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
        move(job_id=job.pk, to_state=JobState.COMPLETED, reason="done")
    elapsed = time.monotonic() - started
    # Five subscriptions to an endpoint that would hold each attempt for 5 s: the
    # transitions and their commit callbacks took far less than one attempt.
    assert elapsed < 2.0, elapsed
    assert not Delivery.objects.exists()  # the fan-out is the worker's job, not transition()'s
    tasks = [t for t in queued_tasks(portal_queue) if t[0] == HANDLE_EVENT_TASK]
    assert len(tasks) == 2  # preempted and completed; the restart notifies nobody


def test_a_preemption_and_a_run_time_limit_are_classified(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    failed_sub = subscribe(alice, events=["failed"], url=receiver.url)
    limit_sub = subscribe(alice, events=["runtime_limit", "preempted"], url=receiver.url)
    job = submit(alice, acme, max_runtime_s=60)
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    move(job_id=job.pk, to_state=JobState.QUEUED, reason="preempted by a shorter job")
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    # The control plane's own limit step fails the job.
    assert stop_jobs_at_limit(timezone.now() + timedelta(seconds=61), Outbox()) == [job.pk]

    preempted = JobEvent.objects.get(job=job, kind="preempted")
    limited = JobEvent.objects.get(job=job, to_state=JobState.FAILED)
    got_preempt = run_chain(preempted, django_capture_on_commit_callbacks)
    got_limit = run_chain(limited, django_capture_on_commit_callbacks)
    assert [d.subscription_id for d in got_preempt] == [limit_sub.pk]
    assert {d.subscription_id for d in got_limit} == {failed_sub.pk, limit_sub.pk}
    types = sorted(json.loads(r.body)["type"] for r in receiver.requests)
    assert types == ["job.preempted", "job.runtime_limit", "job.runtime_limit"]


def test_scopes_my_jobs_a_tenant_and_a_former_member(
    alice: Any,
    acme: Any,
    make_user: Callable[..., Any],
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
) -> None:
    carol = make_user("carol", acme)
    mine = subscribe(alice, events=["completed"], url=receiver.url)
    tenant_wide = subscribe(alice, events=["completed"], url=receiver.url, tenant=acme)
    carols_job = submit(carol, acme)
    alices_job = submit(alice, acme)
    for job in (carols_job, alices_job):
        move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
        move(job_id=job.pk, to_state=JobState.COMPLETED, reason="done")

    def subscribers(job: Job) -> set[int]:
        event = JobEvent.objects.get(job=job, to_state=JobState.COMPLETED)
        ids = do_fan_out_job_event(job_event_id=event.pk, now=timezone.now())
        return set(Delivery.objects.filter(pk__in=ids).values_list("subscription_id", flat=True))

    assert subscribers(carols_job) == {tenant_wide.pk}
    assert subscribers(alices_job) == {mine.pk, tenant_wide.pk}

    from tenancy.models import Membership

    Membership.objects.filter(user=alice, tenant=acme).delete()
    late = submit(carol, acme)
    move(job_id=late.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    move(job_id=late.pk, to_state=JobState.COMPLETED, reason="done")
    assert subscribers(late) == set()  # no longer a member: the tenant's jobs are not hers


def test_queued_long_fires_once_per_job(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
) -> None:
    from notifications.services import do_sweep_queued_long

    sub = subscribe(alice, events=["queued_long"], url=receiver.url, queued_minutes=10)
    job = submit(alice, acme)
    now = timezone.now()
    assert do_sweep_queued_long(now=now + timedelta(minutes=9)) == []
    [delivery_id] = do_sweep_queued_long(now=now + timedelta(minutes=11))
    assert do_sweep_queued_long(now=now + timedelta(minutes=30)) == []  # once
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.subscription_id, delivery.job_id) == (sub.pk, job.pk)
    assert delivery.payload["type"] == "job.queued_long"
    assert do_attempt_delivery(delivery_id=delivery_id, now=now + timedelta(minutes=11))
    assert json.loads(receiver.requests[0].body)["job"]["id"] == job.pk
    # A running job is not queued.
    other = submit(alice, acme)
    move(job_id=other.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    assert do_sweep_queued_long(now=now + timedelta(hours=2)) == []


def test_an_address_taken_off_the_allow_list_is_refused_at_the_next_send(
    alice: Any, subscribe: Callable[..., Subscription], receiver: Receiver, settings: Any
) -> None:
    sub = subscribe(alice, events=["completed"], url=receiver.url)
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    from notifications.services import do_send_test_event

    delivery = do_send_test_event(subscription=sub, now=timezone.now())
    result = do_attempt_delivery(delivery_id=delivery.pk, now=timezone.now())
    assert result is not None and not result.outcome.ok
    assert "127.0.0.1 is a loopback address" in result.outcome.error
    assert receiver.requests == []


def test_the_sweep_enqueues_a_delivery_whose_task_was_lost(
    alice: Any,
    subscribe: Callable[..., Subscription],
    receiver: Receiver,
    webhooks_queue: Any,
) -> None:
    from notifications.services import do_send_test_event
    from notifications.tasks import sweep

    sub = subscribe(alice, events=["completed"], url=receiver.url)
    lost = do_send_test_event(subscription=sub, now=timezone.now() - timedelta(minutes=5))
    fresh = do_send_test_event(subscription=sub, now=timezone.now())  # its own task is on its way
    assert sweep() == {"queued_long": 0, "requeued": 1}
    assert ("notifications.deliver", [lost.pk]) in queued_tasks(webhooks_queue)
    assert deliver(lost.pk) == "delivered"
    assert deliver(lost.pk) == "skipped"  # a second copy of the task sends nothing
    assert Delivery.objects.get(pk=fresh.pk).attempts == 0
    assert len(receiver.requests) == 1
