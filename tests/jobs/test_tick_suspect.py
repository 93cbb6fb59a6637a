"""Suspect GPUs in the tick: no new placement or scale-out lands on one; its job keeps it.

Both ways the tick reads the cluster are checked: the kept (incremental) state,
compared with a full rebuild after every step, and the full rebuild alone.  A
mark that lapses is simulated by moving its ``suspect_until`` into the past:
that is all time does to it (the tick compares it with the database's clock),
and nothing else is written.  The demo fabric: 2 leaves of 4 GPUs::

    leaf 0: g0 g1 | g2 g3        leaf 1: g4 g5 | g6 g7
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client import generate_latest

from control import incremental
from control.tick import run_tick
from inventory.models import Gpu
from inventory.services import do_clear_gpu_suspect, do_mark_gpu_suspect
from jobs.models import Job
from portal.metrics import build_registry
from tests.jobs.control_helpers import demo_cluster, drain_all
from tests.jobs.test_recovered_holdings import held
from tests.jobs.test_tick_incremental import kept_equals_rebuild, needs_postgresql, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(
    params=[pytest.param(True, marks=needs_postgresql), False], ids=["kept-state", "full-rebuild"]
)
def incremental_tick(request: Any, settings: Any) -> Iterator[bool]:
    """Tick with the kept state (compared with a rebuild at every step) or the full rebuild."""
    settings.TICK_INCREMENTAL = request.param
    settings.TICK_VERIFY_EVERY = 1  # the tick's own verify pass runs every time too
    incremental.forget()
    yield request.param
    incremental.forget()


def check(kept: bool) -> None:
    if kept:
        kept_equals_rebuild()
        assert incremental.kept_state().mismatches == 0


def mark(gpu: int, job_id: int | None = None) -> None:
    assert do_mark_gpu_suspect(
        gpu=gpu, at=timezone.now(), seconds=600, reason="test", job_id=job_id, by="test"
    )


def refresh(*jobs: Job) -> None:
    for job in jobs:
        job.refresh_from_db()


def test_a_suspect_gpu_takes_no_new_job_until_its_mark_lapses(
    alice: Any, acme: Any, incremental_tick: bool
) -> None:
    nodes = demo_cluster()
    acme.profile_jobs = False
    acme.save()
    run_tick(policy="fifo")  # a kept state exists before the mark
    mark(3)
    check(incremental_tick)
    first, second = submit(alice, acme, 4, 4, 4), submit(alice, acme, 4, 4, 4)
    run_tick(policy="fifo")
    refresh(first, second)
    # Leaf 0 has three schedulable GPUs: the first job gets leaf 1, the second waits.
    assert first.state == "running" and sorted(held(first)) == [4, 5, 6, 7]
    assert second.state == "queued" and held(second) == []
    # The tenant is told why: only the suspect GPU keeps it out (3 free, 4 needed).
    assert second.wait_reason.startswith("1 idle GPU is out of service"), second.wait_reason
    assert "3 are free" in second.wait_reason
    assert second.events.filter(reason__startswith="waiting: 1 idle GPU").count() == 1
    check(incremental_tick)
    # Time passes: the mark lapses with no write to any server or job.
    Gpu.objects.filter(index=3).update(suspect_until=timezone.now() - timedelta(seconds=1))
    check(incremental_tick)
    run_tick(policy="fifo")
    refresh(second)
    assert second.state == "running" and sorted(held(second)) == [0, 1, 2, 3]
    check(incremental_tick)
    drain_all(nodes)


def test_a_job_keeps_its_suspect_gpu_and_grows_around_another(
    alice: Any, acme: Any, incremental_tick: bool
) -> None:
    nodes = demo_cluster()
    acme.profile_jobs = False
    acme.save()
    job = submit(alice, acme, 2, 1, 2)
    run_tick(policy="fifo")
    refresh(job)
    assert held(job) == [0, 1]
    mark(1, job.pk)  # its own GPU: it keeps it (not lost, not shrunk)
    mark(2)
    check(incremental_tick)
    run_tick(policy="elastic-tiresias")
    refresh(job)
    assert job.state == "running" and held(job) == [0, 1]
    assert not job.events.filter(kind="recovered").exists()
    check(incremental_tick)
    # A bigger job: it may not use GPU 2 (free but suspect), so it goes to leaf 1.
    big = submit(alice, acme, 4, 1, 4)
    run_tick(policy="elastic-tiresias")
    refresh(big)
    assert big.state == "running" and sorted(held(big)) == [4, 5, 6, 7]
    check(incremental_tick)
    # An admin clears GPU 2: the next tick may hand it out again.
    do_clear_gpu_suspect(gpu=2)
    small = submit(alice, acme, 2, 2, 2)
    run_tick(policy="fifo")
    refresh(small)
    assert small.state == "running" and sorted(held(small)) == [2, 3]
    check(incremental_tick)
    drain_all(nodes)


def test_metrics_count_the_suspect_gpus_in_their_cool_down() -> None:
    demo_cluster()
    mark(3)
    mark(5)
    Gpu.objects.filter(index=5).update(suspect_until=timezone.now() - timedelta(seconds=1))
    text = generate_latest(build_registry()).decode()
    assert "portal_suspect_gpus 1.0" in text
