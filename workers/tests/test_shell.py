"""Shells in a running worker's sandbox (``workers.agent.shell``): real bwrap, nsenter, Redis.

A program waits in its sandbox; an ``OpenShell`` command opens a shell beside it; the test
plays the portal's part on the shell's two streams (``workers.protocol.shell_keys``).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from workers.agent.agent import Agent
from workers.agent.shell import parse_environ, shell_env
from workers.protocol import shell_entries, shell_keys
from workers.tests import test_sandbox as sandboxed
from workers.tests.test_sandbox import (
    CODE,
    WAIT_SCRIPT,
    Collected,
    Host,
    make_agent,
    program_uid,
    start_payload,
)

# The sandbox tests' fixtures: a node's directories, its name, Redis, a job, the secrets.
host = sandboxed.host
node = sandboxed.node
redis_url = sandboxed.redis_url
job = sandboxed.job
agent_secrets = sandboxed.agent_secrets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def running(host: Host, node: str, redis_url: str, job: str) -> Iterator[tuple[Agent, Collected]]:
    """An agent whose worker ``w0`` of ``job`` waits in its sandbox."""
    host.bundle(CODE, WAIT_SCRIPT)
    agent, sent = make_agent(host, node, redis_url)
    assert agent.receive(start_payload(job, "c1")) == "applied", sent.reports
    started = host.data_dir / "jobs" / job / "scratch" / "w0" / "started"
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, sent.reports
        time.sleep(0.05)
    yield agent, sent
    agent.processes.end_all()
    agent.processes.release()


def open_shell(agent: Agent, job: str, *argv: str, worker: str = "w0") -> tuple[str, str]:
    """Send an OpenShell; the shell's id and the agent's answer."""
    shell_id = uuid.uuid4().hex
    answer = agent.receive(
        {
            "type": "open_shell",
            "job": job,
            "command_id": f"shell-{shell_id[:12]}",
            "shell_id": shell_id,
            "worker_id": worker,
            "argv": list(argv),
        }
    )
    return shell_id, answer


def read_until_exit(
    client: redis.Redis, node: str, shell_id: str, timeout: float = 30
) -> tuple[bytes, int, str]:
    """Everything the shell wrote, its exit status and the refusal, if any."""
    _in, out = shell_keys(node, shell_id)
    data, last, error = b"", "0-0", ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry_id, fields in shell_entries(client.xread({out: last}, block=500)):
            last = entry_id
            data += fields.get(b"d", b"")
            error = fields.get(b"err", b"").decode() or error
            if b"x" in fields:
                return data, int(fields[b"x"]), error
    raise AssertionError(f"no exit status; output so far: {data!r}")


def test_a_command_runs_in_the_workers_sandbox_as_its_user_and_its_status_comes_back(
    running: tuple[Agent, Collected], node: str, redis_url: str, job: str
) -> None:
    agent, _sent = running
    shell_id, answer = open_shell(agent, job, "sh", "-c", "echo hello; id -u; exit 3")
    assert answer == "applied"
    data, code, _ = read_until_exit(redis.Redis.from_url(redis_url), node, shell_id)
    lines = data.decode().split()
    assert code == 3 and lines == ["hello", str(program_uid(job))], data


def test_input_goes_through_the_pty_and_end_of_input_ends_cat(
    running: tuple[Agent, Collected], node: str, redis_url: str, job: str
) -> None:
    agent, _sent = running
    client = redis.Redis.from_url(redis_url)
    shell_id, _ = open_shell(agent, job, "cat")
    into, _out = shell_keys(node, shell_id)
    client.xadd(into, {"r": "40 120"})
    client.xadd(into, {"d": b"ping\n"})
    client.xadd(into, {"e": "1"})
    data, code, _ = read_until_exit(client, node, shell_id)
    assert code == 0 and data.count(b"ping") == 2, data  # the PTY's echo, then cat's


def test_ctrl_c_interrupts_and_close_ends_the_shell(
    running: tuple[Agent, Collected], node: str, redis_url: str, job: str
) -> None:
    agent, _sent = running
    client = redis.Redis.from_url(redis_url)
    shell_id, _ = open_shell(agent, job, "sh", "-c", "echo ready; exec sleep 60")
    into, out = shell_keys(node, shell_id)
    # A Ctrl-C typed before the shell owns its terminal reaches no one (as on any
    # terminal): wait until it has said so, on a loaded machine that takes seconds.
    seen, last, deadline = b"", "0-0", time.monotonic() + 30
    while b"ready" not in seen and time.monotonic() < deadline:
        for entry_id, fields in shell_entries(client.xread({out: last}, block=500)):
            last, seen = entry_id, seen + fields.get(b"d", b"")
    assert b"ready" in seen, seen
    client.xadd(into, {"d": b"\x03"})
    _data, code, _ = read_until_exit(client, node, shell_id)
    assert code in (-2, 130), code  # SIGINT, from the PTY's line discipline
    shell_id, _ = open_shell(agent, job, "sleep", "60")
    client.xadd(shell_keys(node, shell_id)[0], {"k": "1"})
    _data, code, _ = read_until_exit(client, node, shell_id)
    assert code != 0


def test_the_shell_sees_no_more_than_the_job(
    running: tuple[Agent, Collected], host: Host, node: str, redis_url: str, job: str
) -> None:
    """The host's /root, the agent's private files, the database and a loopback port of the
    host's stay out of reach, as they do for the program (workers/tests/test_sandbox.py)."""
    agent, _sent = running
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    script = (
        f"ls /root; cat {host.data_dir}/agent-private.txt; cat {host.database}; "
        f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' "
        "&& echo REACHED; unshare -U true && echo UNSHARED; env"
    )
    try:
        shell_id, _ = open_shell(agent, job, "sh", "-c", script)
        data, _code, _ = read_until_exit(redis.Redis.from_url(redis_url), node, shell_id)
    finally:
        listener.close()
    text = data.decode(errors="replace")
    assert "agent private" not in text and "tenants, tokens" not in text
    assert "UNSHARED" not in text  # the worker's seccomp filter holds for the shell too
    assert "REACHED" not in text and "SECRET_KEY" not in text and "DATABASE_URL" not in text
    assert "TERM=xterm-256color" in text and f"TORCHELASTIC_RUN_ID={job}" in text


