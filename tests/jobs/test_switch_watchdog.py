"""A job whose switch no report ever confirms is stopped and requeued, not left ``scaling``.

Real database and Redis; the tick runs with an injected clock, and the switch
is one the control plane began (a resize to 4) whose ``scale_done`` never came.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings

from control.reports import handle_report
from control.switch_watchdog import overdue_switches
from control.tick import run_tick
from jobs.agent_commands import runtime_job_name
from jobs.lifecycle import transition
from jobs.models import JobGpu
from tests.jobs.control_helpers import drain_all
from tests.jobs.test_reconcile import at, heartbeat, hosts, placed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_only_switches_older_than_the_timeout_are_overdue() -> None:
    since = {3: T0, 1: T0 + timedelta(seconds=1), 2: T0 + timedelta(seconds=100)}
    now = T0 + timedelta(seconds=301)
    assert overdue_switches(since, now, 300) == [1, 3]
    assert overdue_switches(since, now, 302) == []
    assert overdue_switches({}, now, 0) == []


@pytest.mark.django_db(transaction=True)
@override_settings(SCALING_TIMEOUT_SECONDS=300)
def test_a_switch_never_confirmed_is_stopped_requeued_and_placed_again(
    alice: Any, acme: Any
) -> None:
    job, nodes, start = placed(alice, acme)
    [home] = hosts(job)
    transition(job, "scaling", reason="switching 2→2 GPUs without stopping", at=at(10, start))
    heartbeat(nodes, at(300, start), {home: [job]})  # it trains: the heartbeats list it
    run_tick(policy="fifo", now=at(309, start))
    job.refresh_from_db()
    assert job.state == "scaling"  # 299 s: still the runtime's
    assert not any(c["type"] == "stop_job" for cmds in drain_all(nodes).values() for c in cmds)

    heartbeat(nodes, at(310, start), {home: [job]})
    result = run_tick(policy="fifo", now=at(310, start))
    assert job.pk in result.changed_jobs
    job.refresh_from_db()
    assert (job.state, job.parallelism) == ("queued", 0)
    assert not JobGpu.objects.filter(job=job).exists()
    event = job.events.order_by("-pk").first()
    assert event is not None and event.reason.startswith("switch not confirmed within 300 s")
    commands = drain_all(nodes)
    stops = [c for c in commands[home] if c["type"] == "stop_job"]
    assert [c["job"] for c in stops] == [runtime_job_name(job.pk)]

    # The confirmation that comes after all changes nothing.
    done = {"type": "scale_done", "node": home, "job": runtime_job_name(job.pk),
            "event_id": "1700000000000-1", "world": 2, "step": 5, "workers": ["w0", "w1"],
            "at": at(311, start).timestamp()}  # fmt: skip
    assert handle_report(done) == "noted"
    job.refresh_from_db()
    assert job.state == "queued"
    # The next tick places it again.
    heartbeat(nodes, at(312, start))
    run_tick(policy="fifo", now=at(312, start))
    job.refresh_from_db()
    assert job.state == "running" and JobGpu.objects.filter(job=job).count() == 2
