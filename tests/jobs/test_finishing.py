"""No scale-out into a finishing job (issue 19): a newcomer would join a job that has ended."""

from __future__ import annotations

from typing import Any

import pytest

from control.tick import run_tick
from jobs.models import Job
from jobs.progress import seconds_left, total_steps
from jobs.services import check_job_spec, do_cancel_job, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, tenant: Any, name: str, gpus: int, hi: int) -> Job:
    data = {
        "name": name,
        "workload": "mlp-digits",
        "gpus": gpus,
        "min_gpus": min(gpus, hi),
        "max_gpus": hi,
        "args": {"epochs": 1},  # 29 mini-batches of 64
    }
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


@pytest.mark.parametrize(("step", "rate", "grows"), [(28, 1000.0, False), (0, 1.0, True)])
def test_idle_gpus_do_not_go_to_a_job_about_to_end(
    step: int, rate: float, grows: bool, alice: Any, acme: Any
) -> None:
    demo_cluster()  # 8 GPUs
    acme.profile_jobs = False
    acme.save()
    blocker = submit(alice, acme, "blocker", 4, 4)
    submit(alice, acme, "other", 2, 2)
    job = submit(alice, acme, "elastic", 2, 4)
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    assert (job.state, job.parallelism) == ("running", 2)
    # Its progress: 1 of 29 steps left at 1,000 samples/s (0.06 s), or all 29 at 1/s.
    Job.objects.filter(pk=job.pk).update(step=step, samples_per_s=rate)
    do_cancel_job(user=alice, job_id=blocker.pk)
    run_tick(policy="elastic-tiresias")
    job.refresh_from_db()
    assert (job.state == "scaling") is grows
    assert job.events.filter(reason__startswith="scale out").exists() is grows


def test_seconds_left_only_for_what_says_its_length() -> None:
    assert total_steps("mlp-digits", {"epochs": 1}, 64) == 29
    assert seconds_left(29, 28, 64, 1000.0) == pytest.approx(0.064)
    assert seconds_left(None, 0, 64, 1000.0) is None  # a program: unknown
    assert seconds_left(29, 0, 64, None) is None  # never measured
    assert seconds_left(29, 40, 64, 10.0) == 0.0  # past its end (a late report)
    assert total_steps("mlp-digits", {"epochs": "many"}, 64) is None  # hostile args
