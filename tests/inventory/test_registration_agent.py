"""A real agent process registers its server: pending, accepted, then a GPU gone drains it.

``python -m workers.agent`` runs with a stand-in ``pynvml`` on its PYTHONPATH
(``workers/tests/fake_pynvml``: the NVML library boundary, its GPUs read from a
file the test rewrites); every report it pushes onto its queue on the real
Redis is handed to ``handle_signed_report`` as the report worker would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
from django.conf import settings

from control.reports import handle_signed_report
from control.state import read_cluster
from inventory.models import PendingServer, Server, ServerState
from inventory.registration import do_accept_server
from inventory.services import do_load_topology
from jobs.agent_trust import key_text
from tests.processes import stop_group

pytestmark = [pytest.mark.slow, pytest.mark.stack, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_NVML = REPO_ROOT / "workers" / "tests" / "fake_pynvml"
broker: Any = kombu  # kombu is only partly typed


def gpus_file(path: Path, node: str, count: int) -> None:
    path.write_text(json.dumps([{"uuid": f"GPU-{node}-{i}"} for i in range(count)]))


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    if not os.environ.get("REDIS_URL"):
        pytest.skip("no REDIS_URL: the agent needs the real Redis")
    tag = uuid.uuid4().hex[:8]
    node, queue = f"reg-{tag}", f"reports-{tag}"
    gpus = tmp_path / "gpus.json"
    gpus_file(gpus, node, 2)
    with broker.Connection(str(settings.REDIS_URL)) as conn:
        broker.Queue(queue, broker.Exchange(queue, type="direct"), routing_key=queue)(
            conn.default_channel
        ).declare()
    portal_only = {"DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL", "DATABASE_URL", "SECRET_KEY"}
    env = {
        **{k: v for k, v in os.environ.items() if k not in portal_only},
        "REDIS_URL": str(settings.REDIS_URL),
        "PORTAL_DATA_DIR": str(tmp_path / "agent-data"),
        "AGENT_HEARTBEAT_SECONDS": "1",
        "PYTHONPATH": f"{FAKE_NVML}{os.pathsep}{REPO_ROOT}",
        "FAKE_NVML_FILE": str(gpus),
        "AGENT_HARDWARE": "nvml",  # a --cpu agent reads GPUs only when told to
        "AGENT_KEY": key_text(node),
    }
    argv = [
        sys.executable, "-m", "workers.agent", "--node", node, "--gpus", "2", "--cpu",
        "--reports-queue", queue, "--heartbeats-queue", queue,
    ]  # fmt: skip
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield node, queue, gpus
    finally:
        stop_group(process)


def serve(queue: str, until: Callable[[], bool], timeout: float = 60) -> list[str]:
    """Hand every report on ``queue`` to the control plane until ``until()``."""
    outcomes: list[str] = []
    deadline = time.monotonic() + timeout
    with broker.Connection(str(settings.REDIS_URL)) as conn:
        reports = conn.SimpleQueue(queue)
        try:
            while not until():
                assert time.monotonic() < deadline, outcomes[-10:]
                try:
                    message = reports.get(block=True, timeout=1)
                except reports.Empty:
                    continue
                message.ack()
                args, _kwargs, _embed = message.decode()
                outcomes.append(handle_signed_report(args[0]))
        finally:
            reports.close()
    return outcomes


def test_a_real_agent_registers_is_accepted_and_is_drained_when_a_gpu_goes(
    agent: tuple[str, str, Path],
) -> None:
    node, queue, gpus = agent
    do_load_topology(
        {"leaves": 1, "spines": 1, "servers_per_leaf": 2, "gpus_per_server": 2, "servers": []}
    )
    serve(queue, lambda: PendingServer.objects.filter(node=node).exists())
    pending = PendingServer.objects.get(node=node)
    assert pending.hardware["source"] == "nvml"
    assert [g["uuid"] for g in pending.hardware["gpus"]] == [f"GPU-{node}-0", f"GPU-{node}-1"]
    cluster = read_cluster()
    assert cluster is not None and node not in {h.node for h in cluster.homes.values()}

    do_accept_server(pending=pending.pk, leaf=0, gpu_type="a100-40g")
    server = Server.objects.get(node=node)

    def schedulable() -> bool:
        state = read_cluster()
        assert state is not None
        mine = {i for i, home in state.homes.items() if home.node == node}
        return bool(mine) and mine <= set(state.schedulable)

    serve(queue, schedulable)
    gpus_file(gpus, node, 1)  # GPU 1 falls off the bus

    def drained() -> bool:
        server.refresh_from_db()
        return server.state == ServerState.DRAINING

    serve(queue, drained)
    assert server.state_reason == (
        f"hardware differs: 1 GPUs reported, 2 expected; GPU 1 (GPU-{node}-1) gone"
    )
    assert not schedulable()
