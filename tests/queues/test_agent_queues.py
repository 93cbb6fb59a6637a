"""A taken-over node cannot run the portal's tasks by pushing messages onto its queues.

Agents may LPUSH onto ``AGENT_REPORT_QUEUES``.  A real Celery worker, built as
the portal's (``tests/queues/guard_app.py``: ``portal.broker``'s transport and
task base), consumes the test's own report, heartbeat and portal queues.  Onto
the report queue the attacker pushes, as raw bytes: another task's message
that claims to come from the portal queue, and messages that are not
messages at all.  The forged task never runs, the worker survives the
garbage, and the reports and the portal queue's own task still run.  On the
old code (reports on the ``portal`` queue, a message's queue taken from its
own words) the forged task ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from portal.broker import PortalTask, allowed, stamped
from tests.processes import stop_group
from workers.protocol import REPORT_TASK

ROOT = Path(__file__).resolve().parents[2]


def raw_message(queue: str, task: str, key: str) -> dict[str, Any]:
    """The bytes the portal's app would push for ``task(key)`` onto ``queue``, decoded
    (sent to a queue nobody reads, then given ``queue``'s routing)."""
    from tests.queues.guard_app import app

    scratch = f"t-scratch-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(app.conf.broker_url)
    app.send_task(task, args=[key], queue=scratch)
    item = client.rpop(scratch)
    assert isinstance(item, bytes)
    message = dict(json.loads(item))
    message["properties"]["delivery_info"].update(exchange=queue, routing_key=queue)
    return message


def forged(message: dict[str, Any], claims: str) -> bytes:
    """``message`` claiming it was routed to the queue ``claims``."""
    info = message["properties"]["delivery_info"]
    info.update(exchange=claims, routing_key=claims)
    return json.dumps(message).encode()


def wait_for(client: redis.Redis, key: str, worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while client.get(key) is None:
        assert worker.poll() is None, "the worker exited"
        assert time.monotonic() < deadline, f"{key} never ran"
        time.sleep(0.05)


def test_only_reports_run_from_the_agents_queues(redis_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    reports, beats, portal = f"t-reports-{tag}", f"t-beats-{tag}", f"t-portal-{tag}"
    env = {**os.environ, "REDIS_URL": redis_url, "AGENT_REPORT_QUEUES": f"{reports},{beats}"}
    os.environ["REDIS_URL"] = redis_url
    client = redis.Redis.from_url(redis_url)
    keys = {name: f"t-ran-{name}-{tag}" for name in ("forged", "beat", "report", "own", "after")}
    attacks = [
        forged(raw_message(reports, "guard.other", keys["forged"]), claims=portal),
        forged(raw_message(beats, "guard.other", keys["forged"]), claims=portal),
        b"not json at all",
        b"[1, 2, 3]",
        json.dumps({"properties": {"delivery_tag": 7}, "body": 5}).encode(),
    ]
    client.lpush(reports, *attacks)
    client.lpush(beats, forged(raw_message(beats, REPORT_TASK, keys["beat"]), claims=portal))
    client.lpush(reports, json.dumps(raw_message(reports, REPORT_TASK, keys["report"])))
    client.lpush(portal, json.dumps(raw_message(portal, "guard.other", keys["own"])))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.queues.guard_app", "worker",
         "-Q", f"{beats},{reports},{portal}", "--pool", "solo", "--loglevel", "WARNING",
         "-n", f"guard-{tag}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        for name in ("report", "beat", "own"):
            wait_for(client, keys[name], worker)
        client.lpush(reports, json.dumps(raw_message(reports, REPORT_TASK, keys["after"])))
        wait_for(client, keys["after"], worker)  # the garbage did not stop the consumer
        assert client.llen(reports) == 0 and client.llen(beats) == 0
        assert client.get(keys["forged"]) is None
    finally:
        stop_group(worker)
        client.delete(reports, beats, portal, *keys.values())
    logged = worker.stderr.read().decode() if worker.stderr else ""
    assert "refused task guard.other" in logged and "malformed" in logged, logged[-2000:]


def test_a_message_says_the_queue_it_was_read_from() -> None:
    message = {"properties": {"delivery_tag": "t", "delivery_info": {"routing_key": "portal"}}}
    assert stamped(message, "reports") == {
        "properties": {
            "delivery_tag": "t",
            "delivery_info": {"exchange": "reports", "routing_key": "reports"},
        }
    }
    bad: object
    for bad in ([], {"properties": []}, {"properties": {"delivery_tag": 1}}, {
        "properties": {"delivery_tag": "t", "body_encoding": "zip"}}, {
        "properties": {"delivery_tag": "t"}, "body": 3}, {
        "properties": {"delivery_tag": "t"}, "headers": "x"},
    ):  # fmt: skip
        assert stamped(bad, "reports") is None


@pytest.mark.django_db
def test_off_an_agents_queue_only_the_report_task_runs() -> None:
    assert allowed(REPORT_TASK, "reports") and allowed(REPORT_TASK, "heartbeats")
    assert not allowed("control.scheduler_tick", "reports")
    assert not allowed("notifications.deliver", "heartbeats")
    assert allowed("control.scheduler_tick", "portal") and allowed("anything", None)


def test_the_portals_app_uses_the_guard() -> None:
    from portal.celery import app

    assert app.conf.broker_transport == "portal.broker:Transport"
    assert issubclass(app.Task, PortalTask)
    assert app.conf.task_routes["control.agent_report"] == {"queue": "reports"}


@pytest.mark.parametrize("queues", ["portal,heartbeats", "reports,tick", "webhooks"])
def test_settings_refuse_agent_queues_that_carry_the_portals_own_tasks(
    queues: str, tmp_path: Path
) -> None:
    env = {**os.environ, "AGENT_REPORT_QUEUES": queues, "PORTAL_DATA_DIR": str(tmp_path)}
    code = "from django.conf import settings; settings.AGENT_REPORT_QUEUES"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "portal.settings.test"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "AGENT_REPORT_QUEUES may not name a queue of the portal's own tasks" in result.stderr
