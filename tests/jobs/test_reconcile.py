"""The tick reconciles the database with the agents' heartbeats: no GPU held by a dead job.

Real database and Redis; heartbeats go through ``do_heartbeat`` with the
protocol's own ``Heartbeat`` messages, at chosen times, and the tick runs with
an injected clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from control.reconcile import HeldJob, Limits, ServerBeats, find_orphans, reconcile
from control.reports import handle_report
from control.state import read_cluster
from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_heartbeat, jobs_seen, sent_at
from jobs.agent_commands import runtime_job_name
from jobs.artifacts import prefix_of
from jobs.models import Job, JobEvent, JobGpu
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster, drain_all
from tests.jobs.test_programs import submit_program
from workers.artifacts import ArtifactStore
from workers.elastic.checkpoint import Checkpoints
from workers.protocol import Heartbeat, RunningWorker

LIMITS = Limits(vanished_s=15.0, never_started_s=75.0)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float, start: datetime = T0) -> datetime:
    return start + timedelta(seconds=seconds)


# --------------------------------------------------------------------------- pure core


def beats(last: float | None, seen: dict[str, float] | None = None, live: bool = True) -> Any:
    return ServerBeats(
        node="n",
        live=live,
        last_heartbeat=None if last is None else at(last),
        seen={job: at(s) for job, s in (seen or {}).items()},
    )


@pytest.mark.parametrize(
    ("server", "orphaned"),
    [
        (beats(16.0, {"job-1": 0.5}), True),  # listed once, then 15.5 s of beats without it
        (beats(14.0, {"job-1": 0.5}), False),  # within the limit
        (beats(30.0, {"job-1": 20.0}), False),  # listed 10 s before the latest beat
        (beats(40.0, {"job-1": 20.0}), True),  # listed, then 20 s without it
        (beats(60.0), False),  # never listed since placement: the agent may still wait
        (beats(76.0), True),  # ... but not longer than the start limit
        (beats(100.0, {"job-1": -5.0}), True),  # listed only before its placement
        (beats(None), False),  # never beat: nothing to judge
        (beats(100.0, live=False), False),  # down: the server-down path's, not ours
        (beats(100.0, {"job-1": 99.0, "job-2": 1.0}), False),  # other jobs do not count
    ],
)
def test_a_job_is_orphaned_only_after_beats_without_it_for_the_limit(
    server: ServerBeats, orphaned: bool
) -> None:
    job = HeldJob(job_id=1, name="job-1", nodes=("n",), since=T0)
    found = find_orphans([job], {"n": server}, LIMITS)
    assert bool(found) is orphaned
    if orphaned:
        assert found[0].job_id == 1 and found[0].silent_s >= LIMITS.vanished_s


def test_a_job_listed_by_any_one_of_its_servers_is_alive() -> None:
    job = HeldJob(job_id=1, name="job-1", nodes=("a", "b"), since=T0)
    silent = ServerBeats("a", True, at(100), {})
    listing = ServerBeats("b", True, at(100), {"job-1": at(99)})
    assert find_orphans([job], {"a": silent, "b": listing}, LIMITS) == []
    gone = ServerBeats("b", True, at(100), {"job-1": at(70)})
    [orphan] = find_orphans([job], {"a": silent, "b": gone}, LIMITS)
    assert (orphan.nodes, orphan.silent_s, orphan.ever_listed) == (("a", "b"), 30.0, True)
    # A server missing from the view (removed, renamed): cannot judge, leave it.
    assert find_orphans([job], {"a": silent}, LIMITS) == []


def test_a_command_after_the_last_listing_restarts_the_count() -> None:
    resized = HeldJob(job_id=1, name="job-1", nodes=("n",), since=at(50))
    server = ServerBeats("n", True, at(100), {"job-1": at(10)})
    assert find_orphans([resized], {"n": server}, LIMITS) == []  # 50 s < the start limit
    later = ServerBeats("n", True, at(130), {"job-1": at(10)})
    [orphan] = find_orphans([resized], {"n": later}, LIMITS)
    assert not orphan.ever_listed and orphan.silent_s == 80.0


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"at": 1767225600.0}, at(0)),  # sent at T0, arrived 10 s later
        ({"at": 1767225600.0 + 3600}, at(10)),  # a clock ahead: never later than arrival
        ({}, at(10)),
        ({"at": "soon"}, at(10)),
        ({"at": True}, at(10)),
        ({"at": float("nan")}, at(10)),
        ({"at": float("inf")}, at(10)),
        ({"at": 1e300}, at(10)),
    ],
)
def test_a_heartbeat_counts_from_when_it_was_sent(info: dict[str, Any], expected: Any) -> None:
    assert sent_at(info, received=at(10)) == expected


@pytest.mark.parametrize(
    "agent_info",
    [
        None,
        [],
        "x",
        {"jobs_seen": "x"},
        {"jobs_seen": {"job-1": 5}},
        {"jobs_seen": {"job-1": "not a time"}},
        {"jobs_seen": {"job-1": "2026-01-01T00:00:00"}},  # naive: refused
        {"jobs_seen": {"7": ["2026-01-01T00:00:00+00:00"]}},
    ],
)
def test_hostile_agent_info_reads_as_nothing_seen(agent_info: Any) -> None:
    assert jobs_seen(agent_info) == {}


# --------------------------------------------------------------------------- with the database

pytestmark_db = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Any, gpus: int = 2) -> Job:
    data = {"name": f"j{gpus}", "workload": "mlp-digits", "gpus": gpus}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def hosts(job: Job) -> list[str]:
    return list(
        Server.objects.filter(gpu_set__assignment__job=job)
        .values_list("node", flat=True)
        .distinct()
    )


def heartbeat(
    nodes: list[str], when: datetime, running: dict[str, list[Job]] | None = None
) -> None:
    """Every agent beats at ``when``; ``running`` lists the jobs whose workers a node runs."""
    for node in nodes:
        workers = tuple(
            RunningWorker(job=runtime_job_name(job.pk), worker_id=f"w{i}", slot=i, pid=1000 + i)
            for i, job in enumerate((running or {}).get(node, []))
        )
        message = Heartbeat(node=node, device="cpu", slots=2, free_slots=(), workers=workers)
        assert do_heartbeat(node=node, info=message.to_dict(), at=when)


def placed(
    alice: Any, acme: Any, gpus: int = 2, job: Job | None = None
) -> tuple[Job, list[str], datetime]:
    """A job (a built-in one by default) placed by a tick at a known time, commands drained."""
    nodes = demo_cluster()
    job = job or submit(alice, acme, gpus)
    # In the past, so that reports' own times (never later than now) fall after it.
    start = timezone.now() - timedelta(hours=2)
    JobEvent.objects.filter(job=job).update(at=at(-2, start))  # submitted before that
    Server.objects.update(agent_info={})  # forget demo_cluster's beats of real now
    heartbeat(nodes, at(-1, start))  # the agents' last beats came before the placement
    run_tick(policy="fifo", now=start)
    job.refresh_from_db()
    assert job.state == "running" and JobGpu.objects.filter(job=job).exists()
    drain_all(nodes)
    return job, nodes, start


def reconcile_now(now: datetime) -> list[int]:
    cluster = read_cluster()
    assert cluster is not None
    with transaction.atomic():
        return reconcile(cluster, now, LIMITS)


@pytestmark_db
def test_heartbeats_without_the_job_for_longer_than_the_limit_requeue_it(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    with override_settings(ARTIFACT_URL=f"file://{tmp_path}"):
        job, nodes, start = placed(alice, acme)
        [home] = hosts(job)
        heartbeat(nodes, at(5, start), {home: [job]})  # it ran
        heartbeat(nodes, at(16, start))  # 11 s without it: not yet
        assert reconcile_now(at(16, start)) == []
        heartbeat(nodes, at(21, start))  # 16 s without it
        assert reconcile_now(at(21, start)) == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.parallelism, job.allocation) == ("queued", 0, {})
    assert not JobGpu.objects.filter(job=job).exists()
    event = job.events.order_by("-pk").first()
    assert event is not None and event.kind == "preempted"
    assert event.reason == (
        f"no process on {home} for 16 s: requeued, no checkpoint stored: restarts from step 0"
    )


@pytestmark_db
def test_a_requeued_job_resumes_from_its_latest_checkpoint_through_the_tick(
    alice: Any, acme: Any, tmp_path: Path, settings: Any
) -> None:
    settings.ARTIFACT_URL = f"file://{tmp_path}"
    settings.RECONCILE_SECONDS = LIMITS.vanished_s
    settings.RECONCILE_START_SECONDS = LIMITS.never_started_s
    job, nodes, start = placed(alice, acme)
    [home] = hosts(job)
    store = ArtifactStore(f"file://{tmp_path}").child(prefix_of(job))
    checkpoints = Checkpoints(store, keep=2)
    checkpoints.save(20, {"w": 1})
    checkpoints.save(40, {"w": 2})
    heartbeat(nodes, at(2, start), {home: [job]})
    heartbeat(nodes, at(20, start))  # the stack restarted: no agent runs it
    result = run_tick(policy="fifo", now=at(20, start))
    assert job.pk in result.changed_jobs
    job.refresh_from_db()
    reasons = list(job.events.order_by("pk").values_list("reason", flat=True))
    assert f"no process on {home} for 18 s: requeued, resumes from step 40" in reasons
    # The same tick places it again, and the agents are told to start it afresh.
    assert job.state == "running" and job.step == 40
    starts = [c for cmds in drain_all(nodes).values() for c in cmds if c["type"] == "start_workers"]
    assert starts and all(c["job"] == runtime_job_name(job.pk) for c in starts)


@pytestmark_db
def test_within_the_limit_or_while_listed_the_job_is_untouched(alice: Any, acme: Any) -> None:
    job, nodes, start = placed(alice, acme)
    [home] = hosts(job)
    heartbeat(nodes, at(10, start))
    assert reconcile_now(at(10, start)) == []
    for second in (20, 40, 60):  # listed on every beat: alive however long it runs
        heartbeat(nodes, at(second, start), {home: [job]})
        assert reconcile_now(at(second, start)) == []
    job.refresh_from_db()
    assert job.state == "running" and JobGpu.objects.filter(job=job).count() == 2


@pytestmark_db
def test_a_just_placed_job_is_untouched(alice: Any, acme: Any) -> None:
    job, nodes, start = placed(alice, acme)
    # The agents last beat before the placement (their agent has not launched it yet);
    # however late the tick, no heartbeat since says anything about the job.
    assert reconcile_now(at(600, start)) == []
    heartbeat(nodes, at(1, start))
    assert reconcile_now(at(600, start)) == []
    heartbeat(nodes, at(70, start))  # the agent may hold a start back up to its slot wait
    assert reconcile_now(at(70, start)) == []
    job.refresh_from_db()
    assert job.state == "running"


@pytestmark_db
def test_a_job_its_agent_never_started_is_requeued_after_the_start_limit(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    """Its start command was lost (with a Redis that did not persist, say)."""
    with override_settings(ARTIFACT_URL=f"file://{tmp_path}"):
        job, nodes, start = placed(alice, acme)
        [home] = hosts(job)
        heartbeat(nodes, at(76, start))
        assert reconcile_now(at(76, start)) == [job.pk]
    job.refresh_from_db()
    assert job.state == "queued" and not JobGpu.objects.filter(job=job).exists()
    assert job.events.order_by("-pk")[0].reason.startswith(
        f"no process on {home} for 76 s since it was placed: requeued"
    )


@pytestmark_db
def test_progress_reports_count_as_a_sign_of_life(alice: Any, acme: Any) -> None:
    job, nodes, start = placed(alice, acme)
    heartbeat(nodes, at(5, start), {hosts(job)[0]: [job]})
    outcome = handle_report(
        {
            "type": "progress",
            "node": hosts(job)[0],
            "job": runtime_job_name(job.pk),
            "event_id": "1700000000000-1",
            "step": 5,
            "samples_per_s": 10.0,
            "world": 2,
            "loss": 1.0,
            "at": at(30, start).timestamp(),
        }
    )
    assert outcome == "progress"
    heartbeat(nodes, at(40, start))  # 35 s after its last listing, 10 s after its progress
    assert reconcile_now(at(40, start)) == []


@pytestmark_db
def test_a_job_with_its_final_checkpoint_stored_is_completed(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    with override_settings(ARTIFACT_URL=f"file://{tmp_path}"):
        job, nodes, start = placed(alice, acme)
        store = ArtifactStore(f"file://{tmp_path}").child(prefix_of(job))
        Checkpoints(store).save(90, {"w": 1})
        Checkpoints(store).save(100, {"w": 2}, final=True)
        heartbeat(nodes, at(5, start), {hosts(job)[0]: [job]})
        heartbeat(nodes, at(30, start))
        assert reconcile_now(at(30, start)) == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.step) == ("completed", 100)
    assert not JobGpu.objects.filter(job=job).exists()
    assert "final checkpoint (step 100) is stored" in job.events.order_by("-pk")[0].reason


@pytestmark_db
def test_a_torchrun_program_is_requeued_to_resume_from_its_own_checkpoint_dir(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    with override_settings(ARTIFACT_URL=f"file://{tmp_path}"):
        program = submit_program(alice, acme, "torchrun", lo=2, hi=2, gpus=2)
        job, nodes, start = placed(alice, acme, job=program)
        [home] = hosts(job)
        heartbeat(nodes, at(5, start), {home: [job]})
        heartbeat(nodes, at(25, start))
        assert reconcile_now(at(25, start)) == [job.pk]
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.events.order_by("-pk")[0].reason == (
        f"no process on {home} for 20 s: requeued, the program resumes from its CHECKPOINT_DIR"
    )


@pytestmark_db
def test_a_scaling_job_is_left_to_its_resize(alice: Any, acme: Any) -> None:
    """Stop-free resizes, migrations and torchrun restarts have processes coming and going."""
    job, nodes, start = placed(alice, acme)
    Job.objects.filter(pk=job.pk).update(state="scaling")  # set up as a resize leaves it
    heartbeat(nodes, at(60, start))
    assert reconcile_now(at(60, start)) == []


@pytestmark_db
def test_heartbeats_remember_when_each_job_was_last_listed(alice: Any, acme: Any) -> None:
    job, _nodes, start = placed(alice, acme)
    [home] = hosts(job)
    heartbeat([home], at(5, start), {home: [job]})
    heartbeat([home], at(9, start))
    info = Server.objects.get(node=home).agent_info
    assert jobs_seen(info) == {runtime_job_name(job.pk): at(5, start)}
    heartbeat([home], at(5 + 3601, start))  # an hour later the entry is dropped
    assert jobs_seen(Server.objects.get(node=home).agent_info) == {}
