"""Email notifications: Django's outbox, and once through a real SMTP server on loopback."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from email import message_from_bytes
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.utils import timezone

from devtools.job_steps import move
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from notifications.choices import DeliveryState
from notifications.models import Subscription
from notifications.services import do_attempt_delivery, do_fan_out_job_event
from portal.settings.mail import mail_settings

pytestmark = pytest.mark.django_db


class Inbox:
    """An aiosmtpd handler that keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], bytes]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 OK"


@pytest.fixture
def smtp_server() -> Iterator[tuple[Inbox, int]]:
    """A real SMTP server on 127.0.0.1 (aiosmtpd), on a free port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


def completed_job(user: Any, tenant: Any, submit: Callable[..., Job]) -> JobEvent:
    job = submit(user, tenant)
    move(job_id=job.pk, to_state=JobState.RUNNING, reason="placed", parallelism=1)
    move(job_id=job.pk, to_state=JobState.COMPLETED, reason="done")
    return JobEvent.objects.get(job=job, to_state=JobState.COMPLETED)


def test_an_email_lands_in_the_outbox(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    mailoutbox: list[Any],
) -> None:
    subscribe(alice, events=["completed"], channel="email", email="alice@example.com")
    event = completed_job(alice, acme, submit)
    [delivery_id] = do_fan_out_job_event(job_event_id=event.pk, now=timezone.now())
    result = do_attempt_delivery(delivery_id=delivery_id, now=timezone.now())
    assert result is not None and result.state == DeliveryState.DELIVERED
    [mail] = mailoutbox
    assert mail.to == ["alice@example.com"]
    assert f"job {event.job_id} (train): completed" in mail.subject
    assert f"/jobs/{event.job_id}/" in mail.body and '"type": "job.completed"' in mail.body


def test_an_email_goes_through_a_real_smtp_server(
    alice: Any,
    acme: Any,
    submit: Callable[..., Job],
    subscribe: Callable[..., Subscription],
    smtp_server: tuple[Inbox, int],
    settings: Any,
) -> None:
    inbox, port = smtp_server
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.DEFAULT_FROM_EMAIL = "portal@example.com"
    subscribe(alice, events=["completed"], channel="email", email="alice@example.com")
    event = completed_job(alice, acme, submit)
    [delivery_id] = do_fan_out_job_event(job_event_id=event.pk, now=timezone.now())
    result = do_attempt_delivery(delivery_id=delivery_id, now=timezone.now())
    assert result is not None and result.state == DeliveryState.DELIVERED
    [(sender, recipients, content)] = inbox.messages
    assert (sender, recipients) == ("portal@example.com", ["alice@example.com"])
    message = message_from_bytes(content)
    assert f"job {event.job_id}" in str(message["Subject"])


def test_a_mail_server_that_is_down_is_a_failed_attempt_retried_later(
    alice: Any, subscribe: Callable[..., Subscription], settings: Any
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nobody listens
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    sub = subscribe(alice, events=["completed"], channel="email", email="alice@example.com")
    from notifications.services import do_send_test_event

    delivery = do_send_test_event(subscription=sub, now=timezone.now())
    result = do_attempt_delivery(delivery_id=delivery.pk, now=timezone.now())
    assert result is not None and result.state == DeliveryState.PENDING
    assert "ConnectionRefusedError" in result.outcome.error


def test_email_url_and_the_usual_variables() -> None:
    usual = {
        "host": "mail",
        "port": 25,
        "user": "",
        "password": "",
        "use_tls": False,
        "use_ssl": False,
    }
    parsed = mail_settings(url="smtp://u%40x:p%2Fw@smtp.example.com:587?tls=1", **usual)
    assert (parsed.host, parsed.port, parsed.user, parsed.password) == (
        "smtp.example.com",
        587,
        "u@x",
        "p/w",
    )
    assert parsed.use_tls and not parsed.use_ssl
    implicit = mail_settings(url="smtps://smtp.example.com", **usual)
    assert (implicit.port, implicit.use_ssl, implicit.use_tls) == (465, True, False)
    assert mail_settings(url="", **usual).host == "mail"
    with pytest.raises(ValueError, match="smtp:// or smtps://"):
        mail_settings(url="http://mail", **usual)
    with pytest.raises(ValueError, match="exclude each other"):
        mail_settings(url="smtps://mail?tls=1", **usual)
