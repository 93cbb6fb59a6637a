"""A straggler report marks its GPU suspect, then shrinks the job around the worker or moves it.

Reports go through the real handler (``handle_report``) against the real
database and Redis, as an agent's would; commands land on the agents' real
queues; placements are the real tick's.  The demo fabric: 2 leaves of 4 GPUs::

    leaf 0: g0 g1 | g2 g3        leaf 1: g4 g5 | g6 g7
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from control.reports import handle_report
from control.stragglers import verdict
from control.tick import ADVISORY_LOCK_ID, run_tick
from inventory.models import Gpu, Server
from inventory.services import suspect_gpus
from jobs.choices import JobState, Launcher
from jobs.models import Job
from tests.jobs.control_helpers import drain_all
from tests.jobs.test_recovered_holdings import held, running, submit
from tests.jobs.test_tick_locks import other_connection

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


def scale_done(job: Job, event_id: str, workers: list[int]) -> dict[str, Any]:
    """The runtime's report that a switch is done, with the members after it."""
    return {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": event_id,
        "world": len(workers),
        "workers": [f"w{g}" for g in workers],
        "step": 60,
        "generation": 2,
    }


def sent(kind: str) -> list[dict[str, Any]]:
    """The commands of type ``kind`` the control plane put on the cluster's agents' queues.

    Only this cluster's nodes (their queues were emptied when it was made): other
    nodes' queues may hold what other tests (or earlier runs) left there.
    """
    nodes = list(Server.objects.values_list("node", flat=True))
    return [c for cmds in drain_all(nodes).values() for c in cmds if c["type"] == kind]


def suspect_until(gpu: int) -> datetime | None:
    """When GPU ``gpu``'s mark lapses (None: never marked)."""
    return Gpu.objects.get(index=gpu).suspect_until


def last_straggler_event(job: Job) -> Any:
    return job.events.filter(kind="straggler").latest("id")


