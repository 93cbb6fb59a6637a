"""What ``ps`` shows of everything an agent starts: no secret on any command line.

A real agent (``Agent``, real bubblewrap, real Redis) starts a tenant program
under the ``edl`` launcher and a built-in workload; while they run, the
command line of every process below the agent's children is read from
``/proc`` (what any user of the host sees with ``ps``) and searched for each
secret the agent or the job holds: the portal's Redis password, the job's
Redis password, the agents' ACL secret, the agent's key, and the control
plane's secrets in the agent's environment.
"""

from __future__ import annotations

import shutil
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from workers.agent.agent import Agent
from workers.agent.config import AgentConfig
from workers.agent.limits import descendants
from workers.agent.redis_acl import agents_secret, delete_job_user, derive_password
from workers.agent.store import AgentStore
from workers.elastic.control import JobControl
from workers.protocol import Report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CODE = "ef" * 32
AGENT_KEY = bytes.fromhex("5a" * 32)
CONTROL_SECRETS = {
    "SECRET_KEY": "django-secret-on-no-command-line",
    "AGENT_SIGNING_KEY": "signing-master-on-no-command-line",
    "DATABASE_URL": "postgres://portal:pg-password-on-no-command-line@db/portal",
}

WAIT_SCRIPT = """
import os, time
from pathlib import Path
Path(os.environ["SCRATCH_DIR"], "started").write_text("yes")
time.sleep(30)
"""


@pytest.fixture
def base() -> Iterator[Path]:
    """The node's directories, outside /tmp (a sandbox's /tmp is its own)."""
    made = Path("/var/tmp") / f"portal-cmdline-{uuid.uuid4().hex[:8]}"
    (made / "data").mkdir(parents=True)
    (made / "code" / CODE).mkdir(parents=True)
    (made / "code" / CODE / "main.py").write_text(textwrap.dedent(WAIT_SCRIPT))
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def job() -> Iterator[str]:
    name = f"cmdline-{uuid.uuid4().hex[:8]}"
    yield name
    JobControl(str(settings.REDIS_URL), name).cleanup()
    delete_job_user(redis.Redis.from_url(str(settings.REDIS_URL)), name)


def make_agent(base: Path, node: str) -> Agent:
    config = AgentConfig(
        node=node, device="cpu", slots=2, redis_url=str(settings.REDIS_URL),
        data_dir=base / "data", key=AGENT_KEY,
    )  # fmt: skip
    sent: list[Report] = []
    return Agent(
        config,
        AgentStore.from_url(config.redis_url, node),
        send=sent.append,
        resolve_code=lambda program: base / "code" / program.code,
    )


def start(job: str, command_id: str, slot: int, **what: Any) -> dict[str, Any]:
    return {
        "type": "start_workers", "job": job, "command_id": command_id, "batch_size": 8,
        "recovery": "consistent", "checkpoint_every": 0, "initial_world": 1,
        "workers": [{"worker_id": f"w{slot}", "slot": slot, "rank": 0}], **what,
    }  # fmt: skip


def command_lines(pids: list[int]) -> dict[int, str]:
    """Each process's command line as ``ps`` shows it (arguments joined by spaces)."""
    found = {}
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # it ended meanwhile
        found[pid] = raw.replace(b"\0", b" ").decode(errors="replace")
    return found


def test_nothing_the_agent_starts_shows_a_secret_on_its_command_line(
    base: Path, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CONTROL_SECRETS.items():
        monkeypatch.setenv(name, value)
    admin = redis.Redis.from_url(str(settings.REDIS_URL))
    agent = make_agent(base, f"cmdline-{uuid.uuid4().hex[:6]}")
    program = {
        "code": CODE, "code_path": f"code/{CODE}.tar.gz", "entrypoint": ["main.py"],
        "launcher": "edl", "generation": 0, "world_size": 1, "master_port": 29500,
    }  # fmt: skip
    builtin = f"{job}-b"
    try:
        assert agent.receive(start(job, "c1", 0, program=program)) == "applied"
        workload = {"workload": "mlp-digits", "args": {"epochs": 1000}}
        assert agent.receive(start(builtin, "c2", 1, **workload)) == "applied"
        secret = agents_secret(admin)
        secrets = {
            "the portal's Redis password": urlsplit(str(settings.REDIS_URL)).password,
            "the job's Redis password": derive_password(secret, job),
            "the built-in's Redis password": derive_password(secret, builtin),
            "the agents' ACL secret": secret.decode(),
            "the agent's key": AGENT_KEY.hex(),
            **{f"the agent's {name}": value for name, value in CONTROL_SECRETS.items()},
        }
        started = base / "data" / "jobs" / job / "scratch" / "w0" / "started"
        seen: dict[int, str] = {}
        deadline = time.monotonic() + 60
        while not (started.exists() and len(agent.processes.records()) == 2):
            assert time.monotonic() < deadline, "the two workers did not start"
            agent.tick()
            time.sleep(0.1)
        for _ in range(20):  # a few looks while both run: the built-in starts its children late
            roots = [record.pid for record in agent.processes.records()]
            seen.update(command_lines([p for r in roots for p in (r, *descendants(r))]))
            time.sleep(0.1)
        lines = " | ".join(seen.values())
        assert "main.py" in lines and "workers.elastic.worker" in lines, lines  # both were seen
        shown = {
            (label, pid): line
            for pid, line in seen.items()
            for label, value in secrets.items()
            if value and value in line
        }
        assert shown == {}, f"secrets on command lines: {shown}"
    finally:
        agent.close(stop_children=True)
        delete_job_user(admin, builtin)
        JobControl(str(settings.REDIS_URL), builtin).cleanup()
