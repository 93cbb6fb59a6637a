"""``holdings.store_many``: the GPU and cable rows of many jobs rewritten at once."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from fabric.allocator import VClosAllocator
from inventory.models import Fabric
from jobs import holdings
from jobs.models import Job, JobCable, JobGpu
from jobs.services import check_job_spec, do_submit_job
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db


def _jobs(alice: Any, acme: Any, count: int) -> list[Job]:
    spec = check_job_spec(tenant=acme, data={"name": "h", "workload": "mlp-digits", "gpus": 1})
    return [do_submit_job(user=alice, tenant=acme, spec=spec) for _ in range(count)]


def _rows(job: Job) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    gpus = list(JobGpu.objects.filter(job=job).order_by("rank").values_list("gpu__index", "rank"))
    cables = list(
        JobCable.objects.filter(job=job)
        .order_by("leaf", "port")
        .values_list("leaf", "port", "spine")
    )
    return gpus, cables


def test_gpus_and_cables_pass_between_jobs_in_one_call(alice: Any, acme: Any) -> None:
    demo_cluster()
    spec = Fabric.objects.get().spec()
    first, second = _jobs(alice, acme, 2)
    spread = VClosAllocator(spec).allocate("job-a", 8)  # both leaves: it reserves cables
    assert spread.cables()
    holdings.store_many([(first, spread)], spec)
    first.parallelism = 8
    assert _rows(first) == (
        [(gpu, rank) for rank, gpu in enumerate(spread.gpus)],
        sorted((leaf, port, spec.spine_of_uplink(port)) for leaf, port in spread.cables()),
    )
    # The first job's GPUs go to the second in the same call: old rows go first.
    holdings.store_many([(first, None), (second, spread)], spec)
    assert _rows(first) == ([], []) and first.allocation == {}
    assert _rows(second)[0] == [(gpu, rank) for rank, gpu in enumerate(spread.gpus)]
    assert len(_rows(second)[1]) == len(spread.cables())


def test_a_gpu_without_a_row_stores_nothing(alice: Any, acme: Any) -> None:
    demo_cluster()
    spec = Fabric.objects.get().spec()
    (job,) = _jobs(alice, acme, 1)
    held = VClosAllocator(spec).allocate("job-b", 2)
    holdings.store_many([(job, held)], spec)
    job.parallelism = 2
    before = _rows(job)
    ghost = type(held)(held.job_id, (held.gpus[0], 10_000), held.leaves)
    with pytest.raises((IntegrityError, KeyError)), transaction.atomic():
        holdings.store_many([(job, ghost)], spec)
    assert _rows(job) == before