def test_a_worker_that_is_not_here_gets_no_shell_and_the_reason(
    running: tuple[Agent, Collected], node: str, redis_url: str, job: str
) -> None:
    agent, _sent = running
    shell_id, answer = open_shell(agent, job, "true", worker="w7")
    assert answer == "rejected"
    data, code, error = read_until_exit(redis.Redis.from_url(redis_url), node, shell_id)
    assert (data, code) == (b"", 255) and "no worker w7" in error


@pytest.mark.parametrize(
    "name,value,kept",
    [
        ("LR", "0.1", True),
        ("HF_TOKEN", "x", False),
        ("MY_SECRET", "x", False),
        ("AWS_ACCESS_KEY_ID", "x", False),
        ("REDIS_URL", "redis://job-1:pw@10.0.0.1:6379/0", False),
        ("MONKEY", "banana", True),
        ("HOMEPAGE", "https://example.org/", True),
    ],
)
def test_the_shells_environment_drops_secrets(name: str, value: str, kept: bool) -> None:
    env: dict[str, Any] = shell_env({name: value}, "xterm")
    assert (name in env) is kept and env["TERM"] == "xterm"


def test_environ_is_parsed_bounded() -> None:
    assert parse_environ(b"A=1\0B=x=y\0junk\0") == {"A": "1", "B": "x=y"}


def test_an_interactive_shell_owns_its_terminal_and_exits_with_its_status(
    running: tuple[Agent, Collected], node: str, redis_url: str, job: str
) -> None:
    """The shell leads a session of its own inside the sandbox's pid namespace, so its
    terminal's foreground group is one it can see (``sh -i`` exited 2 on ``exit 7``:
    "Cannot set tty process group", the group being the agent-side nsenter's)."""
    agent, _sent = running
    client = redis.Redis.from_url(redis_url)
    shell_id, _ = open_shell(agent, job, "sh", "-i")
    into, _out = shell_keys(node, shell_id)
    client.xadd(into, {"d": b"exit 7\r"})
    data, code, _ = read_until_exit(client, node, shell_id)
    assert code == 7, data
