"""Job arrays on the real stack: the real tick places the tasks, the agents' real queues
carry their start commands, and the reports agents send end them.

A 6-task array with a cap of 2 never has more than 2 tasks queued or running
at once, every task's process gets its own ``TASK_ID`` (the environment the node
agent's own code builds from the start command), and each end releases
the next task; cancel and retry act on the whole array.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control.reports import handle_report
from control.tick import run_tick
from jobs.arrays import check_array_spec, do_cancel_array, do_retry_array, do_submit_array
from jobs.errors import JobConflictError, JobValidationError
from jobs.models import Job, JobArray
from tests.jobs.control_helpers import drain_all
from tests.jobs.test_programs import bundle_of, exited, program_body
from tests.jobs.workflow_helpers import quiet_demo_cluster
from workers.agent.config import AgentConfig
from workers.agent.programs import JobDirs, torchrun_env
from workers.protocol import Command, StartWorkers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifacts_in_tmp")]

ACTIVE = ("queued", "running", "scaling")


def array_body(code: str, **overrides: Any) -> dict[str, Any]:
    body = program_body(code, name="grid", gpus=1, size=6, max_running=2, env={"LR": "0.1"})
    body.update(overrides)
    return body


def submit_array(user: Any, tenant: Any, **overrides: Any) -> JobArray:
    bundle = bundle_of(user, tenant)
    spec = check_array_spec(tenant=tenant, data=array_body(bundle.sha256, **overrides))
    return do_submit_array(user=user, tenant=tenant, spec=spec)


def tasks(array: JobArray) -> list[Job]:
    return list(Job.objects.filter(array=array).order_by("array_index", "pk"))


def finish(job: Job, outcome: str = "clean") -> str:
    """The report of the task's only worker exiting (torchrun: that ends the job)."""
    job.refresh_from_db()
    worker = f"w{job.allocation['gpus'][0]}"
    code = 0 if outcome == "clean" else 1
    return exited(job, worker, outcome, code, generation=job.generation)


