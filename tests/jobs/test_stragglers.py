"""A straggler report shrinks the job around that worker (issue 20's control-plane loop).

Reports go through the real handler (``handle_report``) against the real
database and Redis, as an agent's would; commands land on the agents' real queues.
"""

from __future__ import annotations

from typing import Any

import pytest

from inventory.models import Server
from jobs.control.reports import handle_report
from jobs.models import Job
from tests.jobs.control_helpers import drain_all
from tests.jobs.test_recovered_holdings import held, running

pytestmark = pytest.mark.django_db(transaction=True)


def straggler(job: Job, event_id: str, worker: str, ratio: float = 1.5) -> dict[str, Any]:
    """The ``straggler`` report an agent forwards from the runtime's event stream."""
    return {
        "type": "straggler",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": event_id,
        "worker_id": worker,
        "ratio": ratio,
    }


def sent(kind: str) -> list[dict[str, Any]]:
    """The commands of type ``kind`` the control plane put on the cluster's agents' queues.

    Only this cluster's nodes (their queues were emptied when it was made): other
    nodes' queues may hold what other tests (or earlier runs) left there.
    """
    nodes = list(Server.objects.values_list("node", flat=True))
    return [c for cmds in drain_all(nodes).values() for c in cmds if c["type"] == kind]


def test_a_straggler_is_removed_and_its_gpu_freed(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    keep, slow = held(job)
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "straggler removed"
    job.refresh_from_db()
    assert job.state == "scaling"
    event = job.events.filter(kind="straggler").latest("id")
    assert event.data == {"worker": f"w{slow}", "ratio": 1.5, "removed": True}
    assert "removing it" in event.reason
    assert [c["worker_ids"] for c in sent("scale_in")] == [[f"w{slow}"]]
    # The runtime carries the scale-in out; its scale_done frees the GPU.
    done = {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "1700000000020-0",
        "world": 1,
        "workers": [f"w{keep}"],
        "leavers": [f"w{slow}"],
        "step": 60,
        "generation": 2,
    }
    assert handle_report(done) == "scaled"
    job.refresh_from_db()
    assert (job.state, job.parallelism, held(job)) == ("running", 1, [keep])
    # Replayed by a second agent: applied once.
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "duplicate"


def test_a_straggler_at_the_minimum_is_kept_and_the_history_says_why(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=2)
    before = held(job)
    assert handle_report(straggler(job, "1700000000010-0", f"w{before[1]}")) == "straggler"
    job.refresh_from_db()
    assert (job.state, held(job)) == ("running", before)
    event = job.events.filter(kind="straggler").latest("id")
    assert "kept: the job is at its minimum of 2 GPUs" in event.reason
    assert event.data["removed"] is False
    assert sent("scale_in") == []


@pytest.mark.parametrize("worker", ["w999", "x", "w-1", "w"])
def test_a_straggler_the_job_does_not_hold_changes_nothing(
    alice: Any, acme: Any, worker: str
) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    before = held(job)
    assert handle_report(straggler(job, "1700000000010-0", worker)) == "straggler"
    job.refresh_from_db()
    assert (job.state, held(job)) == ("running", before)
    assert sent("scale_in") == []


def test_a_report_cannot_remove_another_tenants_worker(
    alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    """Job A's report naming job B's worker: B keeps it, A has no such worker."""
    mine = running(alice, acme, gpus=2, lo=1)
    theirs = running(bob, globex, gpus=2, lo=1)
    victim = held(theirs)[0]
    assert handle_report(straggler(mine, "1700000000010-0", f"w{victim}")) == "straggler"
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert held(theirs)[0] == victim and theirs.state == "running"
    assert mine.state == "running" and len(held(mine)) == 2
    assert sent("scale_in") == []


def test_a_bad_ratio_is_refused_and_changes_nothing(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    before = held(job)
    report = straggler(job, "1700000000010-0", f"w{before[1]}")
    report["ratio"] = "fast"
    assert handle_report(report) != "straggler removed"
    job.refresh_from_db()
    assert (job.state, held(job)) == ("running", before)
    assert not job.events.filter(kind="straggler").exists()
