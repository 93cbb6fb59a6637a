"""A job's runtime says who left; its agents' own process tables decide whether that is believed.

The ``recovered`` and ``scale_done`` events come from the tenant's program.
Forged, they freed GPU rows while the processes kept training, unbilled.
A leaver's GPU is now freed only when its agent reported its exit, or when
its node beat after the event without it; else it stays held (and billed)
until the agent reports the exit.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.utils import timezone

from control.reports import handle_report
from inventory.models import Gpu
from inventory.services import do_heartbeat
from jobs.models import Job
from tests.jobs.test_recovered_holdings import held, recovered, running
from workers.protocol import Heartbeat, RunningWorker

pytestmark = pytest.mark.django_db(transaction=True)


def now_id(offset_s: float = -10.0) -> str:
    """A stream id of a moment ``offset_s`` from now (before the heartbeats below)."""
    return f"{int((time.time() + offset_s) * 1000)}-0"


def beat_listing(job: Job, gpus: list[int]) -> None:
    """Each GPU's agent beats now, listing the job's worker on it: its process still runs."""
    for gpu in gpus:
        row = Gpu.objects.select_related("server").get(index=gpu)
        worker = RunningWorker(job=f"job-{job.pk}", worker_id=f"w{gpu}", slot=row.local, pid=4242)
        beat = Heartbeat(
            node=row.server.node, device="cpu", slots=2, free_slots=(), workers=(worker,)
        )
        assert do_heartbeat(node=row.server.node, info=beat.to_dict(), at=timezone.now())


def exited(job: Job, gpu: int) -> dict[str, Any]:
    node = Gpu.objects.select_related("server").get(index=gpu).server.node
    return {
        "type": "worker_exited",
        "node": node,
        "job": f"job-{job.pk}",
        "worker_id": f"w{gpu}",
        "slot": 0,
        "exit_code": 0,
        "outcome": "clean",
    }


def test_a_forged_recovery_frees_no_gpu_its_agent_still_runs(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    keep, claimed = held(job)
    beat_listing(job, [keep, claimed])  # both processes train on
    assert handle_report(recovered(job, now_id(), [f"w{claimed}"], 1)) == "recovered"
    assert held(job) == [keep, claimed], "a forged recovery freed a GPU still in use"
    job.refresh_from_db()
    assert (job.state, job.parallelism) == ("running", 2)  # still billed for both
    note = job.events.filter(kind="note").latest("id")
    assert f"w{claimed} left, but their agents still run them" in note.reason
    # Its agent reports the exit: now the claim is true, the GPU is freed.
    assert handle_report(exited(job, claimed)) == "freed"
    job.refresh_from_db()
    assert held(job) == [keep] and job.parallelism == 1


def test_a_forged_scale_done_frees_no_gpu_its_agent_still_runs(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    keep, claimed = held(job)
    beat_listing(job, [keep, claimed])
    report = {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": now_id(),
        "world": 1,
        "step": 50,
        "generation": 4,
        "workers": [f"w{keep}"],
    }
    handle_report(report)
    assert held(job) == [keep, claimed]
    job.refresh_from_db()
    assert job.parallelism == 2


def test_a_recovery_after_the_agent_reported_the_exit_frees_the_gpu(alice: Any, acme: Any) -> None:
    """The exit came first (the heartbeat still listing it is older than the event)."""
    job = running(alice, acme, gpus=2, lo=1)
    keep, dead = held(job)
    beat_listing(job, [keep, dead])
    handle_report(exited(job, dead))
    assert handle_report(recovered(job, now_id(+5), [f"w{dead}"], 1)) == "recovered"
    assert held(job) == [keep]
