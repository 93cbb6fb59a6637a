"""Every write of the notifications app: subscriptions, deliveries and their attempts.

``check_*`` validate, ``do_*`` change state (views, the API and tasks call
these and nothing else writes). Deliveries are enqueued after commit; an
attempt claims its delivery first, so a task that runs twice (a retry and the
sweep) sends once::

    JobEvent saved ──on commit──▶ handle_job_event ──▶ do_fan_out_job_event
                                                        └─ one Delivery per matching subscription
                                                           └─on commit──▶ deliver ──▶ do_attempt_delivery
    beat, every 60 s ──▶ sweep ──▶ do_sweep_queued_long (once per job and subscription)
                              └──▶ due_delivery_ids (retries whose task was lost) ──▶ deliver

    do_attempt_delivery: claim (pending, due) ─▶ send once ─▶ DeliveryAttempt
        2xx / mail accepted ─▶ delivered
        else, within WEBHOOK_RETRY_FOR_S of the event ─▶ pending, next try after 30 s x 2^(n-1) (capped)
        else ─▶ failed (gave up)
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from audit.services import record as audit_record
from audit.services import snapshot
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from notifications import events as notices
from notifications.addresses import refusal, resolve
from notifications.choices import TEST_EVENT, Channel, DeliveryState, EventType
from notifications.models import (
    URL_MAX_LENGTH,
    Delivery,
    DeliveryAttempt,
    Subscription,
)
from notifications.sending import Outcome, allowed_networks, post_webhook, send_email
from notifications.signing import new_secret
from tenancy.models import Membership, Tenant

log = logging.getLogger(__name__)

DELIVER_TASK = "notifications.deliver"
HANDLE_EVENT_TASK = "notifications.handle_job_event"
QUEUE = "portal"
DELIVER_QUEUE = "webhooks"
"""Deliveries' own queue and worker: no number of slow endpoints delays a report."""
MAX_SUBSCRIPTIONS_PER_USER = 50
MAX_QUEUED_MINUTES = 7 * 24 * 60
CLAIM_S = 120.0
"""An attempt holds its delivery this long: far beyond one attempt's timeouts."""
SWEEP_GRACE_S = 60.0
"""The sweep re-enqueues a delivery only when it has been due this long (its own task is lost)."""
SWEEP_BATCH = 500
AUDITED_FIELDS = ("owner_id", "tenant_id", "events", "queued_minutes", "channel", "url", "email")
"""What the audit log keeps of a subscription: never its secret."""


