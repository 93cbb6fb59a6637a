"""End to end: a real agent (``python -m workers.agent``) trains a built-in workload, and
every line its training process wrote comes back from GET /api/v1/jobs/{id}/logs/.

The agent sends its reports over Celery to a queue of this test's own
(``workers/tests/test_agent_celery.py``'s reader); each is applied with
``handle_report``, exactly what the control plane's report task does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from control.reports import handle_report
from jobs.services import check_job_spec, do_submit_job
from workers.elastic.control import JobControl
from workers.protocol import LogLines, WorkerExited
from workers.tests.test_agent_celery import (
    ReportReader,
    clean_up,
    launch_agent,
    send_signed,
    start_command,
    stop_agent,
)

pytestmark = [pytest.mark.slow, pytest.mark.stack, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def reader() -> Iterator[ReportReader]:
    reports = ReportReader(str(settings.REDIS_URL), f"test-reports-{uuid.uuid4().hex[:8]}")
    yield reports
    reports.close()


def test_a_real_training_process_log_arrives_whole(
    alice: Any, acme: Any, token_client: Any, reader: ReportReader, tmp_path: Path
) -> None:
    spec = check_job_spec(tenant=acme, data={"name": "e2e", "workload": "mlp-digits", "gpus": 1})
    job = do_submit_job(user=alice, tenant=acme, spec=spec)
    name = f"job-{job.pk}"
    redis_url = str(settings.REDIS_URL)
    JobControl(redis_url, name).cleanup()  # a job of this id from an earlier run
    node = f"test-{uuid.uuid4().hex[:8]}"
    agent = launch_agent(node, tmp_path, redis_url, reader)
    try:
        send_signed(node, start_command(name, [0], f"start-{name}", max_steps=60))
        exited = reader.wait_for(
            lambda r: isinstance(r, WorkerExited) and r.job == name, 180, "worker exit"
        )
        assert isinstance(exited, WorkerExited) and exited.outcome == "clean"
    finally:
        stop_agent(agent)
        clean_up(node, redis_url, reader)
        JobControl(redis_url, name).cleanup()

    shipped = reader.of(LogLines, name)
    assert shipped, "the agent shipped no output"
    # Flushed before the exit report: nothing of the log comes after it.
    assert reader.reports.index(shipped[-1]) < reader.reports.index(exited)
    for report in shipped:
        handle_report(report.to_dict())
    for report in shipped:  # a replay of everything changes nothing
        assert handle_report(report.to_dict()) == "duplicate"

    written = (tmp_path / "logs" / f"agent-{node}" / name / "w0.log").read_text()
    lines = token_client(alice).get(f"/api/v1/jobs/{job.pk}/logs/?tail=10000").json()["lines"]
    assert [line["text"] for line in lines] == written.splitlines()
    assert {line["worker"] for line in lines} == {"w0"}
    assert all(line["node"] == node for line in lines)
