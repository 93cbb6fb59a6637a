"""Reports survive the outages promised: age judged at first receipt, retries for 20+ minutes.

Through the real report task and ``jobs.agent_trust`` with the real database
and cache (Redis). The fault test with PostgreSQL really stopped is
``tests/faults/test_postgres_outage.py``; these are its pure and in-process halves.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from django.conf import settings

from control.reports import handle_signed_report
from control.tasks import agent_report, report_retry_schedule
from jobs import agent_trust
from jobs.models import Job, JobEvent
from tests.jobs.test_report_trust import envelope, finished, gpus_by_node, running, snapshot
from workers.protocol import Heartbeat
from workers.signing import SignatureError

__all__ = ["running"]  # the fixture, shared with test_report_trust

OUTAGE_PROMISED_S = 20 * 60


def test_the_default_retry_schedule_outlives_a_20_minute_outage() -> None:
    pauses = report_retry_schedule(
        settings.AGENT_REPORT_RETRY_FOR_SECONDS, settings.AGENT_REPORT_RETRY_BACKOFF_MAX_SECONDS
    )
    assert sum(pauses) >= OUTAGE_PROMISED_S, f"retries end after {sum(pauses):.0f} s"
    assert pauses[:5] == [1.0, 2.0, 4.0, 8.0, 16.0] and max(pauses) == 30.0
    # First receipts are remembered past the last retry: no retry is judged afresh.
    assert agent_trust.receipt_memory_s() > sum(pauses)


def test_the_broker_gives_a_lost_message_back_inside_the_signing_window() -> None:
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert 0 < visibility < settings.AGENT_MESSAGE_MAX_AGE_SECONDS
    assert agent_report.acks_late and agent_report.reject_on_worker_lost


def heartbeat_envelope(at: float) -> dict[str, Any]:
    node = f"receipt-{uuid.uuid4().hex[:8]}"
    beat = Heartbeat(node=node, slots=1, device="cpu", free_slots=[0], workers=[])
    return envelope(beat, at=at)


@pytest.mark.django_db
def test_an_envelope_is_judged_at_its_first_receipt_not_at_each_retry() -> None:
    window = float(settings.AGENT_MESSAGE_MAX_AGE_SECONDS)
    signed_at = time.time()
    sealed = heartbeat_envelope(signed_at)
    agent_trust.open_report(sealed, now=signed_at + 5)  # first receipt: fresh
    # The database was down; the task retries the same message a whole window later.
    again = agent_trust.open_report(sealed, now=signed_at + window + 600)
    assert again.body["type"] == "heartbeat"
    # An envelope first seen that late is stale: the window still bounds a replay.
    with pytest.raises(SignatureError, match="stale"):
        agent_trust.open_report(heartbeat_envelope(signed_at), now=signed_at + window + 600)


@pytest.mark.django_db
def test_a_forged_envelope_records_no_receipt() -> None:
    sealed = {**heartbeat_envelope(time.time()), "sig": "0" * 64}
    with pytest.raises(SignatureError, match="bad signature"):
        agent_trust.open_report(sealed)
    assert agent_trust.first_receipt("0" * 64, 1.0) == 1.0  # nothing was remembered before


@pytest.mark.django_db(transaction=True)
def test_a_redelivered_report_changes_nothing_twice(running: tuple[Job, list[str]]) -> None:
    job, _ = running
    host = next(iter(gpus_by_node(job)))
    sealed = envelope(finished(job, host))
    first = agent_report(sealed)
    assert first != "duplicate" and not first.startswith("refused"), first
    after_once = snapshot(job)
    events = JobEvent.objects.filter(job=job).count()
    # The worker died before its ack: the broker gives the same message again.
    assert agent_report(sealed) == "duplicate: applied already"
    assert handle_signed_report(sealed) == "duplicate: applied already"
    assert snapshot(job) == after_once
    assert JobEvent.objects.filter(job=job).count() == events
