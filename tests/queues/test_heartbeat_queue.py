"""A backlog of reports does not hold a heartbeat back (workers.protocol.HEARTBEATS_QUEUE).

A real Celery worker, started as ``runstack`` starts the report worker (``-Q
heartbeats,reports,portal``, two processes, one message prefetched each) but on this
test's own queues, finds 300 reports of 50 ms of work each queued (7.5 s of
backlog) and then one heartbeat: the heartbeat is handled within a few
reports, not after the backlog. On one queue it would come last, and a real
heartbeat expires (``AGENT_DOWN_AFTER_SECONDS``) before that on a loaded
machine, marking every live server down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

from portal.management.commands.runstack import REPORT_WORKER_QUEUES
from tests.processes import stop_group

ROOT = Path(__file__).resolve().parents[2]
BACKLOG = 300


def test_a_heartbeat_is_served_beside_a_backlog_of_reports(redis_url: str) -> None:
    from tests.queues.backlog_app import app

    assert REPORT_WORKER_QUEUES.split(",")[0] == "heartbeats"  # the order runstack gives
    tag = uuid.uuid4().hex[:8]
    beats, reports, key = f"t-heartbeats-{tag}", f"t-portal-{tag}", f"t-beat-{tag}"
    client = redis.Redis.from_url(redis_url)
    for _ in range(BACKLOG):
        app.send_task("backlog.report", queue=reports)
    app.send_task("backlog.heartbeat", args=[key], queue=beats)
    sent = time.time()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.queues.backlog_app", "worker",
         "-Q", f"{beats},{reports}", "--concurrency", "2", "--loglevel", "WARNING",
         "-n", f"backlog-{tag}@%h"],
        cwd=ROOT, env={**os.environ, "REDIS_URL": redis_url},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while (handled := client.get(key)) is None:
            assert worker.poll() is None, "the worker exited"
            assert time.monotonic() < deadline, "the heartbeat was never handled"
            time.sleep(0.05)
        left = client.llen(reports)
    finally:
        stop_group(worker)  # how long its shutdown takes is not this test's question
        client.delete(reports, beats, key)
    handled_after = float(handled) - sent
    assert left >= BACKLOG - 50, (
        f"the heartbeat waited for {BACKLOG - left} of {BACKLOG} reports ({handled_after:.1f} s)"
    )