def process_env(command: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """The environment a node agent gives the process of a start command (its own code:
    ``workers.agent.programs.torchrun_env``, what the sandbox then sets, and nothing else)."""
    start = Command.from_dict(command)
    assert isinstance(start, StartWorkers)
    config = AgentConfig(node="n", device="cpu", slots=2, redis_url="redis://:pw@127.0.0.1/0",
                         data_dir=tmp_path / "agent", python="/usr/bin/python3")  # fmt: skip
    return torchrun_env(config, start, start.workers[0], JobDirs(config.job_dir(start.job)))


def test_a_capped_array_never_runs_more_than_its_cap_and_each_task_sees_its_task_id(
    alice: Any, acme: Any, tmp_path: Path
) -> None:
    nodes = quiet_demo_cluster(acme)
    array = submit_array(alice, acme)
    states = [t.state for t in tasks(array)]
    assert states == ["queued", "queued", "pending", "pending", "pending", "pending"]
    assert tasks(array)[3].wait_reason == (
        f"waits for a slot: array {array.pk} runs at most 2 tasks at once"
    )
    seen_task_ids: dict[int, dict[str, str]] = {}
    for _round in range(10):
        run_tick(policy="fifo")
        now = tasks(array)
        assert sum(t.state in ACTIVE for t in now) <= 2
        for command in (c for cmds in drain_all(nodes).values() for c in cmds):
            if command["type"] == "start_workers":
                job = Job.objects.get(pk=int(command["job"].removeprefix("job-")))
                seen_task_ids[job.array_index or 0] = process_env(command, tmp_path)
        running = [t for t in now if t.state == "running"]
        if not running:
            break
        assert finish(running[0]) == "completed"
        assert sum(t.state in ACTIVE for t in tasks(array)) <= 2  # the release kept the cap
    assert [t.state for t in tasks(array)] == ["completed"] * 6
    assert sorted(seen_task_ids) == list(range(6))
    for index, env in seen_task_ids.items():
        assert (env["TASK_ID"], env["TASK_COUNT"], env["LR"]) == (str(index), "6", "0.1")
        assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1"  # the launcher's own, beside


def test_cancel_stops_every_task_and_retry_resubmits_the_failed_ones(alice: Any, acme: Any) -> None:
    quiet_demo_cluster(acme)
    array = submit_array(alice, acme, size=3, max_running=None)
    run_tick(policy="fifo")
    first, second, _third = tasks(array)
    first.refresh_from_db()
    assert first.state == "running"
    assert finish(first, "crashed") == "failed"
    assert finish(second) == "completed"
    retried = do_retry_array(user=alice, array_id=array.pk)
    assert [(j.array_index, j.state) for j in retried] == [(0, "queued")]
    assert retried[0].env["TASK_ID"] == "0" and retried[0].pk != first.pk
    with pytest.raises(JobConflictError):
        do_retry_array(user=alice, array_id=array.pk)  # nothing failed any more
    do_cancel_array(user=alice, array_id=array.pk)
    latest = {j.array_index: j.state for j in tasks(array)}  # newest attempt last
    assert latest == {0: "cancelled", 1: "completed", 2: "cancelled"}
    with pytest.raises(JobConflictError):
        do_cancel_array(user=alice, array_id=array.pk)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"size": 0}, "size"),
        ({"size": 1001}, "size"),
        ({"size": "6"}, "size"),
        ({"max_running": 0}, "max_running"),
        ({"env": {"TASK_ID": "3"}}, "env"),
        ({"env": {"TASK_COUNT": "3"}}, "env"),
        ({"gpus": 0}, "gpus"),
    ],
)
def test_a_bad_array_is_refused_by_field_and_creates_nothing(
    alice: Any, acme: Any, overrides: dict[str, Any], field: str
) -> None:
    bundle = bundle_of(alice, acme)
    with pytest.raises(JobValidationError) as refused:
        check_array_spec(tenant=acme, data=array_body(bundle.sha256, **overrides))
    assert field in refused.value.errors
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_an_array_of_a_built_in_workload_is_refused(acme: Any) -> None:
    data = {"name": "w", "workload": "mlp-digits", "gpus": 1, "size": 2}
    with pytest.raises(JobValidationError) as refused:
        check_array_spec(tenant=acme, data=data)
    assert "TASK_ID" in refused.value.errors["workload"][0]


def test_a_report_of_another_task_never_releases_past_the_cap_twice(alice: Any, acme: Any) -> None:
    """The release is idempotent: the same end reported twice frees one slot, once."""
    quiet_demo_cluster(acme)
    array = submit_array(alice, acme, size=4, max_running=1)
    run_tick(policy="fifo")
    first = tasks(array)[0]
    assert finish(first) == "completed"
    assert handle_report(
        {"type": "worker_exited", "node": "n", "job": f"job-{first.pk}", "worker_id": "w0",
         "slot": 0, "exit_code": 0, "outcome": "clean", "generation": 1}
    ) != "completed"  # fmt: skip
    assert [t.state for t in tasks(array)] == ["completed", "queued", "pending", "pending"]


def test_an_array_bigger_than_the_room_for_waiting_jobs_is_refused_whole(
    alice: Any, acme: Any
) -> None:
    acme.max_queued_jobs = 3
    acme.save()
    with pytest.raises(JobConflictError):
        submit_array(alice, acme, size=4)
    assert not JobArray.objects.exists() and not Job.objects.exists()
    assert submit_array(alice, acme, size=3).size == 3


def test_task_id_is_refused_in_env_given_as_lines_too(alice: Any, acme: Any) -> None:
    bundle = bundle_of(alice, acme)
    with pytest.raises(JobValidationError) as refused:
        check_array_spec(tenant=acme, data=array_body(bundle.sha256, env="A=1\nTASK_ID=3\n"))
    assert refused.value.errors["env"] == ["TASK_ID is set by the array for each task."]