class NotificationError(ValueError):
    """A refused request, with the field it is about and a message for the user."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class SubscriptionSpec:
    """A checked subscription, ready to be created."""

    tenant: Tenant | None
    events: tuple[str, ...]
    queued_minutes: int | None
    channel: str
    url: str
    email: str


@dataclass(frozen=True)
class AttemptResult:
    """What one call of :func:`do_attempt_delivery` did."""

    outcome: Outcome
    state: str
    next_attempt_at: datetime | None


# --- Subscriptions -------------------------------------------------------------------------


def check_subscription(
    *,
    owner: AbstractBaseUser,
    tenant_slug: str | None,
    events: Any,
    channel: str,
    url: str = "",
    email: str = "",
    queued_minutes: int | None = None,
) -> SubscriptionSpec:
    """Validate a new subscription of ``owner``; raise :class:`NotificationError` on any fault."""
    tenant = None
    if tenant_slug:
        tenant = Tenant.objects.restrict(owner).filter(slug=tenant_slug).first()
        if tenant is None:
            raise NotificationError(
                "tenant",
                f"No tenant {tenant_slug!r} among yours: you can only subscribe to "
                "a tenant you belong to (or leave it empty for your own jobs).",
            )
    chosen = _check_events(events)
    if EventType.QUEUED_LONG in chosen:
        if queued_minutes is None or not 1 <= queued_minutes <= MAX_QUEUED_MINUTES:
            raise NotificationError(
                "queued_minutes",
                f"queued_long needs queued_minutes, from 1 to {MAX_QUEUED_MINUTES}.",
            )
    elif queued_minutes is not None:
        raise NotificationError("queued_minutes", "queued_minutes applies to queued_long only.")
    if channel == Channel.WEBHOOK:
        return SubscriptionSpec(tenant, chosen, queued_minutes, channel, check_url(url), "")
    if channel == Channel.EMAIL:
        address = _check_email(email or str(getattr(owner, "email", "") or ""))
        return SubscriptionSpec(tenant, chosen, queued_minutes, channel, "", address)
    raise NotificationError("channel", f"Unknown channel {channel!r}: use webhook or email.")


def _check_events(events: Any) -> tuple[str, ...]:
    if not isinstance(events, list | tuple) or not events:
        raise NotificationError("events", "Choose at least one event.")
    unknown = [str(e)[:40] for e in events if e not in EventType.values]
    if unknown:
        raise NotificationError(
            "events",
            f"Unknown event {unknown[0]!r}; choose from {', '.join(EventType.values)}.",
        )
    return tuple(e for e in EventType.values if e in events)  # canonical order, no duplicates


def check_url(url: str) -> str:
    """A webhook URL: http or https, a host, at most ``URL_MAX_LENGTH`` characters."""
    url = (url or "").strip()
    if not url:
        raise NotificationError("url", "A webhook needs a URL (http:// or https://).")
    if len(url) > URL_MAX_LENGTH:
        raise NotificationError("url", f"The URL is longer than {URL_MAX_LENGTH} characters.")
    if not url.lower().startswith(("http://", "https://")):
        raise NotificationError("url", "Only http:// and https:// URLs can receive webhooks.")
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise NotificationError("url", "That is not a valid http(s) URL.") from None
    _check_host(url)
    return url


def _check_host(url: str) -> None:
    """Refuse a URL whose host is, or now resolves to, an address webhooks may not reach.

    A name that does not resolve yet is accepted: every send checks the
    address it connects to again (``notifications.pinned``), so this check is
    the early, friendly answer and the send's is the boundary.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise NotificationError("url", "The URL's port is not a number from 0 to 65535.") from None
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError):
        return
    allowed = allowed_networks()
    for address in addresses:
        why = refusal(address, allowed)
        if why:
            named = "" if host.strip("[]") == str(address) else f" ({host} resolves to it)"
            raise NotificationError(
                "url", f"Webhooks may only call public addresses: {why}{named}."
            )


def _check_email(address: str) -> str:
    address = address.strip()
    if not address:
        raise NotificationError("email", "An email subscription needs an address.")
    try:
        validate_email(address)
    except ValidationError:
        raise NotificationError("email", "That is not a valid email address.") from None
    return address


@transaction.atomic
def do_create_subscription(
    *, owner: AbstractBaseUser, spec: SubscriptionSpec, now: datetime
) -> Subscription:
    """Create ``owner``'s subscription; a webhook gets a fresh signing secret."""
    if Subscription.objects.filter(owner_id=owner.pk).count() >= MAX_SUBSCRIPTIONS_PER_USER:
        raise NotificationError(
            "non_field_errors", f"You have {MAX_SUBSCRIPTIONS_PER_USER} subscriptions already."
        )
    subscription = Subscription.objects.create(
        owner_id=owner.pk,
        tenant=spec.tenant,
        events=list(spec.events),
        queued_minutes=spec.queued_minutes,
        channel=spec.channel,
        url=spec.url,
        email=spec.email,
        secret=new_secret() if spec.channel == Channel.WEBHOOK else "",
        created_at=now,
    )
    audit_record(
        "subscription.create",
        obj=subscription,
        tenant=spec.tenant,
        after=snapshot(subscription, AUDITED_FIELDS),
        user=owner,
    )
    return subscription


@transaction.atomic
def do_delete_subscription(*, subscription: Subscription) -> None:
    """Delete a subscription and its delivery log; pending retries stop."""
    audit_record(
        "subscription.delete",
        obj=subscription,
        tenant=subscription.tenant,
        before=snapshot(subscription, AUDITED_FIELDS),
        user=subscription.owner,
    )
    subscription.delete()


