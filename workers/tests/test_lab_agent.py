"""A session's lab started by the agent (launcher ``session``) in the real sandbox, relayed.

The agent gets a ``StartWorkers`` with ``launcher: session``; its worker runs JupyterLab in
bubblewrap (the same sandbox, limits and seccomp filter as any program) on ``lab.sock`` in
its scratch HOME; the agent's supervision pass starts the relay; the test plays the portal:
a cell sees its devices and imports torch, a notebook saved lands in the HOME, Jupyter's
activity is reported, and a stop ends the lab and its relay.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from workers.agent.agent import Agent
from workers.agent.homes import restore
from workers.agent.lab_relay import connect_lab
from workers.artifacts import ArtifactStore
from workers.protocol import Heartbeat, LabActivity, Stopped
from workers.tests import test_sandbox as sandboxed
from workers.tests.test_home_syncs import Recorded
from workers.tests.test_lab_relay import Portal, run_cell
from workers.tests.test_sandbox import CODE, Collected, Host, make_agent, start_payload

host = sandboxed.host
node = sandboxed.node
redis_url = sandboxed.redis_url
agent_secrets = sandboxed.agent_secrets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def start_session(agent: Agent, sent: Collected, host: Host, **program: Any) -> str:
    """Start a session (launcher ``session``) on ``agent``; its job name once its lab answers
    on ``lab.sock`` and the agent relays it."""
    job = f"job-{random.randrange(10**6, 10**7)}"
    payload = start_payload(job, f"c-{job}", launcher="session", **program)
    payload["program"]["entrypoint"] = ["lab"]
    assert agent.receive(payload) == "applied", sent.reports
    job_dir = host.data_dir / "jobs" / job
    deadline = time.monotonic() + 120
    while True:
        agent.tick()
        try:
            connect_lab(job_dir, "w0").close()
            break
        except OSError:
            log = job_dir.parent.parent / "logs"
            assert time.monotonic() < deadline, [p.read_text()[-3000:] for p in log.rglob("*.log")]
            time.sleep(0.3)
    agent.tick()
    return job


def stop_session(agent: Agent, job: str) -> None:
    """Stop it; wait until its relay has gone and its home's final sync is done."""
    agent.processes.stop(job, f"stop-{job}", grace_seconds=0.0)
    deadline = time.monotonic() + 60
    while any(key.startswith(f"{job}/") for key in agent.labs.relays):
        assert time.monotonic() < deadline
        agent.tick()
        time.sleep(0.2)
    assert agent.home_syncs.wait(60)


@pytest.fixture
def session(host: Host, node: str, redis_url: str) -> Iterator[tuple[Agent, Collected, str]]:
    """An agent whose session ``job-<n>`` runs its lab in worker ``w0``."""
    host.bundle(CODE, "# an empty session bundle\n", "README.md")
    agent, sent = make_agent(host, node, redis_url)
    job = start_session(agent, sent, host)
    yield agent, sent, job
    agent.labs.close()
    agent.processes.end_all()
    agent.processes.release()


def test_the_lab_runs_in_the_sandbox_and_is_relayed(
    host: Host, node: str, redis_url: str, session: tuple[Agent, Collected, str]
) -> None:
    agent, sent, job = session
    client = redis.Redis.from_url(redis_url)
    job_id = job.removeprefix("job-")
    portal = Portal(client, node=node, job=job, base=f"/sessions/{job_id}/lab/")
    home = host.data_dir / "jobs" / job / "scratch" / "w0"
    record = agent.processes.children[(job, "w0")].record
    assert record.sandboxed and record.launcher == "session"
    status, _h, page = portal.http("GET", "lab")
    assert status == 200 and b"jupyter-config-data" in page
    text = run_cell(
        portal,
        "import os, torch\n"
        "print('devices', torch.cuda.device_count(), repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"
        "print('home', os.environ['HOME'], os.getuid())\n"
        "print('secret' , os.environ.get('SECRET_KEY'), os.environ.get('DATABASE_URL'))",
        "secret",
    )
    assert "devices 0 ''" in text, text  # a CPU node: no GPU is visible
    assert f"home {home}" in text, text
    assert "secret None None" in text  # nothing of the agent's own environment
    notebook = {"type": "notebook", "content": {"cells": [], "metadata": {}, "nbformat": 4,
                                                "nbformat_minor": 5}}  # fmt: skip
    status, _h, body = portal.http(
        "PUT", "api/contents/kept.ipynb", json.dumps(notebook).encode(),
        [("Content-Type", "application/json")],
    )  # fmt: skip
    assert status in (200, 201), body
    assert json.loads((home / "kept.ipynb").read_text())["nbformat"] == 4
    agent.labs.relays[f"{job}/w0"][1].poll_status()
    activity = [r for r in sent.reports if isinstance(r, LabActivity)]
    assert activity and activity[-1].job == job and activity[-1].node == node
    assert abs(activity[-1].last_activity - time.time()) < 600
    # The lab's token is the agent's: not in the lab's log, nor in its command line.
    logs = "".join(p.read_text() for p in (host.data_dir / "logs").rglob("*.log"))
    token = agent.labs.tokens.get(job, "w0")
    assert token and token not in logs
    # Stopped: the worker ends, the relay goes, and its token with it.
    stop_session(agent, job)
    assert agent.labs.tokens.get(job, "w0") is None
    client.close()


