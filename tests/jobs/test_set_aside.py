"""GPUs held by jobs the snapshot leaves out (switching, profiling) are not the policy's to give.

Real database and Redis.  The policy counts every GPU that is not down as its
own; a profiling job's GPUs, counted, made it plan a start on GPUs nobody had
free, placement refused the plan, and the waiting job waited while another job
held idle extras it could have given back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from control import incremental
from control.state import read_cluster
from control.tick import run_tick
from inventory.models import Server
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from scheduler.types import GpuState
from tests.jobs.control_helpers import demo_cluster

pytestmark = pytest.mark.django_db(transaction=True)

EIGHT_GPUS = {"leaves": 1, "spines": 1, "servers_per_leaf": 2, "gpus_per_server": 4}
POLICY = "elastic-tiresias"


@pytest.fixture(autouse=True, params=[True, False], ids=["kept", "full"])
def tick_path(request: Any, settings: Any) -> Iterator[None]:
    """Both the incremental tick and the full rebuild."""
    settings.TICK_INCREMENTAL = request.param
    incremental.forget()
    yield
    incremental.forget()


def _submit(user: Any, tenant: Any, gpus: int, lo: int, hi: int) -> Job:
    data = {"name": "j", "workload": "mlp-digits", "gpus": gpus, "min_gpus": lo, "max_gpus": hi}
    return do_submit_job(user=user, tenant=tenant, spec=check_job_spec(tenant=tenant, data=data))


def _tick() -> None:
    Server.objects.update(last_heartbeat=timezone.now())
    assert run_tick(policy=POLICY).ran


def test_a_profiling_jobs_gpus_are_set_aside_and_extras_make_room(alice: Any, acme: Any) -> None:
    demo_cluster(EIGHT_GPUS)
    acme.profile_jobs = False
    acme.save()
    rigid = _submit(alice, acme, gpus=4, lo=4, hi=4)
    elastic = _submit(alice, acme, gpus=2, lo=2, hi=4)
    _tick()
    assert Job.objects.get(pk=elastic.pk).parallelism == 4  # grew onto the idle GPUs
    Job.objects.filter(pk=rigid.pk).update(profile_state="requested")  # as if profiling now
    _tick()
    waiting = _submit(alice, acme, gpus=2, lo=2, hi=2)
    profiling_gpus = set(read_cluster().holdings[rigid.pk])  # type: ignore[union-attr]

    source = incremental.source_for_tick()
    cluster = source.cluster()
    assert cluster is not None
    snapshot = source.policy_input(cluster, timezone.now()).snapshot
    down = {g.id for g in snapshot.cluster.gpus if g.state is GpuState.DOWN}
    assert down == profiling_gpus
    assert snapshot.cluster.total_gpus == 4

    _tick()
    elastic.refresh_from_db()
    waiting.refresh_from_db()
    assert waiting.state == JobState.RUNNING and waiting.parallelism == 2
    assert elastic.state == JobState.SCALING  # giving its two extras back
    assert set(read_cluster().holdings[rigid.pk]) == profiling_gpus  # type: ignore[union-attr]