class TooManyTests(NotificationError):
    """A test send beyond the owner's allowance; ``retry_after_s`` says when one is allowed."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            "non_field_errors",
            f"Too many test sends: at most {settings.NOTIFICATION_TESTS_PER_WINDOW} every "
            f"{settings.NOTIFICATION_TEST_WINDOW_S} s; try again in {retry_after_s} s.",
        )
        self.retry_after_s = retry_after_s


def allowance_window(now: datetime) -> tuple[int, int]:
    """The test-send window's length and the start of the one ``now`` is in (epoch seconds)."""
    window = max(int(settings.NOTIFICATION_TEST_WINDOW_S), 1)
    stamp = int(now.timestamp())
    return window, stamp - stamp % window


def allowance_key(user_id: int, start: int) -> str:
    """The cache key counting ``user_id``'s test sends in the window that began at ``start``."""
    return f"notify-tests:{user_id}:{start}"


def take_test_allowance(*, user_id: int, now: datetime) -> None:
    """Count one test send of ``user_id``; raise :class:`TooManyTests` beyond the allowance.

    A fixed window per user (``NOTIFICATION_TESTS_PER_WINDOW`` sends every
    ``NOTIFICATION_TEST_WINDOW_S`` seconds) counted in the shared cache, so
    every web process counts the same sends: a test button cannot be made to
    mail or POST without end.
    """
    window, start = allowance_window(now)
    stamp = int(now.timestamp())
    key = allowance_key(user_id, start)
    cache.add(key, 0, timeout=window + 60)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr: a fresh window
        cache.set(key, 1, timeout=window + 60)
        count = 1
    if count > int(settings.NOTIFICATION_TESTS_PER_WINDOW):
        raise TooManyTests(retry_after_s=max(start + window - stamp, 1))


@transaction.atomic
def do_send_test_event(*, subscription: Subscription, now: datetime) -> Delivery:
    """Queue a test event for this one subscription (delivered by a task, like any other).

    Raises :class:`TooManyTests` (nothing queued) past the owner's allowance.
    """
    take_test_allowance(user_id=subscription.owner_id, now=now)
    event_id = f"test_{secrets.token_hex(8)}"
    payload = notices.event_payload(
        event_id=event_id, event_type=TEST_EVENT, at=now, job=None, reason="a test event"
    )
    delivery = Delivery.objects.create(
        subscription=subscription,
        event_id=event_id,
        event_type=TEST_EVENT,
        payload=payload,
        next_attempt_at=now,
        created_at=now,
    )
    audit_record(
        "subscription.test",
        obj=subscription,
        tenant=subscription.tenant,
        after={"event_id": event_id},
        user=subscription.owner,
    )
    enqueue_delivery_on_commit(delivery.pk)
    return delivery


# --- Fan-out: which subscriptions hear of an event -----------------------------------------


def subscriptions_for(job: Job, event_type: str) -> list[Subscription]:
    """The subscriptions that ask for ``event_type`` of ``job``.

    A tenant's subscription counts while its owner belongs to the tenant (or is
    an admin); a "my jobs" one for the jobs its owner submitted.
    """
    wanted = notices.wanted_by(event_type)
    candidates = Subscription.objects.filter(
        Q(tenant_id=job.tenant_id) | Q(tenant__isnull=True, owner_id=job.submitter_id)
    ).select_related("owner")
    members = set(
        Membership.objects.filter(tenant_id=job.tenant_id).values_list("user_id", flat=True)
    )
    return [
        sub
        for sub in candidates
        if wanted.intersection(sub.events)
        and (sub.tenant_id is None or sub.owner_id in members or sub.owner.is_staff)
    ]


