"""Every write to a job, its events or its holdings goes through the writer modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.lifecycle import save_fields
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from tests.architecture.writes import (
    ForbiddenWrite,
    guard,
    project_writes,
    static_writes,
)

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_outside_the_writers_writes_job_models() -> None:
    assert project_writes(ROOT) == []


def test_the_static_check_finds_a_planted_write() -> None:
    planted = "def f(job):\n    JobEvent.objects.create(job=job)\n    Job.objects.filter(pk=1).update(state='x')\n"
    assert static_writes(planted, "control.tick") == [
        "control.tick:2 JobEvent.objects.create(...)",
        "control.tick:3 Job.objects.filter(pk=1).update(...)",
    ]
    assert static_writes(planted, "jobs.lifecycle") == []


def test_the_runtime_guard_refuses_a_save_from_elsewhere() -> None:
    """Run the guard as if ``control.tick`` had called ``job.save()``."""
    code = compile("guard(sender=Job, instance=None)", "<planted>", "exec")
    with pytest.raises(ForbiddenWrite, match=r"control\.tick wrote a Job"):
        exec(code, {"__name__": "control.tick", "guard": guard, "Job": Job})
    exec(code, {"__name__": "jobs.lifecycle", "guard": guard, "Job": Job})  # allowed


@pytest.mark.django_db
def test_the_guard_is_installed_for_every_test(alice: Any, acme: Any) -> None:
    """A real ``job.save()`` from a control-plane module fails; through the door it works."""
    spec = check_job_spec(tenant=acme, data={"name": "t", "workload": "mlp-digits", "gpus": 1})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    job.priority = 7
    with pytest.raises(ForbiddenWrite):
        exec("job.save()", {"__name__": "control.reports", "job": job})
    save_fields(job, "priority")
    assert Job.objects.get(pk=job.pk).priority == 7
