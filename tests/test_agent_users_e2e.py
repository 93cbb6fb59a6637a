"""End to end: an agent logged into Redis as its own user runs a job the control plane placed.

The real agent (``python -m workers.agent``) is started with the ``REDIS_URL``
that ``manage.py agent_credentials`` prints, nothing of the portal's; the
control plane is this test's process: its tick places a built-in job on the
agent's node and sends the StartWorkers (with the job's Redis password), and
every report the agent pushes is handed to ``handle_signed_report`` as the
report worker would, until the job is completed.  On the real Redis 7 of
``REDIS_URL`` (skipped without it); the reports travel on a queue of the
test's own, which is all the agent's user may push to here.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from control import agent_users
from control.reports import handle_signed_report
from control.tick import run_tick
from inventory.models import Server
from inventory.services import do_heartbeat, do_load_topology
from jobs.agent_trust import key_text
from jobs.models import Job
from jobs.services import check_job_spec, do_submit_job
from workers.agent.redis_acl import agent_user, delete_agent_user, job_user

pytestmark = [pytest.mark.slow, pytest.mark.stack, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[1]
broker: Any = kombu  # kombu is only partly typed


@dataclass
class Node:
    """The agent's node, its reports queue and its process."""

    name: str
    reports: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    if not os.environ.get("REDIS_URL"):
        pytest.skip("no REDIS_URL: agents' own users are tried on the shared Redis 7")
    admin = redis.Redis.from_url(str(settings.REDIS_URL))
    if int(str(admin.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("agents' own users need Redis 7's key selectors")
    tag = uuid.uuid4().hex[:8]
    name, reports = f"own-{tag}", f"reports-{tag}"
    spec = {"leaves": 1, "spines": 1, "servers_per_leaf": 1, "gpus_per_server": 2}
    do_load_topology({**spec, "servers": [{"leaf": 0, "slot": 0, "node": name}]})
    do_heartbeat(node=name, info={"slots": 2}, at=timezone.now())
    overrides = override_settings(
        AGENT_REDIS_USERS="on", AGENT_REPORT_QUEUES=[reports], AGENT_SEND_IN_BACKGROUND=False
    )
    with overrides, broker.Connection(str(settings.REDIS_URL)) as conn:
        # The report worker's queue exists before any agent sends (as the control plane's does).
        broker.Queue(reports, broker.Exchange(reports, type="direct"), routing_key=reports)(
            conn.default_channel
        ).declare()
        out = io.StringIO()
        call_command("agent_credentials", name, stdout=out)
        url = out.getvalue().strip()
        log = tmp_path / "agent.log"
        started = start_agent(name, reports, url, tmp_path, log)
        running = Node(name, reports, url, started, log)
        try:
            yield running
        finally:
            stop(running)
            delete_agent_user(admin, name)
            for pattern in (f"*{name}*", f"*{reports}*"):
                for key in admin.scan_iter(match=pattern):
                    admin.delete(key)


def start_agent(
    name: str, reports: str, url: str, data: Path, log: Path
) -> subprocess.Popen[bytes]:
    """``python -m workers.agent`` with its own Redis user and key, nothing of the portal's."""
    portal_only = {"DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL", "DATABASE_URL", "SECRET_KEY"}
    env = {
        **{k: v for k, v in os.environ.items() if k not in portal_only},
        "REDIS_URL": url,
        "PORTAL_DATA_DIR": str(data / "agent-data"),
        "AGENT_HEARTBEAT_SECONDS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "AGENT_KEY": key_text(name),
    }
    argv = [
        sys.executable, "-m", "workers.agent", "--node", name, "--gpus", "2", "--cpu",
        "--reports-queue", reports, "--heartbeats-queue", reports, "--stop-children-on-exit",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(node: Node) -> None:
    if node.process.poll() is None:
        node.process.send_signal(signal.SIGTERM)
    try:
        node.process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        node.process.kill()
        node.process.wait()


def serve_reports(node: Node, until: Any, timeout: float) -> list[str]:
    """Hand every report on the node's queue to the control plane (and tick now and then)
    until ``until()``; the outcomes."""
    outcomes: list[str] = []
    deadline = time.monotonic() + timeout
    with broker.Connection(str(settings.REDIS_URL)) as conn:
        queue = conn.SimpleQueue(node.reports)
        try:
            while not until():
                if time.monotonic() > deadline or node.process.poll() is not None:
                    tail = node.log.read_text(errors="replace")[-3000:]
                    raise AssertionError(f"not done in {timeout} s: {outcomes[-20:]}\n{tail}")
                try:
                    message = queue.get(block=True, timeout=1)
                except queue.Empty:
                    run_tick(policy="fifo")
                    continue
                message.ack()
                args, _kwargs, _embed = message.decode()
                outcomes.append(handle_signed_report(args[0]))
        finally:
            queue.close()
    return outcomes


def test_an_agent_on_its_own_redis_user_runs_a_job_the_control_plane_placed(
    node: Node, alice: Any, acme: Any
) -> None:
    with override_settings(
        AGENT_REDIS_USERS="on", AGENT_REPORT_QUEUES=[node.reports], AGENT_SEND_IN_BACKGROUND=False
    ):
        first = serve_reports(node, until=lambda: _beat_arrived(node.name), timeout=90)
        assert "heartbeat" in first
        data = {"name": "own", "workload": "mlp-digits", "gpus": 2, "args": {"epochs": 2}}
        job = do_submit_job(user=alice, tenant=acme, spec=check_job_spec(tenant=acme, data=data))
        assert run_tick(policy="fifo").ran
        job.refresh_from_db()
        assert job.state == "running"

        def done() -> bool:
            job.refresh_from_db()
            return job.state in ("completed", "failed")

        outcomes = serve_reports(node, until=done, timeout=240)
        assert job.state == "completed", (job.state, outcomes[-20:])

        admin = redis.Redis.from_url(str(settings.REDIS_URL))
        users = {client.get("user") for client in admin.client_list()}
        assert agent_user(node.name) in users  # its broker and store connections: its own user
        assert "portal" not in node.url and "default" not in node.url
        log = node.log.read_text(errors="replace")
        assert "NOPERM" not in log and "no permissions" not in log, log[-3000:]

        # The job ended there: once its heartbeat says so, the user loses the job's keys.
        serve_reports(node, until=lambda: _lists_no_job(node.name), timeout=30)
        agent_users.maintain(time.time() + agent_users.DISPATCH_GRACE_S + 1, force=True)
        name = f"job-{job.pk}"
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis.from_url(node.url).get(f"edl:{name}:anything")
        assert job_user(name) not in set(admin.acl_users())


def _beat_arrived(name: str) -> bool:
    """Whether the control plane has a heartbeat of the agent's (it tells its device)."""
    return bool(Server.objects.get(node=name).agent_info.get("device"))


def _lists_no_job(name: str) -> bool:
    """Whether the node's newest heartbeat lists no process and no job runs."""
    info = Server.objects.get(node=name).agent_info
    return not info.get("workers") and not Job.objects.filter(state="running").exists()