def test_a_notebook_saved_in_one_session_is_in_the_next(
    host: Host, node: str, redis_url: str, tmp_path: Path
) -> None:
    """The user's persistent home: restored before the lab starts, synced when it stops
    (before the stop is reported), so the next session of the same user finds its files."""
    host.bundle(CODE, "# an empty session bundle\n", "README.md")
    store = tmp_path / "store"
    agent, sent = make_agent(host, node, redis_url, artifact_url=f"file://{store}")
    client = redis.Redis.from_url(redis_url)
    home = {"home_prefix": "homes/lab/7/", "home_quota_mib": 10}
    try:
        first = start_session(agent, sent, host, **home)
        portal = Portal(client, node=node, job=first, base=f"/sessions/{first[4:]}/lab/")
        notebook = {"type": "notebook", "content": {"cells": [], "metadata": {},
                                                    "nbformat": 4, "nbformat_minor": 5}}  # fmt: skip
        status, _h, body = portal.http(
            "PUT", "api/contents/kept.ipynb", json.dumps(notebook).encode(),
            [("Content-Type", "application/json")],
        )  # fmt: skip
        assert status == 201, body
        stop_session(agent, first)
        assert (store / "homes" / "lab" / "7" / "manifest.json").is_file()
        second = start_session(agent, sent, host, **home)
        portal = Portal(client, node=node, job=second, base=f"/sessions/{second[4:]}/lab/")
        status, _h, body = portal.http("GET", "api/contents")
        assert status == 200
        assert "kept.ipynb" in [item["name"] for item in json.loads(body)["content"]]
        stop_session(agent, second)
    finally:
        agent.labs.close()
        agent.processes.end_all()
        agent.processes.release()
        client.close()


def test_a_running_lab_s_home_is_synced_off_the_pass_and_its_stop_sync_wins(
    host: Host, node: str, redis_url: str, tmp_path: Path
) -> None:
    """A periodic sync of a running session's home runs beside the supervision pass (which
    goes on, heartbeats included, while its upload is held); the sync at stop runs after
    it, with what the session saved meanwhile, and the stop is reported only then."""
    host.bundle(CODE, "# an empty session bundle\n", "README.md")
    store = tmp_path / "store"
    agent, sent = make_agent(host, node, redis_url, artifact_url=f"file://{store}")
    agent.home_syncs.every_s = 1.0  # SESSION_HOME_SYNC_SECONDS=1
    recorded = Recorded()
    agent.homes.open_store = recorded
    recorded.held = threading.Event()  # each blob upload waits for the test
    client = redis.Redis.from_url(redis_url)
    try:
        job = start_session(agent, sent, host, home_prefix="homes/lab/8/", home_quota_mib=10)
        portal = Portal(client, node=node, job=job, base=f"/sessions/{job[4:]}/lab/")
        save_notebook(portal, "kept.ipynb", "print('first')")
        deadline = time.monotonic() + 60
        while not recorded.uploading.is_set():  # the first period passes while the pass runs
            assert time.monotonic() < deadline
            agent.tick()
            time.sleep(0.2)
        beats = len(sent.of(Heartbeat))
        held_since = time.monotonic()
        while len(sent.of(Heartbeat)) == beats:  # the pass goes on, the upload held
            assert time.monotonic() - held_since < agent.config.heartbeat_seconds + 10
            started = time.monotonic()
            agent.tick()
            assert time.monotonic() - started < 2.0
            time.sleep(0.2)
        save_notebook(portal, "kept.ipynb", "print('second')")
        save_notebook(portal, "later.ipynb", "print('later')")
        agent.processes.stop(job, f"stop-{job}", grace_seconds=0.0)
        while any(key.startswith(f"{job}/") for key in agent.labs.relays):
            assert time.monotonic() < deadline + 60
            agent.tick()
            time.sleep(0.2)
        agent.tick()
        assert job in agent.home_syncs.jobs()
        assert not [r for r in sent.of(Stopped) if r.job == job]  # not before its home
        recorded.held.set()
        while not [r for r in sent.of(Stopped) if r.job == job]:
            assert time.monotonic() < deadline + 120
            agent.tick()
            time.sleep(0.2)
        home = host.data_dir / "jobs" / job / "scratch" / "w0"
        back = tmp_path / "back"
        restore(ArtifactStore(f"file://{store}"), "homes/lab/8", back, 10 << 20)
        for name in ("kept.ipynb", "later.ipynb"):
            assert (back / name).read_bytes() == (home / name).read_bytes()
        assert "second" in (back / "kept.ipynb").read_text()
        assert agent.homes.records() == {}
    finally:
        recorded.held.set()
        agent.labs.close()
        agent.processes.end_all()
        agent.processes.release()
        client.close()


def save_notebook(portal: Portal, name: str, source: str) -> None:
    """Save a one-cell notebook ``name`` through Jupyter's contents API."""
    cell: dict[str, Any] = {"cell_type": "code", "source": source, "metadata": {}, "outputs": [],
            "execution_count": None}  # fmt: skip
    notebook = {"type": "notebook", "content": {"cells": [cell], "metadata": {}, "nbformat": 4,
                                                "nbformat_minor": 5}}  # fmt: skip
    status, _h, body = portal.http(
        "PUT", f"api/contents/{name}", json.dumps(notebook).encode(),
        [("Content-Type", "application/json")],
    )  # fmt: skip
    assert status in (200, 201), body