@transaction.atomic
def do_fan_out_job_event(*, job_event_id: int, now: datetime) -> list[int]:
    """Make one delivery per subscription that wants this job event; return the new ones' ids.

    Idempotent: a delivery is unique per (subscription, event), so a repeated
    task makes no second one.
    """
    event = (
        JobEvent.objects.select_related("job__tenant", "job__submitter")
        .filter(pk=job_event_id)
        .first()
    )
    if event is None:
        return []
    event_type = notices.classify(kind=event.kind, to_state=event.to_state, reason=event.reason)
    if event_type is None:
        return []
    event_id = notices.job_event_id(event)
    payload = notices.event_payload(
        event_id=event_id, event_type=event_type, at=event.at, job=event.job, reason=event.reason
    )
    return _deliver_to(
        subscriptions_for(event.job, event_type), event_id, event_type, event.job, payload, now
    )


def _deliver_to(
    subscriptions: list[Subscription],
    event_id: str,
    event_type: str,
    job: Job,
    payload: dict[str, Any],
    now: datetime,
) -> list[int]:
    created_ids: list[int] = []
    for sub in subscriptions:
        delivery, created = Delivery.objects.get_or_create(
            subscription=sub,
            event_id=event_id,
            defaults={
                "event_type": event_type,
                "job": job,
                "payload": payload,
                "next_attempt_at": now,
                "created_at": now,
            },
        )
        if created:
            created_ids.append(delivery.pk)
            enqueue_delivery_on_commit(delivery.pk)
    return created_ids


