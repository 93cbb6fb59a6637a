"""A job that ends has its whole log written to the artifact store, once, as logs/job.log."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from control.reports import handle_report
from devtools.job_steps import move
from jobs import lifecycle
from jobs.logs.export import export_log
from jobs.models import Artifact, Job
from jobs.services import do_cancel_job
from jobs.tasks import export_job_log
from tests.jobs.outputs_helpers import submit
from workers.protocol import LogLines

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Tasks sent through Celery, recorded instead of sent."""
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        lifecycle.current_app, "send_task", lambda name, **kw: calls.append((name, kw))
    )
    return calls


def output(job: Job, worker: str, offset: int, text: str) -> None:
    report = LogLines(
        node="node-0",
        job=f"job-{job.pk}",
        worker_id=worker,
        log_id=f"node-0-1-{worker}",
        offset=offset,
        text=text,
    )
    assert handle_report(report.to_dict()) == "log"


def exports(sent: list[tuple[str, Any]]) -> list[Any]:
    return [kw["args"] for name, kw in sent if name == lifecycle.EXPORT_LOG_TASK]


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_every_ending_enqueues_the_export_after_commit(
    alice: Any,
    acme: Any,
    sent: list[tuple[str, Any]],
    django_capture_on_commit_callbacks: Any,
    ending: str,
) -> None:
    job = submit(alice, acme)
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=1)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        if ending == "cancelled":
            do_cancel_job(user=alice, job_id=job.pk)
        else:
            move(job_id=job.pk, to_state=ending, reason="over")
    assert exports(sent) == []  # nothing before the commit
    for callback in callbacks:
        callback()
    assert exports(sent) == [[job.pk]]


def test_the_export_writes_every_line_in_order_and_records_it_once(
    alice: Any, acme: Any, store_dir: Path
) -> None:
    job = submit(alice, acme)
    move(job_id=job.pk, to_state="running", reason="placed", parallelism=2)
    output(job, "w0", 0, "epoch 1\n")
    output(job, "w1", 0, "ready\n")
    output(job, "w0", 8, "epoch 2\ndone\n")
    assert export_log(job.pk) is None  # still running: nothing yet
    move(job_id=job.pk, to_state="completed", reason="finished")

    row_id = export_job_log(job.pk)
    expected = b"[w0] epoch 1\n[w1] ready\n[w0] epoch 2\n[w0] done\n"
    stored = store_dir / f"tenants/acme/jobs/{job.pk}/logs/job.log"
    assert stored.read_bytes() == expected
    row = Artifact.objects.get(pk=row_id)
    assert (row.kind, row.job_path, row.name) == ("log", "logs/job.log", "job.log")
    assert (row.size, row.sha256) == (len(expected), hashlib.sha256(expected).hexdigest())

    assert export_job_log(job.pk) == row_id  # again: the same object, the same row
    assert stored.read_bytes() == expected
    assert Artifact.objects.filter(job=job).count() == 1


def test_a_job_without_output_exports_nothing(alice: Any, acme: Any, store_dir: Path) -> None:
    job = submit(alice, acme)
    do_cancel_job(user=alice, job_id=job.pk)
    assert export_log(job.pk) is None
    assert not Artifact.objects.exists()
    assert not list(store_dir.rglob("*.log"))
