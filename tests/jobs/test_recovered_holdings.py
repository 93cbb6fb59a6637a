"""A worker the runtime recovers without gives its GPU back (issue 16, a fault-suite gap).

Reports go through the real handler (``handle_report``) against the real
database and Redis, as an agent's would; the tick is the real one.
"""

from __future__ import annotations

from typing import Any

import pytest

from control.reports import handle_report
from control.tick import run_tick
from jobs.models import Job, JobGpu
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster, drain_all

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Any, *, gpus: int = 2, lo: int | None = None) -> Job:
    data = {
        "name": f"r{gpus}",
        "workload": "mlp-digits",
        "gpus": gpus,
        "min_gpus": lo or gpus,
        "max_gpus": gpus,
    }
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def held(job: Job) -> list[int]:
    return list(
        JobGpu.objects.filter(job=job).order_by("rank").values_list("gpu__index", flat=True)
    )


def recovered(job: Job, event_id: str, dead: list[str], world: int) -> dict[str, Any]:
    """The ``recovered`` report an agent forwards from the runtime's event stream."""
    return {
        "type": "recovered",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": event_id,
        "mode": "consistent",
        "world": world,
        "step": 40,
        "generation": 3,
        "dead": dead,
        "restored_step": 30,
    }


def running(
    user: Any, tenant: Any, *, gpus: int = 2, lo: int | None = None, spec: Any = None
) -> Job:
    """A job placed by a real tick, its start commands drained."""
    nodes = demo_cluster(spec)
    job = submit(user, tenant, gpus=gpus, lo=lo)
    run_tick(policy="fifo")
    drain_all(nodes)
    job.refresh_from_db()
    assert (job.state, job.parallelism, len(held(job))) == ("running", gpus, gpus)
    return job


def frees(job: Job, event_id: str, dead: int) -> None:
    """A genuine recovery without GPU ``dead``'s worker frees exactly that GPU."""
    before = held(job)
    report = recovered(job, event_id, [f"w{dead}"], len(before) - 1)
    assert handle_report(report) == "recovered"
    assert held(job) == [g for g in before if g != dead]


