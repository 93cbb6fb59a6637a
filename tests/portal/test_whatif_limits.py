"""What-if runs cannot starve the control plane: own queue, a soft time limit, size bounds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, override_settings

from portal.celery import app
from portal.whatif import compare, get_run, history_trace, load_trace, start_run
from scheduler.traces import TraceError
from tenancy.models import Tenant
from tests.portal.test_metrics_access import finish_jobs
from tests.processes import stop_group

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
WORKER = (sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", "whatif", "-l", "WARNING")


def trace_csv(jobs: int) -> str:
    return "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n" + "".join(
        f"{i},{1 + i % 4},{i * 5},100,resnet50,{300 + 7 * (i % 50)},0\n" for i in range(jobs)
    )


PARAMS: dict[str, Any] = {
    "source": "upload",
    "policies": ["fifo"],
    "placements": ["count"],
    "total_gpus": 16,
    "gpus_per_server": 4,
    "leaves": 2,
    "elastic": False,
    "duration_scale": 1.0,
}


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


def test_whatif_is_routed_to_its_own_queue_and_control_tasks_stay_on_portal() -> None:
    router = app.amqp.router
    assert router.route({}, "portal.whatif.run")["queue"].name == "whatif"
    assert router.route({}, "control.scheduler_tick")["queue"].name == "portal"
    # Reports alone on the agents' queue (portal.broker runs nothing else from it).
    assert router.route({}, "control.agent_report")["queue"].name == "reports"


@override_settings(WHATIF_SOFT_TIME_LIMIT_SECONDS=42)
def test_a_started_run_waits_on_the_whatif_queue_with_its_time_limits(
    whatif_queue: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        run_id = start_run(dict(PARAMS), trace_csv(3))
    message = whatif_queue.get(timeout=5)
    assert message.headers["task"] == "portal.whatif.run"
    assert message.headers["argsrepr"] == repr((run_id,))
    assert list(message.headers["timelimit"]) == [42 + 30, 42]  # hard, soft
    message.ack()


def form(**fields: Any) -> dict[str, Any]:
    data = {
        "source": "60_job",
        "policies": ["fifo"],
        "placements": ["count"],
        "leaves": "2",
        "total_gpus": "16",
        "gpus_per_server": "4",
        "duration_scale": "1",
    }
    data.update(fields)
    return data


@override_settings(WHATIF_MAX_GPUS=64, WHATIF_MAX_LEAVES=8, WHATIF_MAX_TRACE_JOBS=10)
def test_form_refuses_clusters_and_traces_too_large(admin: Client) -> None:
    page = admin.post("/whatif/", form(total_gpus="65"))
    assert page.status_code == 400 and b"At most 64 GPUs can be simulated here." in page.content
    page = admin.post("/whatif/", form(leaves="9", placements=["vclos"]))
    assert page.status_code == 400 and b"At most 8 leaves can be simulated here." in page.content
    upload = SimpleUploadedFile("t.csv", trace_csv(11).encode())
    page = admin.post("/whatif/", form(source="upload", upload=upload))
    assert page.status_code == 400
    assert b"The trace has 11 jobs; at most 10 can be replayed here." in page.content


@override_settings(WHATIF_MAX_GPUS=64, WHATIF_MAX_TRACE_JOBS=10)
def test_the_task_checks_the_bounds_again() -> None:
    with pytest.raises(TraceError, match="at most 10"):
        load_trace(dict(PARAMS), trace_csv(11))
    trace = load_trace(dict(PARAMS), trace_csv(10))
    with pytest.raises(ValueError, match="At most 64 GPUs"):
        compare(trace, {**PARAMS, "total_gpus": 100_000})


def test_history_is_cut_to_its_newest_jobs(alice: Any, acme: Tenant) -> None:
    finish_jobs(alice, acme, [10, 20, 30, 40])
    assert [job.duration for job in history_trace(limit=2)] == [30, 40]
    assert len(history_trace()) == 4


@pytest.mark.slow
def test_a_real_worker_stops_a_run_at_its_soft_time_limit(
    whatif_queue: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """A worker on ``-Q whatif`` (prefork: time limits need it) stops a long run and says why."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings.test"}
    worker = subprocess.Popen(
        [*WORKER, "-P", "prefork", "-c", "1", "--without-heartbeat", "--without-gossip"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its pool's children go with it
    )
    try:
        # every policy on every placement over the longest trace allowed: many seconds of work
        params = {
            **PARAMS,
            "policies": ["fifo", "tiresias", "elastic-tiresias", "dlas", "srtf"],
            "placements": ["count", "vclos", "ecmp"],
            "elastic": True,
        }
        with (
            override_settings(WHATIF_SOFT_TIME_LIMIT_SECONDS=1),
            django_capture_on_commit_callbacks(execute=True),
        ):
            run_id = start_run(params, trace_csv(int(settings.WHATIF_MAX_TRACE_JOBS)))
        deadline = time.monotonic() + 90
        state = get_run(run_id)
        while state is not None and state["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, f"run still {state['status']}"
            time.sleep(0.5)
            state = get_run(run_id)
        assert state is not None and state["status"] == "failed"
        assert "time limit" in state["error"]
    finally:
        stop_group(worker)
