"""What the control plane believes of a job's own channel, and the loops it must not enter.

* dropped runtime events reach the job's history as a count the tenant sees;
* reconcile requeues a job with no process a bounded number of times without
  progress, then fails it with a reason (a program that never keeps running
  was placed, found empty and requeued every 45 s for ever);
* an agent's refusal to start a job (its slot busy) requeues the job with the
  reason, keeps the busy GPU out of placement and finds the slot's owner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from control.reports import handle_report
from control.tick import run_tick
from inventory.models import Gpu
from jobs.agent_trust import forget_hosted
from jobs.models import Job, JobGpu
from tests.jobs.control_helpers import drain_all
from tests.jobs.test_reconcile import at, heartbeat, placed, reconcile_now, submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_dropped_runtime_events_are_counted_in_the_jobs_history(alice: Any, acme: Any) -> None:
    job, nodes, _start = placed(alice, acme)
    report = {
        "type": "events_dropped",
        "node": nodes[0],
        "job": f"job-{job.pk}",
        "count": 3,
        "reason": "failed event holds text that does not encode (a lone surrogate)",
        "first_event_id": "1700000000000-0",
        "last_event_id": "1700000000000-2",
    }
    assert handle_report(report) == "events dropped"
    note = job.events.filter(kind="note").latest("id")
    assert note.reason.startswith(f"3 malformed events dropped by {nodes[0]}: failed event")
    assert note.data["events_dropped"] == 3
    job.refresh_from_db()
    assert job.state == "running"  # a count changes nothing else


def test_reconcile_requeues_without_progress_a_bounded_number_of_times(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    """A job whose processes never show up is not placed and requeued for ever."""
    with override_settings(ARTIFACT_URL=f"file://{tmp_path}", RECONCILE_MAX_REQUEUES=2):
        job, nodes, start = placed(alice, acme)
        t = 0.0
        for _ in range(2):
            t += 76
            heartbeat(nodes, at(t, start))  # never listed since its placement
            assert reconcile_now(at(t, start)) == [job.pk]
            job.refresh_from_db()
            assert job.state == "queued"
            t += 1
            run_tick(policy="fifo", now=at(t, start))  # placed again
            job.refresh_from_db()
            assert job.state == "running"
        t += 76
        heartbeat(nodes, at(t, start))
        assert reconcile_now(at(t, start)) == [job.pk]
    job.refresh_from_db()
    assert job.state == "failed", "requeued a third time without progress"
    assert "requeued 2 times already without progress past step 0" in job.failure_reason
    assert not JobGpu.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).parallelism == 0


def test_a_start_refused_for_a_busy_slot_requeues_the_job_and_finds_the_owner(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    """The slot busy with an ended job's leftover: requeued with the reason, the GPU kept out."""
    with override_settings(ARTIFACT_URL=f"file://{tmp_path}"):
        job, nodes, _start = placed(alice, acme, gpus=1)
        [gpu] = JobGpu.objects.filter(job=job).values_list("gpu__index", flat=True)
        home = Gpu.objects.select_related("server").get(index=gpu)
        ended = submit(alice, acme, gpus=1)
        Job.objects.filter(pk=ended.pk).update(state="failed")
        report = {
            "type": "rejected",
            "node": home.server.node,
            "job": f"job-{job.pk}",
            "command_id": "start-1",
            "command_type": "start_workers",
            "error": f"slot {home.local} is busy with worker w{gpu} of job job-{ended.pk}",
            "busy_slot": home.local,
            "busy_job": f"job-{ended.pk}",
            "busy_worker": f"w{gpu}",
        }
        assert handle_report(report, signed_by=home.server.node) == "requeued"
    job.refresh_from_db()
    assert job.state == "queued"
    assert not JobGpu.objects.filter(job=job).exists()
    assert f"{home.server.node} refused to start it: slot" in job.events.latest("id").reason
    home.refresh_from_db()
    assert home.suspect_until is not None and "busy with" in home.suspect_reason
    stops = [c for c in drain_all(nodes)[home.server.node] if c["type"] == "stop_job"]
    assert [c["job"] for c in stops] == [f"job-{ended.pk}"]  # the leftover is stopped
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert gpu not in JobGpu.objects.filter(job=job).values_list("gpu__index", flat=True)
    assert handle_report(report, signed_by=home.server.node) == "rejected"  # stale now


def test_a_refused_start_is_believed_only_from_a_node_that_hosts_the_job(
    alice: Any, acme: Any
) -> None:
    job, nodes, _start = placed(alice, acme, gpus=1)
    [gpu] = JobGpu.objects.filter(job=job).values_list("gpu__index", flat=True)
    stranger = next(n for n in nodes if n != Gpu.objects.get(index=gpu).server.node)
    forget_hosted(stranger, [f"job-{job.pk}"])  # what an earlier test's job of this id left
    report = {
        "type": "rejected",
        "node": stranger,
        "job": f"job-{job.pk}",
        "command_type": "start_workers",
        "error": "slot 0 is busy",
    }
    assert handle_report(report, signed_by=stranger) == "refused: not hosted"
    job.refresh_from_db()
    assert job.state == "running"


def test_a_refusal_marks_and_stops_nothing_on_another_nodes_gpus(alice: Any, acme: Any) -> None:
    """A node speaks of its own slots: naming another node's worker as the holder changes nothing."""
    job, nodes, _start = placed(alice, acme, gpus=1)
    [gpu] = JobGpu.objects.filter(job=job).values_list("gpu__index", flat=True)
    here = Gpu.objects.select_related("server").get(index=gpu).server.node
    far = Gpu.objects.exclude(server__node=here).order_by("index").first()
    assert far is not None
    ended = submit(alice, acme, gpus=1)
    Job.objects.filter(pk=ended.pk).update(state="failed")
    report = {
        "type": "rejected",
        "node": here,
        "job": f"job-{job.pk}",
        "command_type": "start_workers",
        "error": "slot 7 is busy",
        "busy_slot": 7,
        "busy_job": f"job-{ended.pk}",
        "busy_worker": f"w{far.index}",
    }
    handle_report(report, signed_by=here)
    far.refresh_from_db()
    assert far.suspect_until is None
    commands = drain_all(nodes)
    assert not [c for c in commands[far.server.node] if c["job"] == f"job-{ended.pk}"]