@transaction.atomic
def do_sweep_queued_long(*, now: datetime, batch: int = SWEEP_BATCH) -> list[int]:
    """Notify each queued_long subscription, once per job, of jobs queued past its threshold.

    A job counts as queued since it last entered the queue (submission,
    preemption, retry), so a job requeued after hours of running starts afresh.
    """
    created: list[int] = []
    last_queued = (
        JobEvent.objects.filter(job=OuterRef("pk"), to_state=JobState.QUEUED)
        .order_by("-at")
        .values("at")[:1]
    )
    subs = Subscription.objects.filter(queued_minutes__isnull=False).select_related("owner")
    for sub in subs[:batch]:
        if EventType.QUEUED_LONG not in sub.events or sub.queued_minutes is None:
            continue
        jobs = Job.objects.filter(state__in=(JobState.PENDING, JobState.QUEUED))
        if sub.tenant_id is None:
            jobs = jobs.filter(submitter_id=sub.owner_id)
        elif (
            sub.owner.is_staff
            or Membership.objects.filter(tenant_id=sub.tenant_id, user_id=sub.owner_id).exists()
        ):
            jobs = jobs.filter(tenant_id=sub.tenant_id)
        else:
            continue
        cutoff = now - timedelta(minutes=sub.queued_minutes)
        due = (
            jobs.annotate(queued_since=Coalesce(Subquery(last_queued), F("submitted_at")))
            .filter(queued_since__lte=cutoff)
            .exclude(
                pk__in=Delivery.objects.filter(
                    subscription=sub, event_type=EventType.QUEUED_LONG, job__isnull=False
                ).values("job_id")
            )
            .select_related("tenant", "submitter")
            .order_by("pk")[:batch]
        )
        for job in due:
            minutes = int((now - job.queued_since).total_seconds() // 60)
            event_id = notices.queued_long_id(job.pk)
            payload = notices.event_payload(
                event_id=event_id,
                event_type=EventType.QUEUED_LONG,
                at=now,
                job=job,
                reason=f"queued for {minutes} minutes (threshold {sub.queued_minutes})",
            )
            created += _deliver_to([sub], event_id, EventType.QUEUED_LONG, job, payload, now)
    return created


# --- Attempts ------------------------------------------------------------------------------


def retry_delay_s(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 30 s x 2^(n-1), capped."""
    delay = settings.WEBHOOK_RETRY_BASE_S * 2 ** max(attempts - 1, 0)
    return float(min(delay, settings.WEBHOOK_RETRY_MAX_S))


def _claim(delivery_id: int, now: datetime) -> bool:
    """Take a due, pending delivery for one attempt; False when it is not due or taken."""
    return bool(
        Delivery.objects.filter(
            pk=delivery_id, state=DeliveryState.PENDING, next_attempt_at__lte=now
        ).update(next_attempt_at=now + timedelta(seconds=CLAIM_S))
    )


def _send(delivery: Delivery, now: datetime) -> Outcome:
    sub = delivery.subscription
    if sub.channel == Channel.WEBHOOK:
        return post_webhook(
            url=sub.url,
            secret=sub.secret,
            payload=delivery.payload,
            delivery_id=delivery.pk,
            now=now,
        )
    return send_email(address=sub.email, payload=delivery.payload)


def do_attempt_delivery(*, delivery_id: int, now: datetime) -> AttemptResult | None:
    """Try a due delivery once, log the attempt, and schedule a retry or give up.

    ``now`` is the clock (tests pass theirs). Returns None when the delivery
    is not due, done, taken by another attempt, or gone. No transaction is held
    while the endpoint is called.
    """
    if not _claim(delivery_id, now):
        return None
    delivery = Delivery.objects.select_related("subscription").filter(pk=delivery_id).first()
    if delivery is None:
        return None
    outcome = _send(delivery, now)
    return _record_attempt(delivery, outcome, now)


@transaction.atomic
def _record_attempt(delivery: Delivery, outcome: Outcome, now: datetime) -> AttemptResult | None:
    if not Delivery.objects.filter(pk=delivery.pk).exists():  # deleted while it was sent
        return None
    DeliveryAttempt.objects.create(
        delivery=delivery,
        at=now,
        status_code=outcome.status_code,
        error=outcome.error,
        duration_ms=outcome.duration_ms,
        ok=outcome.ok,
    )
    delivery.attempts += 1
    deadline = delivery.created_at + timedelta(seconds=settings.WEBHOOK_RETRY_FOR_S)
    if outcome.ok:
        delivery.state, delivery.next_attempt_at, delivery.finished_at = (
            DeliveryState.DELIVERED,
            None,
            now,
        )
    elif now >= deadline:
        delivery.state, delivery.next_attempt_at, delivery.finished_at = (
            DeliveryState.FAILED,
            None,
            now,
        )
        log.warning("gave up delivery %s after %s attempts", delivery.pk, delivery.attempts)
    else:
        delivery.next_attempt_at = min(
            now + timedelta(seconds=retry_delay_s(delivery.attempts)), deadline
        )
    delivery.save(update_fields=["attempts", "state", "next_attempt_at", "finished_at"])
    return AttemptResult(outcome, delivery.state, delivery.next_attempt_at)


def due_delivery_ids(*, now: datetime, batch: int = SWEEP_BATCH) -> list[int]:
    """Pending deliveries due for a while: their own task was lost (a worker died, a restart)."""
    cutoff = now - timedelta(seconds=SWEEP_GRACE_S)
    return list(
        Delivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__lte=cutoff)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:batch]
    )


# --- Enqueueing (after commit) -------------------------------------------------------------


def enqueue_delivery(delivery_id: int, eta: datetime | None = None) -> None:
    """Send one ``deliver`` task now (or at ``eta``); a broker outage is left to the sweep."""
    try:
        current_app.send_task(
            DELIVER_TASK, args=[delivery_id], queue=DELIVER_QUEUE, eta=eta, ignore_result=True
        )
    except Exception:  # the sweep finds the delivery due and enqueues it again
        log.warning("could not enqueue delivery %s", delivery_id, exc_info=True)


def enqueue_delivery_on_commit(delivery_id: int) -> None:
    """Enqueue the delivery once the transaction that made it commits."""
    transaction.on_commit(lambda: enqueue_delivery(delivery_id))


def enqueue_job_event(job_event_id: int) -> None:
    """Send the one ``handle_job_event`` task of a job event (called after commit)."""
    try:
        current_app.send_task(
            HANDLE_EVENT_TASK, args=[job_event_id], queue=QUEUE, ignore_result=True
        )
    except Exception:  # the job's life goes on; only this notification is lost
        log.warning("could not enqueue notifications of job event %s", job_event_id, exc_info=True)