def test_recovery_without_a_worker_frees_its_gpu_and_shrinks_the_job(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    keep, dead = held(job)
    assert handle_report(recovered(job, "1700000000010-0", [f"w{dead}"], 1)) == "recovered"
    job.refresh_from_db()
    assert held(job) == [keep]
    assert job.allocation["gpus"] == [keep]
    assert (job.state, job.parallelism) == ("running", 1)
    scaled = job.events.filter(kind="scaled").latest("id")
    assert (scaled.from_parallelism, scaled.to_parallelism) == (2, 1)
    assert f"w{dead}" in scaled.reason
    # Replayed by a second agent: applied once.
    assert handle_report(recovered(job, "1700000000010-0", [f"w{dead}"], 1)) == "duplicate"
    assert held(job) == [keep]


def test_the_freed_gpu_goes_back_through_the_normal_tick(alice: Any, acme: Any) -> None:
    """On a one-server cluster the dead worker's GPU is the only way another job can start."""
    tiny = {"leaves": 1, "spines": 1, "servers_per_leaf": 1, "gpus_per_server": 2}
    job = running(alice, acme, gpus=2, lo=1, spec=tiny)
    keep, dead = held(job)
    other = submit(alice, acme, gpus=1)
    run_tick(policy="fifo")
    assert Job.objects.get(pk=other.pk).state == "queued"  # the cluster is full
    handle_report(recovered(job, "1700000000010-0", [f"w{dead}"], 1))
    run_tick(policy="fifo")
    other.refresh_from_db()
    assert other.state == "running"
    assert (held(job), held(other)) == ([keep], [dead])
    sent = [c for cmds in drain_all(["node-0"]).values() for c in cmds]
    starts = [c for c in sent if c["type"] == "start_workers"]
    assert [(c["job"], [w["worker_id"] for w in c["workers"]]) for c in starts] == [
        (f"job-{other.pk}", [f"w{dead}"])
    ]


def test_progress_that_overtakes_the_recovery_does_not_keep_the_gpu(alice: Any, acme: Any) -> None:
    """The survivors' progress, forwarded by another agent, may arrive before the recovery."""
    job = running(alice, acme, gpus=2, lo=1)
    dead = held(job)[1]
    ahead = {
        "type": "progress",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "1700000000011-0",
        "step": 41,
        "samples_per_s": 100.0,
        "world": 1,
    }
    assert handle_report(ahead) == "progress"
    frees(job, "1700000000010-0", dead)


def test_outputs_that_overtake_the_recovery_do_not_keep_the_gpu(alice: Any, acme: Any) -> None:
    """A checkpoint or metrics written after the recovery, applied before it (fault suite)."""
    job = running(alice, acme, gpus=3, lo=1)
    first, second, third = held(job)
    base = {"node": "node-0", "job": f"job-{job.pk}"}
    points = [{"step": 41, "values": {"loss": 0.5}}]
    ahead = {**base, "type": "metrics", "event_id": "1700000000011-0", "points": points}
    skipped = {**base, "type": "checkpoint_skipped", "event_id": "1700000000012-0", "step": 30,
               "reason": "size"}  # fmt: skip
    assert handle_report(ahead) == "metrics"
    assert handle_report(skipped) != "duplicate"
    assert handle_report(ahead) == "duplicate"  # an output is still applied once
    frees(job, "1700000000010-0", third)
    # A membership event newer than a later recovery still counts (the test below).
    done = {**base, "type": "scale_done", "event_id": "1700000000020-0", "world": 2,
            "workers": [f"w{first}", f"w{second}"], "step": 60}  # fmt: skip
    handle_report(done)
    assert handle_report(recovered(job, "1700000000015-0", [f"w{second}"], 1)) == "recovered"
    assert held(job) == [first, second]


def test_a_recovery_overtaken_by_a_switch_does_not_touch_its_members(alice: Any, acme: Any) -> None:
    """Once a newer scale_done named the members, an older recovery may not free one of them."""
    job = running(alice, acme, gpus=2, lo=1)
    before = held(job)
    regrown = {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "1700000000020-0",
        "world": 2,
        "workers": [f"w{g}" for g in before],
        "step": 60,
    }
    assert handle_report(regrown) == "noted"
    late = recovered(job, "1700000000010-0", [f"w{before[1]}"], 1)
    assert handle_report(late) == "recovered"
    job.refresh_from_db()
    assert held(job) == before and job.parallelism == 2
    assert job.events.filter(kind="recovered").count() == 1  # still on record
    frees(job, "1700000000030-0", before[1])  # one in order does


def test_a_scaling_job_keeps_its_holdings_for_the_switch_to_settle(alice: Any, acme: Any) -> None:
    """While a switch is in flight its joiners may carry a dead worker's id: scale_done decides."""
    job = running(alice, acme, gpus=3, lo=1)
    before = held(job)
    Job.objects.filter(pk=job.pk).update(state="scaling")
    assert handle_report(recovered(job, "1700000000010-0", [f"w{before[2]}"], 2)) == "recovered"
    assert held(job) == before
    done = {
        "type": "scale_done",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "1700000000011-0",
        "world": 2,
        "workers": [f"w{g}" for g in before[:2]],
        "step": 45,
    }
    assert handle_report(done) == "scaled"
    job.refresh_from_db()
    assert held(job) == before[:2] and (job.state, job.parallelism) == ("running", 2)
    frees(job, "1700000000012-0", before[1])  # running again: a recovery frees at once
    job.refresh_from_db()
    assert job.parallelism == 1


@pytest.mark.parametrize(
    "dead",
    [
        pytest.param("everyone", id="every-worker"),
        pytest.param(["w999", "", "w-1", "../w0", "w" + "9" * 300], id="unknown-ids"),
        pytest.param("other-job", id="another-jobs-worker"),
        pytest.param([], id="nobody"),
    ],
)
def test_a_recovery_naming_no_worker_of_its_own_changes_no_holding(
    alice: Any, acme: Any, dead: Any
) -> None:
    """Hostile or pointless ``dead`` lists: only the job's own, and never all of them, go."""
    job = running(alice, acme, gpus=2, lo=1)
    other = submit(alice, acme, gpus=2)
    run_tick(policy="fifo")
    other_gpus = held(other)
    assert len(other_gpus) == 2
    if dead == "everyone":
        dead = [f"w{g}" for g in held(job)]  # no survivor: the reconciler's case, not a shrink
    elif dead == "other-job":
        dead = [f"w{g}" for g in other_gpus]
    before = held(job)
    assert handle_report(recovered(job, "1700000000010-0", dead, 1)) == "recovered"
    job.refresh_from_db()
    assert held(job) == before and job.parallelism == 2
    assert held(other) == other_gpus
    frees(job, "1700000000011-0", before[1])  # a genuine one still does


def test_worker_failed_alone_keeps_the_gpu_until_the_recovery_ends(alice: Any, acme: Any) -> None:
    job = running(alice, acme, gpus=2, lo=1)
    before = held(job)
    failed = {
        "type": "worker_failed",
        "node": "node-0",
        "job": f"job-{job.pk}",
        "event_id": "1700000000009-0",
        "worker_id": f"w{before[1]}",
        "error": "missed sync",
        "generation": 2,
    }
    assert handle_report(failed) == "noted"
    assert held(job) == before
    assert handle_report(recovered(job, "1700000000010-0", [f"w{before[1]}"], 1)) == "recovered"
    assert held(job) == before[:1]