def test_a_straggler_is_removed_its_gpu_marked_and_freed(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    keep, slow = held(job)
    before = timezone.now()
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "straggler removed"
    job.refresh_from_db()
    assert job.state == "scaling"
    event = last_straggler_event(job)
    assert event.data["action"] == "removed" and event.data["removed"] is True
    assert (event.data["worker"], event.data["gpu"], event.data["ratio"]) == (f"w{slow}", slow, 1.5)
    assert event.reason.startswith(f"straggler detected: worker w{slow} on GPU {slow}")
    assert "removing it: scale-in 2→1 GPUs" in event.reason
    assert f"GPU {slow} suspect until" in event.reason
    assert [c["worker_ids"] for c in sent("scale_in")] == [[f"w{slow}"]]
    # Marked for the cool-down (600 s by default), naming the job and why.
    until = suspect_until(slow)
    assert until is not None and 590 < (until - before).total_seconds() < 610
    (mark,) = suspect_gpus()
    assert (mark.index, mark.job_id) == (slow, job.pk) and "1.50x slower" in mark.reason
    assert event.data["suspect_until"] == until.isoformat()
    # The runtime carries the scale-in out; its scale_done frees the GPU.
    assert handle_report(scale_done(job, "1700000000020-0", [keep])) == "scaled"
    job.refresh_from_db()
    assert (job.state, job.parallelism, held(job)) == ("running", 1, [keep])
    # Replayed by a second agent: applied once.
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "duplicate"


def test_the_freed_suspect_gpu_is_not_handed_to_the_next_job(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    keep, slow = held(job)
    handle_report(straggler(job, "1700000000010-0", f"w{slow}"))
    handle_report(scale_done(job, "1700000000020-0", [keep]))
    sent("scale_in")
    # Jobs that would take every free GPU get the seven others; the eighth waits.
    jobs = [submit(alice, acme, gpus=n) for n in (4, 2, 1)]
    run_tick(policy="fifo")
    for other in jobs:
        other.refresh_from_db()
    four, two, one = jobs
    assert (four.state, two.state) == ("running", "running") and slow not in held(four) + held(two)
    assert sorted(held(four) + held(two) + held(job)) == [g for g in range(8) if g != slow]
    assert one.state == "queued" and held(one) == []


def test_a_straggler_at_the_minimum_moves_to_a_free_gpu_of_its_leaf(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=2)
    keep, slow = held(job)
    assert (keep, slow) == (0, 1)
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "straggler moved"
    job.refresh_from_db()
    # Moved as the tick migrates: at once in the database, one switch for the runtime.
    assert job.state == "scaling" and held(job) == [keep, 2]
    assert job.allocation["gpus"] == [keep, 2] and job.allocation["leaves"] == [0]
    event = last_straggler_event(job)
    assert (event.data["action"], event.data["to_gpu"], event.data["removed"]) == (
        "moved",
        2,
        False,
    )
    assert "moved to GPU 2 (one switch, no stop; GPU 1 freed): the job is at its minimum" in (
        event.reason
    )
    assert job.events.filter(kind="migrated", data={"from": [keep, slow], "to": [keep, 2]}).exists()
    (migrate,) = sent("migrate")
    assert migrate["leaving"] == [f"w{slow}"] and migrate["joiners"] == 1
    assert [w["worker_id"] for w in migrate["joining"]["workers"]] == ["w2"]
    assert sent("scale_in") == []
    assert suspect_until(slow) is not None
    assert handle_report(scale_done(job, "1700000000020-0", [keep, 2])) == "scaled"
    job.refresh_from_db()
    assert (job.state, job.parallelism, held(job)) == ("running", 2, [keep, 2])


def test_a_straggler_at_the_minimum_on_a_full_leaf_is_kept_and_says_why(
    alice: Any, acme: Any
) -> None:
    job = running(alice, acme, gpus=4, lo=4)
    before = held(job)
    assert sorted(before) == [0, 1, 2, 3]  # one leaf, whole: leaf 1 is free but no shape
    assert handle_report(straggler(job, "1700000000010-0", f"w{before[2]}")) == "straggler"
    job.refresh_from_db()
    assert (job.state, held(job)) == ("running", before)
    event = last_straggler_event(job)
    assert event.data["action"] == "kept" and event.data["removed"] is False
    assert "kept: the job is at its minimum of 4 GPUs, and no free GPU of an allowed shape" in (
        event.reason
    )
    assert "leaf 0" in event.data["why"]
    assert sent("scale_in") == [] and sent("migrate") == []
    # Kept, but still marked: once the job leaves it, no new placement lands there.
    assert suspect_until(before[2]) is not None


def test_with_no_cool_down_nothing_is_marked(alice: Any, acme: Any, settings: Any) -> None:
    settings.STRAGGLER_COOLDOWN_SECONDS = 0
    job = running(alice, acme, gpus=2, lo=2)
    _, slow = held(job)
    assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "straggler moved"
    job.refresh_from_db()
    assert slow not in held(job) and suspect_until(slow) is None and suspect_gpus() == []
    event = last_straggler_event(job)
    assert "suspect" not in event.reason and "suspect_until" not in event.data


def test_a_report_older_than_the_cool_down_marks_nothing(alice: Any, acme: Any) -> None:
    """A report that waited in a backlog longer than the cool-down: its mark would have lapsed."""
    job = running(alice, acme, gpus=2, lo=1)
    _, slow = held(job)
    report = {**straggler(job, "1700000000010-0", f"w{slow}"), "at": time.time() - 700}
    assert handle_report(report) == "straggler removed"
    assert suspect_until(slow) is None


@pytest.mark.parametrize("worker", ["w999", "x", "w-1", "w"])
def test_a_straggler_the_job_does_not_hold_changes_nothing(
    alice: Any, acme: Any, worker: str
) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    before = held(job)
    assert handle_report(straggler(job, "1700000000010-0", worker)) == "straggler"
    job.refresh_from_db()
    assert (job.state, held(job)) == ("running", before)
    assert sent("scale_in") == [] and suspect_gpus() == []
    assert last_straggler_event(job).data["action"] == "kept"


def test_a_report_cannot_remove_or_mark_another_tenants_worker(
    alice: Any, acme: Any, bob: Any, globex: Any
) -> None:
    """Job A's report naming job B's worker: B keeps it, unmarked; A has no such worker."""
    mine = running(alice, acme, gpus=2, lo=1)
    theirs = running(bob, globex, gpus=2, lo=1)
    victim = held(theirs)[0]
    assert handle_report(straggler(mine, "1700000000010-0", f"w{victim}")) == "straggler"
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert held(theirs)[0] == victim and theirs.state == "running"
    assert mine.state == "running" and len(held(mine)) == 2
    assert sent("scale_in") == [] and suspect_until(victim) is None


def test_a_bad_ratio_is_refused_and_changes_nothing(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    before = held(job)
    report = straggler(job, "1700000000010-0", f"w{before[1]}")
    report["ratio"] = "fast"
    assert handle_report(report) != "straggler removed"
    job.refresh_from_db()
    assert (job.state, held(job)) == ("running", before)
    assert not job.events.filter(kind="straggler").exists()
    assert suspect_gpus() == []


def test_a_torchrun_program_keeps_its_straggler_and_a_busy_job_too() -> None:
    """The verdict on the job's row alone (a torchrun program needs a code bundle to run)."""
    program = Job(state=JobState.RUNNING, code_id=1, launcher=Launcher.TORCHRUN, min_gpus=1)
    found = verdict(program, 3, (2, 3, 4))
    assert found.action == "keep" and "costs more than a straggler" in found.why
    switching = Job(state=JobState.SCALING, min_gpus=1)
    assert verdict(switching, 3, (2, 3)).why == "the job is scaling"
    assert verdict(Job(state=JobState.RUNNING, min_gpus=2), 3, (2, 3)).action == "move"
    assert verdict(Job(state=JobState.RUNNING, min_gpus=1), 3, (2, 3)).action == "remove"


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="the tick's lock is a PostgreSQL advisory lock",
)
def test_a_move_does_not_wait_for_a_tick_in_flight(alice: Any, acme: Any) -> None:
    """Another session holds the tick's lock: the move goes ahead (it never waits: no deadlock)."""
    job = running(alice, acme, gpus=2, lo=2)
    keep, slow = held(job)
    other = other_connection()
    other.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_LOCK_ID])
    try:
        assert handle_report(straggler(job, "1700000000010-0", f"w{slow}")) == "straggler moved"
    finally:
        other.close()
    assert held(job) == [keep, 2]
