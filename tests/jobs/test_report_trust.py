"""Reports reach the control plane signed, from a node that hosts the job, or change nothing.

Through the real report task (``control.tasks.agent_report``, called directly as
its Celery worker would), the real database, Redis and cache.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from control.tasks import agent_report
from control.tick import run_tick
from inventory.models import Server
from jobs import agent_trust, holdings
from jobs.agent_commands import worker_id
from jobs.models import Job, JobEvent
from jobs.outbox import send_commands
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster, drain_all, drain_envelopes
from workers.protocol import Finished, Heartbeat, Report, RunningWorker, ScaleIn, WorkerExited
from workers.signing import SignatureError, node_key, open_envelope, seal

pytestmark = pytest.mark.django_db(transaction=True)


def envelope(
    report: Report, *, node: str | None = None, key: bytes | None = None, at: float | None = None
) -> dict[str, Any]:
    """``report`` sealed as ``node``'s agent would (by default: the node the report names)."""
    signer = node or report.node
    return seal(
        report.to_dict(),
        node=signer,
        key=key if key is not None else agent_trust.key_of(signer),
        now=time.time() if at is None else at,
    )


def gpus_by_node(job: Job) -> dict[str, list[int]]:
    nodes: dict[str, list[int]] = {}
    for gpu in holdings.held_gpus(job):
        nodes.setdefault(Server.objects.get(gpu_set__index=gpu).node, []).append(gpu)
    return nodes


@pytest.fixture
def running(alice: Any, acme: Any) -> Iterator[tuple[Job, list[str]]]:
    """A 4-GPU job running on two servers of the demo cluster; every node's name."""
    nodes = demo_cluster()
    spec = check_job_spec(tenant=acme, data={"name": "t", "workload": "mlp-digits", "gpus": 4})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    for node in nodes:  # a job id of an earlier run must not count as hosted
        agent_trust.forget_hosted(node, [f"job-{job.pk}"])
    run_tick(policy="fifo")
    job.refresh_from_db()
    assert job.state == "running" and len(gpus_by_node(job)) == 2
    drain_all(nodes)
    yield job, nodes
    for node in nodes:
        agent_trust.forget_hosted(node, [f"job-{job.pk}"])


def finished(job: Job, node: str) -> Finished:
    return Finished(node=node, job=f"job-{job.pk}", event_id="1700000000000-0", step=9)


def snapshot(job: Job) -> tuple[Any, ...]:
    job.refresh_from_db()
    return (job.state, job.log_tail, job.last_event_id, JobEvent.objects.filter(job=job).count())


def test_forged_reports_change_nothing(running: tuple[Job, list[str]]) -> None:
    job, nodes = running
    host = next(iter(gpus_by_node(job)))
    stranger = next(n for n in nodes if n not in gpus_by_node(job))
    before = snapshot(job)
    html = WorkerExited(
        node=host, job=f"job-{job.pk}", worker_id="w0", slot=0, exit_code=1,
        outcome="crashed", log_tail="<img src=x onerror=alert(1)>",
    )  # fmt: skip
    forged = {
        "no envelope": finished(job, host).to_dict(),
        "no signature": {**envelope(finished(job, host)), "sig": ""},
        "wrong key": envelope(finished(job, host), key=node_key(b"guess", host)),
        "another node's key": envelope(finished(job, host), key=agent_trust.key_of(stranger)),
        "signed by another node": envelope(finished(job, host), node=stranger),
        "job not hosted": envelope(finished(job, stranger)),
        "stale": envelope(finished(job, host), at=time.time() - 3600),
        "html log line, wrong key": envelope(html, key=node_key(b"guess", host)),
    }
    outcomes = {case: agent_report(payload) for case, payload in forged.items()}
    assert all(outcome.startswith("refused") for outcome in outcomes.values()), outcomes
    assert outcomes["job not hosted"] == "refused: not hosted"
    assert outcomes["signed by another node"] == "refused: wrong node"
    assert snapshot(job) == before

    # The real thing, signed by a node that runs the job, still works.
    assert agent_report(envelope(finished(job, host))) == "completed"
    assert snapshot(job)[0] == "completed"


def test_a_leaver_may_report_its_exit_after_it_left(running: tuple[Job, list[str]]) -> None:
    job, nodes = running
    (stay, stay_gpus), (leave, leave_gpus) = gpus_by_node(job).items()
    name = f"job-{job.pk}"
    command = ScaleIn(
        job=name, command_id="in-1", worker_ids=tuple(worker_id(g) for g in leave_gpus)
    )
    agent_trust.forget_hosted(leave, [name])
    send_commands([(stay, command)])  # the scale-in goes to one node; the leavers sit on another
    assert drain_all(nodes)[stay][0]["type"] == "scale_in"
    holdings.keep_only_workers(job, {worker_id(g) for g in stay_gpus})
    assert not agent_trust.holds(leave, job.pk)

    exited = WorkerExited(
        node=leave, job=name, worker_id=worker_id(leave_gpus[0]), slot=0, exit_code=0,
        outcome="clean",
    )  # fmt: skip
    assert agent_report(envelope(exited)) == "noted"
    stranger = next(n for n in nodes if n not in (stay, leave))
    assert agent_report(envelope(WorkerExited(**{**exited.__dict__, "node": stranger}))) == (
        "refused: not hosted"
    )


def test_a_heartbeat_keeps_only_the_workers_of_jobs_its_node_hosts(
    running: tuple[Job, list[str]],
) -> None:
    job, nodes = running
    host = next(iter(gpus_by_node(job)))
    stranger = next(n for n in nodes if n not in gpus_by_node(job))
    name = f"job-{job.pk}"

    def beat(node: str) -> Heartbeat:
        return Heartbeat(
            node=node, device="cpu", slots=2, free_slots=(),
            workers=(RunningWorker(job=name, worker_id="w0", slot=0, pid=4242),
                     RunningWorker(job="job-999999", worker_id="w1", slot=1, pid=4243)),
        )  # fmt: skip

    assert agent_report(envelope(beat(host))) == "heartbeat"
    assert agent_report(envelope(beat(stranger))) == "heartbeat"
    info = dict(Server.objects.values_list("node", "agent_info"))
    assert [w["job"] for w in info[host]["workers"]] == [name]
    assert info[stranger]["workers"] == []


def test_commands_are_signed_for_their_node_only(running: tuple[Job, list[str]]) -> None:
    job, nodes = running
    host, other = nodes[0], nodes[1]
    command = ScaleIn(job=f"job-{job.pk}", command_id="in-2", worker_ids=("w0",))
    send_commands([(host, command)])
    [raw] = drain_envelopes(host)
    opened = open_envelope(raw, key_for=agent_trust.key_of, now=time.time(), expected_node=host)
    assert opened.body == command.to_dict()
    with pytest.raises(SignatureError, match="wrong node"):
        open_envelope(raw, key_for=agent_trust.key_of, now=time.time(), expected_node=other)
    with pytest.raises(SignatureError, match="bad signature"):
        open_envelope({**raw, "node": other}, key_for=agent_trust.key_of, now=time.time())
