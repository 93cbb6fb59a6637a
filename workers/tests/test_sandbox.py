"""Tenant programs through the agent's real launch path: real bwrap, real processes, real Redis.

Each hostile case is a tiny Python "bundle" run as a job's program; what it
could and could not do comes back in its log (one JSON line) and in the
agent's reports.  The test directories live under /var/tmp, not /tmp: a
sandbox's /tmp is private, so a data directory under /tmp would be unseen for
the wrong reason.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import shutil
import socket
import struct
import textwrap
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from utilities.embedded_redis import free_port
from workers.agent import seccomp
from workers.agent.agent import Agent
from workers.agent.config import REPO_ROOT, AgentConfig, SandboxSettings
from workers.agent.environments import EnvironmentCache, EnvironmentSettings
from workers.agent.limits import descendants
from workers.agent.network import NETNS_DIR, JobNetworks, net_names
from workers.agent.quota import MIB, Quota
from workers.agent.redis_acl import delete_job_user, job_url
from workers.agent.sandbox import BUILDER_ENV, NOBODY, job_identity
from workers.agent.store import AgentStore
from workers.elastic.control import JobControl
from workers.protocol import (
    ArtifactStored,
    Failed,
    Heartbeat,
    Progress,
    Rejected,
    Report,
    Started,
    Stopped,
    WorkerExited,
)
from workers.tests.test_environments import make_wheel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CODE = "ab" * 32
OTHER_CODE = "cd" * 32
FAKE_SECRET = "s3cr3t-agent-key-never-shown"
FAKE_DATABASE = "postgres://portal:hunter2@db.internal/portal"


class Collected:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, report: Report) -> None:
        self.reports.append(report)

    def of(self, kind: type[Any]) -> list[Any]:
        return [r for r in self.reports if isinstance(r, kind)]


@dataclass
class Host:
    """A node's directories for one test, outside /tmp."""

    base: Path

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def code_root(self) -> Path:
        return self.base / "code"

    @property
    def database(self) -> Path:
        return self.base / "db" / "portal.sqlite3"

    def bundle(self, code: str, script: str, name: str = "main.py") -> Path:
        path = self.code_root / code
        path.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(textwrap.dedent(script))
        return path


@pytest.fixture
def host() -> Iterator[Host]:
    base = Path("/var/tmp") / f"portal-sandbox-{uuid.uuid4().hex[:8]}"
    made = Host(base)
    made.data_dir.mkdir(parents=True)
    made.database.parent.mkdir(parents=True)
    made.database.write_text("portal database: tenants, tokens")
    (made.data_dir / "agent-private.txt").write_text("agent private")
    made.bundle(OTHER_CODE, "OTHER_TENANT_SOURCE = 1\n", "other.py")
    yield made
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def redis_url() -> str:
    return str(settings.REDIS_URL)


@pytest.fixture
def job(redis_url: str) -> Iterator[str]:
    name = f"job-{uuid.uuid4().hex[:8]}"
    yield name
    JobControl(redis_url, name).cleanup()


@pytest.fixture
def node(redis_url: str) -> Iterator[str]:
    name = f"sbx-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"agent:{name}:*"):
        client.delete(key)
    for each in (name, f"{name}-b"):  # what a test left running, e.g. on a failure
        networks = JobNetworks(each, client)
        for left in networks.jobs_here():
            networks.release(left)


@pytest.fixture(autouse=True)
def agent_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's own environment holds secrets that no program may see."""
    monkeypatch.setenv("SECRET_KEY", FAKE_SECRET)
    monkeypatch.setenv("DATABASE_URL", FAKE_DATABASE)


def make_agent(
    host: Host, node: str, redis_url: str, slots: int = 2, artifact_url: str = "", **sandbox: Any
) -> tuple[Agent, Collected]:
    config = AgentConfig(
        node=node,
        device="cpu",
        slots=slots,
        redis_url=redis_url,
        data_dir=host.data_dir,
        sandbox=SandboxSettings(**{"database_file": host.database, **sandbox}),
        artifact_url=artifact_url,
    )
    sent = Collected()
    agent = Agent(
        config,
        AgentStore.from_url(redis_url, node),
        send=sent,
        resolve_code=lambda program: host.code_root / program.code,
    )
    return agent, sent


def start_payload(
    job: str,
    command_id: str,
    launcher: str = "torchrun",
    workers: int = 1,
    generation: int = 0,
    master_port: int = 29500,
    **program: Any,
) -> dict[str, Any]:
    return {
        "type": "start_workers",
        "job": job,
        "command_id": command_id,
        "batch_size": 8,
        "recovery": "consistent",
        "checkpoint_every": 0,
        "initial_world": workers,
        "workers": [{"worker_id": f"w{i}", "slot": i, "rank": i} for i in range(workers)],
        "program": {
            "code": CODE,
            "code_path": f"code/{CODE}.tar.gz",
            "entrypoint": ["main.py"],
            "launcher": launcher,
            "generation": generation,
            "world_size": workers,
            "master_port": master_port,
            **program,
        },
    }


def run_to_exit(agent: Agent, sent: Collected, count: int = 1, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(sent.of(WorkerExited)) < count:
        assert time.monotonic() < deadline, sent.reports
        agent.tick()
        time.sleep(0.05)
    agent.tick()
    agent.processes.release()  # the exited workers' cgroups, once their last members die


def output(agent: Agent, job: str, worker: str = "w0") -> dict[str, Any]:
    """The JSON line the program printed last."""
    text = agent.config.log_path(job, worker).read_text()
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, text
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_program(
    host: Host, node: str, redis_url: str, job: str, script: str, **payload: Any
) -> tuple[Agent, Collected, WorkerExited]:
    host.bundle(CODE, script)
    agent, sent = make_agent(host, node, redis_url, **payload.pop("sandbox", {}))
    assert agent.receive(start_payload(job, "c1", **payload)) == "applied", sent.reports
    run_to_exit(agent, sent)
    exited: WorkerExited = sent.of(WorkerExited)[0]
    return agent, sent, exited


# --------------------------------------------------------------------------- secrets


ENV_SCRIPT = """
import json, os
try:
    pid1 = open("/proc/1/environ", "rb").read().decode(errors="replace")
except OSError as exc:  # unsandboxed: pid 1 is the host's init
    pid1 = repr(exc)
print(json.dumps({
    "env": dict(os.environ),
    "pid1": pid1,
    "uid": os.getuid(),
    "cwd": os.getcwd(),
}))
"""


def test_a_program_sees_only_its_own_environment(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    agent, _sent, exited = run_program(host, node, redis_url, job, ENV_SCRIPT, env={"LR": "0.1"})
    assert exited.outcome == "clean" and exited.generation == 0, exited
    seen = output(agent, job)
    everything = json.dumps(seen)
    for secret in (FAKE_SECRET, FAKE_DATABASE, "SECRET_KEY", "DATABASE_URL", "REDIS_URL"):
        assert secret not in everything
    admin_password = urlsplit(redis_url).password
    if admin_password:
        assert admin_password not in everything
    env = seen["env"]
    dirs = host.data_dir / "jobs" / job
    assert env["LR"] == "0.1"
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and env["LOCAL_RANK"] == "0"
    assert env["TORCHELASTIC_RUN_ID"] == job and env["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert env["CHECKPOINT_DIR"] == str(dirs / "checkpoints")
    assert env["HOME"] == env["SCRATCH_DIR"] == str(dirs / "scratch" / "w0")
    assert seen["uid"] == program_uid(job) and seen["cwd"] == str(host.code_root / CODE)
    # The program has exactly the environment the agent built, plus the PWD that
    # bwrap's --chdir sets; bwrap's own init (pid 1 of the namespace) had none of it.
    assert env.pop("PWD") == seen["cwd"]
    assert set(env) == set(torchrun_env_names()) | {"LR"}
    assert "LR=" not in seen["pid1"]


def program_uid(job: str) -> int:
    """The uid a job's program has: its own under a root agent, else nobody in a namespace."""
    if os.geteuid() != 0:
        return NOBODY
    settings = SandboxSettings()
    return job_identity(job, settings.uid_base, settings.uid_count).uid


def torchrun_env_names() -> tuple[str, ...]:
    return (
        "PATH", "HOME", "TMPDIR", "LANG", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CHECKPOINT_DIR", "ARTIFACT_DIR",
        "SCRATCH_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "METRICS_FILE",
    ) + (("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if os.geteuid() == 0 else ())  # fmt: skip


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


WAIT_SCRIPT = """
import os, time
from pathlib import Path
Path(os.environ["SCRATCH_DIR"], "started").write_text("yes")
time.sleep(30)
"""


def test_the_process_that_builds_the_sandbox_gets_nothing_of_the_jobs_environment(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """The attack: a job's ``LD_AUDIT`` (or any loader or libc variable) reached bwrap, which
    runs as root before any namespace exists.  Now bwrap has a fixed environment and the
    job's variables reach the program alone, through a descriptor, never a command line."""
    host.bundle(CODE, WAIT_SCRIPT)
    agent, sent = make_agent(host, node, redis_url)
    marker = "value-that-only-the-program-may-see"
    try:
        assert agent.receive(start_payload(job, "c1", env={"MY_MARKER": marker})) == "applied"
        started = host.data_dir / "jobs" / job / "scratch" / "w0" / "started"
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline, sent.reports
            time.sleep(0.05)
        [record] = agent.processes.records()
        assert environ_of(record.pid) == BUILDER_ENV  # bwrap: nothing of the job's
        assert marker not in Path(f"/proc/{record.pid}/cmdline").read_text()
        programs = [
            pid for pid in descendants(record.pid) if environ_of(pid).get("MY_MARKER") == marker
        ]
        assert programs, "the program itself has its variable"
    finally:
        agent.close(stop_children=True)


ESCAPE_SCRIPT = """
import json, os, socket, sys
checks = json.loads(sys.argv[1])
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
out["cap_eff"] = status["CapEff"].strip()
out["cap_bnd"] = status["CapBnd"].strip()
out["no_new_privs"] = status["NoNewPrivs"].strip()
try:
    out["secret"] = open(checks["secret"]).read()
except OSError as exc:
    out["secret"] = "denied: " + type(exc).__name__
client = socket.socket(socket.AF_UNIX)
try:
    client.connect(checks["socket"])
    out["socket"] = "connected"
except OSError as exc:
    out["socket"] = "denied: " + type(exc).__name__
out["listed"] = {d: sorted(os.listdir(d)) if os.path.isdir(d) else None for d in checks["dirs"]}
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a job's own uid needs a root agent")
def test_a_program_is_an_unprivileged_host_user_not_root_in_a_namespace(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """The attack: ``--unshare-user --uid 65534`` under a root agent mapped the program to
    host root, so root-only files that ``--ro-bind / /`` shows were readable, and root-only
    host Unix sockets (a container runtime's, D-Bus) answered it."""
    secret = host.base / "root-only.txt"
    secret.write_text("root only")
    secret.chmod(0o600)
    server = socket.socket(socket.AF_UNIX)
    sock_path = host.base / "root-only.sock"
    server.bind(str(sock_path))
    sock_path.chmod(0o600)
    server.listen(1)
    checks = {"secret": str(secret), "socket": str(sock_path), "dirs": ["/run", "/var/lib"]}
    try:
        agent, _sent, exited = run_program(
            host, node, redis_url, job, ESCAPE_SCRIPT, entrypoint=["main.py", json.dumps(checks)]
        )
    finally:
        server.close()
    assert exited.outcome == "clean", exited
    seen = output(agent, job)
    assert seen["uid"] == seen["gid"] == program_uid(job) and seen["uid"] >= 200_000, seen
    assert seen["groups"] in ([], [seen["gid"]]), seen
    assert seen["cap_eff"] == seen["cap_bnd"] == "0000000000000000", seen
    assert seen["no_new_privs"] == "1", seen
    assert seen["secret"].startswith("denied"), seen
    assert seen["socket"].startswith("denied"), seen
    assert seen["listed"]["/run"] in ([], None) and seen["listed"]["/var/lib"] in ([], None)
    # Its own directories are its own, on the host too.
    scratch = host.data_dir / "jobs" / job / "scratch" / "w0"
    assert scratch.stat().st_uid == program_uid(job)


SYSCALL_SCRIPT = """
import ctypes, json, os, sys, threading
numbers = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
def call(name, *args):
    ctypes.set_errno(0)
    result = libc.syscall(numbers[name], *[ctypes.c_long(a) for a in args])
    return "ok" if result >= 0 else os.strerror(ctypes.get_errno())
out["unshare_user"] = call("unshare", 0x10000000)
out["unshare_net"] = call("unshare", 0x40000000)
out["ptrace_traceme"] = call("ptrace", 0, 0, 0, 0)
out["add_key"] = call("add_key", 0, 0, 0, 0, 0)
out["keyctl"] = call("keyctl", 0, 0, 0, 0, 0)
out["userfaultfd"] = call("userfaultfd", 0)
box = []
thread = threading.Thread(target=lambda: box.append("thread ran"))
thread.start(); thread.join()
out["thread"] = box[0] if box else "no thread"
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
"""


@pytest.mark.skipif(seccomp.filter_for() is None, reason="no system-call filter on this machine")
def test_a_program_cannot_make_namespaces_trace_or_use_keyrings_but_threads_and_fork_work(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """The attack: an unprivileged program could still create a user namespace (where most
    local kernel exploits start), ptrace, and reach the kernel keyrings."""
    arch = seccomp.ARCHES[platform.machine().lower()]
    agent, _sent, exited = run_program(
        host, node, redis_url, job, SYSCALL_SCRIPT,
        entrypoint=["main.py", json.dumps(arch.numbers)],
    )  # fmt: skip
    assert exited.outcome == "clean", exited
    seen = output(agent, job)
    refused = os.strerror(errno.EPERM)
    for call in ("unshare_user", "unshare_net", "ptrace_traceme", "add_key", "keyctl"):
        assert seen[call] == refused, (call, seen)
    assert seen["userfaultfd"] != "ok", seen
    assert seen["thread"] == "thread ran" and seen["fork"] == 7, seen


TMP_SCRIPT = """
import json, os
out = {}
for path in ("/tmp/big", "/dev/shm/big"):
    try:
        with open(path, "wb") as f:
            f.write(b"x" * (3 * 1024 * 1024))
        out[path] = "wrote"
    except OSError as exc:
        out[path] = "refused: " + os.strerror(exc.errno)
print(json.dumps(out))
"""


def test_a_programs_tmp_is_sized_so_it_cannot_fill_the_nodes_memory(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """The attack: /tmp was an unsized tmpfs, so a program could fill half the host's memory."""
    agent, _sent, exited = run_program(
        host, node, redis_url, job, TMP_SCRIPT, sandbox={"tmp_mb": 2, "memory_mb": 2048}
    )
    assert exited.outcome == "clean", exited
    seen = output(agent, job)
    assert seen["/tmp/big"] == "refused: " + os.strerror(errno.ENOSPC), seen
    assert seen["/dev/shm/big"] == "wrote", seen  # /dev/shm grows to the memory limit


SHM_SCRIPT = """
import json, os, sys, time
rank, role = int(os.environ["RANK"]), sys.argv[1]
out = {"rank": rank}
if role == "share":
    if rank == 0:
        with open("/dev/shm/from-w0", "w") as f:
            f.write("hello from w0")
    deadline = time.time() + 20
    while not os.path.exists("/dev/shm/from-w0") and time.time() < deadline:
        time.sleep(0.05)
    out["seen"] = open("/dev/shm/from-w0").read()
    time.sleep(3)  # held open while another job looks
else:
    out["listing"] = os.listdir("/dev/shm")
print(json.dumps(out))
"""


def test_a_jobs_processes_on_a_node_share_dev_shm_and_other_jobs_do_not_see_it(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """NCCL's shared-memory transport needs one /dev/shm for a job's local ranks; a private
    one per worker broke it, and a host-wide one would show a job's data to others."""
    host.bundle(CODE, SHM_SCRIPT)
    agent, sent = make_agent(host, node, redis_url, slots=3)
    other = f"{job}-other"
    shared = agent.config.job_shm_dir(job)
    try:
        payload = start_payload(job, "c1", workers=2, entrypoint=["main.py", "share"])
        assert agent.receive(payload) == "applied", sent.reports
        deadline = time.monotonic() + 30
        while not (shared / "from-w0").exists():
            assert time.monotonic() < deadline, sent.reports
            agent.tick()
            time.sleep(0.05)
        look = start_payload(other, "c2", workers=1, entrypoint=["main.py", "look"])
        look["workers"] = [{"worker_id": "w0", "slot": 2, "rank": 0}]
        assert agent.receive(look) == "applied", sent.reports
        run_to_exit(agent, sent, count=3)
        assert {e.outcome for e in sent.of(WorkerExited)} == {"clean"}, sent.reports
        assert (
            output(agent, job, "w0")["seen"]
            == output(agent, job, "w1")["seen"]
            == ("hello from w0")
        )
        assert output(agent, other)["listing"] == []
        assert not shared.exists()  # released when the job's last process here ended
    finally:
        agent.close(stop_children=True)
        shutil.rmtree(shared, ignore_errors=True)


# --------------------------------------------------------------------------- files

FILES_SCRIPT = """
import json, os, sys
checks = json.loads(sys.argv[1])
result = {"read": {}, "write": {}}
for path in checks["read"]:
    try:
        if os.path.isdir(path):
            result["read"][path] = os.listdir(path)
        else:
            result["read"][path] = open(path).read()[:40]
    except OSError as exc:
        result["read"][path] = "denied: " + type(exc).__name__
for path in checks["write"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        result["write"][path] = "wrote"
    except OSError as exc:
        result["write"][path] = "denied: " + type(exc).__name__
print(json.dumps(result))
"""


def test_a_program_reads_and_writes_only_its_own_directories(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    dirs = host.data_dir / "jobs" / job
    secret_reads = [
        str(host.database),
        str(host.data_dir / "agent-private.txt"),
        str(host.code_root / OTHER_CODE / "other.py"),
        str(REPO_ROOT / "pyproject.toml"),
        "/etc/shadow",
    ]
    hidden_dirs = [str(host.data_dir), str(host.code_root), str(REPO_ROOT), "/root"]
    forbidden = [
        str(REPO_ROOT / "planted.txt"),
        "/usr/planted.txt",
        str(host.data_dir / "planted.txt"),
        str(host.code_root / CODE / "planted.txt"),
        str(host.database.parent / "planted.txt"),
    ]
    allowed = [
        str(dirs / "checkpoints" / "ok"),
        str(dirs / "artifacts" / "ok"),
        str(dirs / "scratch" / "w0" / "ok"),
        "/tmp/ok",
    ]
    checks = {"read": secret_reads + hidden_dirs, "write": forbidden + allowed}
    agent, _sent, exited = run_program(
        host, node, redis_url, job, FILES_SCRIPT, entrypoint=["main.py", json.dumps(checks)]
    )
    assert exited.outcome == "clean", exited
    seen = output(agent, job)
    for path in secret_reads:
        assert str(seen["read"][path]).startswith("denied") or seen["read"][path] == "", path
    assert seen["read"][str(host.data_dir)] == ["jobs"]  # its own job's directories only
    assert seen["read"][str(host.code_root)] == [CODE]  # no other bundle
    assert set(seen["read"][str(REPO_ROOT)]) <= {".venv", "edl", "workers"}
    assert seen["read"]["/root"] in ([], [".pyenv"])  # at most the Python installation
    for path in forbidden:
        assert seen["write"][path].startswith("denied"), path
    for path in allowed:
        assert seen["write"][path] == "wrote", path
    assert not (REPO_ROOT / "planted.txt").exists() and not (host.data_dir / "planted.txt").exists()
    assert (dirs / "artifacts" / "ok").read_text() == "x"


STORE_SCRIPT = """
import json, os, socket, sys
from pathlib import Path
from workers.elastic.cli import options_from_env
from workers.store_door import DoorStore
other, prefix = sys.argv[1], sys.argv[2]
url = options_from_env().store_url
out = {"store_url": url, "checkpoint_dir": os.environ["CHECKPOINT_DIR"]}
out["aws"] = sorted(name for name in os.environ if name.startswith("AWS_"))
store = DoorStore(url)
out["put"] = store.put_bytes("checkpoints/mine.pt", b"ckpt").size
out["listed"] = store.list()
def raw(request):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(url.removeprefix("door+unix://"))
        sock.sendall(request)
        return sock.recv(65536).split(b" ")[1].decode()
out["traversal"] = raw(b"GET /objects/../../../other/jobs/1/artifacts/secret.txt HTTP/1.0\\r\\n\\r\\n")
out["encoded"] = raw(b"GET /objects/%2e%2e/%2e%2e/%2e%2e/other/jobs/1/artifacts/secret.txt HTTP/1.0\\r\\n\\r\\n")
for name, path in (("other", other), ("prefix", prefix + "/planted.txt")):
    try:
        out[name] = Path(path).read_text() if name == "other" else Path(path).write_text("x")
    except OSError as exc:
        out[name] = "denied: " + type(exc).__name__
Path(os.environ["ARTIFACT_DIR"], "sub").mkdir(exist_ok=True)
Path(os.environ["ARTIFACT_DIR"], "sub", "model.bin").write_text("model")
os.symlink("/etc/hostname", Path(os.environ["ARTIFACT_DIR"], "link"))
print(json.dumps(out), flush=True)
"""


def test_the_store_is_never_the_programs_it_reaches_its_own_prefix_through_the_door(
    host: Host, node: str, redis_url: str, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-agents-own")
    store = host.base / "store"
    other = store / "tenants" / "other" / "jobs" / "1" / "artifacts" / "secret.txt"
    other.parent.mkdir(parents=True)
    other.write_text("another tenant's model")
    prefix = store / "tenants" / "acme" / "jobs" / "7"
    host.bundle(CODE, STORE_SCRIPT)
    agent, sent = make_agent(host, node, redis_url, artifact_url=f"file://{store}")
    payload = start_payload(
        job, "c1", launcher="edl", entrypoint=["main.py", str(other), str(prefix)]
    )
    payload["store_prefix"] = "tenants/acme/jobs/7"
    assert agent.receive(payload) == "applied", sent.reports
    run_to_exit(agent, sent)
    agent.close(stop_children=False)  # waits for the collection
    seen = output(agent, job)
    assert seen["store_url"].startswith("door+unix://") and seen["aws"] == []
    assert seen["checkpoint_dir"] == str(host.data_dir / "jobs" / job / "checkpoints")
    assert seen["put"] == 4 and seen["listed"] == ["checkpoints/mine.pt"]
    assert (prefix / "checkpoints" / "mine.pt").read_bytes() == b"ckpt"  # through the door
    assert seen["traversal"] == "400" and seen["encoded"] == "400"
    assert seen["other"].startswith("denied") and seen["prefix"].startswith("denied"), seen
    assert not (prefix / "planted.txt").exists()
    assert (prefix / "artifacts" / "sub" / "model.bin").read_text() == "model"
    assert not (prefix / "artifacts" / "link").exists()  # a link is never followed
    stored = sent.of(ArtifactStored)
    assert [(r.kind, r.path, r.size) for r in stored] == [("user", "artifacts/sub/model.bin", 5)]
    assert not agent.processes.doors.serves(job)  # closed once the job settled here


MIRROR_SCRIPT = """
import json, os, sys
from pathlib import Path
folder = Path(os.environ["CHECKPOINT_DIR"])
mine = folder / "ckpt.txt"
out = {"found": mine.read_text() if mine.exists() else None, "owner": folder.stat().st_uid}
mine.write_text("run " + os.environ["TORCHELASTIC_RESTART_COUNT"])
if not (folder / "leak").is_symlink():
    os.symlink(sys.argv[1], folder / "leak")
print(json.dumps(out), flush=True)
"""


def test_a_torchrun_programs_checkpoints_are_mirrored_and_resume_on_another_node(
    host: Host, redis_url: str, job: str
) -> None:
    store = host.base / "store"
    secret = host.base / "host-secret.txt"
    secret.write_text("the host's")
    prefix = store / "tenants" / "acme" / "jobs" / "9"
    host.bundle(CODE, MIRROR_SCRIPT)
    for run, node in enumerate((f"mirror-a-{job}", f"mirror-b-{job}")):
        agent, sent = make_agent(host, node, redis_url, artifact_url=f"file://{store}")
        payload = start_payload(job, f"c{run}", generation=run, entrypoint=["main.py", str(secret)])
        payload["store_prefix"] = "tenants/acme/jobs/9"
        assert agent.receive(payload) == "applied", sent.reports
        run_to_exit(agent, sent)
        agent.close(stop_children=False)  # waits for the final push
        seen = output(agent, job)
        assert seen["found"] == (None if run == 0 else "run 0"), seen  # pulled on the new node
        assert (prefix / "checkpoints" / "ckpt.txt").read_text() == f"run {run}"
        assert not (prefix / "checkpoints" / "leak").exists()  # a link is never mirrored
        shutil.rmtree(host.data_dir / "jobs" / job)  # the next run is on another node
    assert secret.read_text() == "the host's"


def test_a_crashed_programs_artifacts_are_collected_too(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(
        CODE,
        "import os, pathlib, sys\n"
        "pathlib.Path(os.environ['ARTIFACT_DIR'], 'crash.txt').write_text('why it failed')\n"
        "sys.exit(3)\n",
    )
    store = host.base / "store"
    agent, sent = make_agent(host, node, redis_url, artifact_url=f"file://{store}")
    payload = start_payload(job, "c1")
    payload["store_prefix"] = "tenants/acme/jobs/8"
    assert agent.receive(payload) == "applied", sent.reports
    run_to_exit(agent, sent)
    agent.close(stop_children=False)
    assert sent.of(WorkerExited)[0].outcome == "crashed"
    log_text = agent.config.log_path(job, "w0").read_text()
    assert [r.path for r in sent.of(ArtifactStored)] == ["artifacts/crash.txt"], log_text
    assert (store / "tenants/acme/jobs/8/artifacts/crash.txt").read_text() == "why it failed"


# --------------------------------------------------------------------------- limits

FORK_BOMB = """
import os
while True:
    os.fork()
"""

MEMORY_HOG = """
blocks = [bytearray(1 << 30) for _ in range(16)]  # 16 GB
print("allocated")
"""


def test_a_fork_bomb_is_stopped_by_the_process_limit(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    _agent, _sent, exited = run_program(
        host, node, redis_url, job, FORK_BOMB, sandbox={"max_procs": 32}
    )
    assert exited.outcome == "crashed", exited
    assert exited.reason == "process limit reached (SANDBOX_MAX_PROCS=32)", exited


def test_a_memory_hog_is_stopped_by_the_memory_limit(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    agent, _sent, exited = run_program(
        host, node, redis_url, job, MEMORY_HOG, sandbox={"memory_mb": 1024}
    )
    assert exited.outcome == "crashed", exited
    assert exited.reason == "memory limit reached (SANDBOX_MEMORY_MB=1024)", exited
    assert "allocated" not in agent.config.log_path(job, "w0").read_text()


FILL_SCRATCH = """
import os, time
for n in range(8):  # each file under the quota, together over it
    with open(os.path.join(os.environ["SCRATCH_DIR"], f"part{n}"), "wb") as f:
        f.write(os.urandom(1 << 20))
time.sleep(120)
"""
FLOOD_OUTPUT = """
import sys, time
sys.stdout.write(("y" * 1023 + "\\n") * 8192)  # 8 MiB of output into the node's log
sys.stdout.flush()
time.sleep(120)
"""
MANY_FILES = """
import os, time
for n in range(3000):
    open(os.path.join(os.environ["SCRATCH_DIR"], f"f{n}"), "w").close()
time.sleep(120)
"""
FILL_SHM = """
import os, time
with open("/dev/shm/blob", "wb") as f:
    f.write(os.urandom(4 << 20))
time.sleep(120)
"""
ONE_BIG_FILE = """
import os
with open(os.path.join(os.environ["SCRATCH_DIR"], "big"), "wb") as f:
    f.write(os.urandom(8 << 20))
print("written")
"""
SMALL_QUOTA = Quota(disk_bytes=4 * MIB, entries=1000, shm_bytes=2 * MIB, every_s=0.2)


@pytest.mark.parametrize(
    ("script", "says"),
    [
        (FILL_SCRATCH, "in its node-local files"),
        (FLOOD_OUTPUT, "in its node-local files"),
        (MANY_FILES, "files and directories"),
        (FILL_SHM, "in its shared memory"),
    ],
    ids=["scratch", "output", "inodes", "shm"],
)
def test_a_job_over_its_quota_on_the_node_is_stopped_and_told_why(
    host: Host, node: str, redis_url: str, job: str, script: str, says: str
) -> None:
    """The attack: a job's node-local files (and its logs, its /dev/shm) had no bound, so
    one program could fill a node's disk, inodes or memory under its co-tenants."""
    _agent, sent, exited = run_program(
        host, node, redis_url, job, script, sandbox={"quota": SMALL_QUOTA}
    )
    assert exited.outcome == "stopped", exited
    [failed] = sent.of(Failed)
    assert failed.job == job and f"job {job} on node {node}" in failed.error
    assert says in failed.error and failed.error.endswith("stopped"), failed.error


def test_one_file_may_not_outgrow_the_quota_between_two_measurements(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    agent, sent, exited = run_program(
        host,
        node,
        redis_url,
        job,
        ONE_BIG_FILE,
        sandbox={"quota": replace(SMALL_QUOTA, every_s=600)},
    )
    assert exited.outcome == "crashed", exited
    assert exited.reason == (
        "file size limit reached: one file may not exceed the job's scratch quota "
        "(SANDBOX_SCRATCH_MB=4)"
    )
    assert "written" not in agent.config.log_path(job, "w0").read_text()
    assert not [f for f in sent.of(Failed) if "SANDBOX_SCRATCH" in f.error]  # no stop: a crash


TOUCHING_HOG = """
data = b"x" * (4 << 30)  # 4 GB, every page written
print("allocated")
"""


@pytest.mark.skipif(
    not os.access("/sys/fs/cgroup/memory", os.W_OK), reason="no writable memory cgroup here"
)
def test_without_an_address_space_limit_the_memory_cgroup_stops_a_hog(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """A GPU node sets no RLIMIT_AS (CUDA reserves address space): the OOM killer acts."""
    host.bundle(CODE, TOUCHING_HOG)
    agent, sent = make_agent(host, node, redis_url, memory_mb=256)
    agent.config = replace(agent.config, device="cuda")
    agent.processes.config = agent.config
    assert agent.receive(start_payload(job, "c1")) == "applied", sent.reports
    run_to_exit(agent, sent)
    [exited] = sent.of(WorkerExited)
    assert exited.outcome == "crashed" and exited.exit_code == -9, exited  # SIGKILL
    assert exited.reason == "memory limit reached (SANDBOX_MEMORY_MB=256)", exited


# --------------------------------------------------------------------------- redis

REDIS_SCRIPT = """
import json, redis
from workers.elastic.cli import options_from_env
options = options_from_env()
r = redis.Redis.from_url(options.redis_url)
own = "edl:" + options.job_id + ":probe"
other = "edl:" + options.job_id + "-other:secret"
result = {}
def attempt(name, call):
    try:
        result[name] = repr(call())
    except redis.exceptions.ResponseError as exc:
        result[name] = "denied: " + str(exc)[:50]
attempt("own_write", lambda: r.set(own, "1"))
attempt("own_read", lambda: r.get(own))
attempt("other_read", lambda: r.get(other))
attempt("other_write", lambda: r.set(other, "x"))
attempt("script_other", lambda: r.eval("return redis.call('get', KEYS[1])", 1, other))
attempt("flushall", r.flushall)
attempt("keys", lambda: r.keys("*"))
attempt("config", lambda: r.config_get("requirepass"))
attempt("randomkey", r.randomkey)
attempt("acl", lambda: r.acl_list())
result["options"] = {"store_url": options.store_url, "workload": options.workload}
print(json.dumps(result))
"""


def test_a_program_reaches_only_its_own_jobs_redis_keys(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    other = f"edl:{job}-other:secret"
    admin.set(other, "other tenant")
    try:
        agent, _sent, exited = run_program(host, node, redis_url, job, REDIS_SCRIPT, launcher="edl")
        assert exited.outcome == "clean", (exited, agent.config.log_path(job, "w0").read_text())
        seen = output(agent, job)
        assert seen["own_write"] == "True" and seen["own_read"] == "b'1'"
        for name in ("other_read", "other_write", "script_other", "flushall", "keys", "config"):
            assert seen[name].startswith("denied"), (name, seen[name])
        assert seen["randomkey"].startswith("denied") and seen["acl"].startswith("denied")
        assert admin.get(other) == "other tenant"
        assert seen["options"]["workload"] == ""
        # No store prefix: the runtime keeps its checkpoints in <job dir>/checkpoints on the node.
        assert seen["options"]["store_url"] == str(host.data_dir / "jobs" / job)
        assert f"edl-{job}" in admin.acl_users()
        # Once the job is stopped here (nothing left to run), its user goes.
        stop = {"type": "stop_job", "job": job, "command_id": "stop", "grace_seconds": 1.0}
        assert agent.receive(stop) == "applied"
        agent.tick()
        assert f"edl-{job}" not in admin.acl_users()
    finally:
        admin.delete(other)
        delete_job_user(admin, job)


SCAN_SCRIPT = """
import json, socket
answered = []
for port in range(1, 65536):
    s = socket.socket()
    s.settimeout(0.05)
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    try:
        s.sendall(b"PING\\r\\n")
        if s.recv(16).startswith(b"+PONG"):
            answered.append(port)
    except OSError:
        pass
    finally:
        s.close()
print(json.dumps({"answered": answered}))
"""


HOSTILE_EDL = """
import json, redis, time
from workers.elastic.cli import options_from_env
from workers.elastic.keys import JobKeys
options = options_from_env()
r = redis.Redis.from_url(options.redis_url, socket_timeout=5)
events = JobKeys(options.job_id).events
out = {}
pipe = r.pipeline(transaction=False)
for step in range(5000):
    pipe.xadd(events, {"kind": "progress", "data": json.dumps({"step": step})})
    pipe.xadd(events, {b"kind": b"failed", b"data": b'{"worker": "w0", "error": "\\ud800\\xff"}'})
    pipe.xadd(events, {"kind": "recovered", "data": json.dumps({"survivors": [], "left": ["w0"]})})
pipe.execute()
out["flooded"] = r.xlen(events)
try:
    r.eval("while true do end", 0)
    out["eval"] = "ran"
except redis.exceptions.ResponseError as exc:
    out["eval"] = "denied: " + str(exc)[:40]
big = JobKeys(options.job_id).events + ":big"
for name, call in (("setrange", lambda: r.setrange(big, 20_000_000, b"x")),
                   ("big_set", lambda: r.set(big, b"x" * 20_000_000))):
    try:
        out[name] = repr(call())
    except redis.exceptions.RedisError as exc:
        out[name] = "denied: " + str(exc)[:40]
held = []
for _ in range(200):
    try:
        c = redis.Redis.from_url(options.redis_url, socket_timeout=2)
        c.ping()
        held.append(c)
    except redis.exceptions.RedisError:
        pass
out["connections"] = len(held)
print(json.dumps(out), flush=True)
time.sleep(3)
"""

NEIGHBOUR_EDL = """
import json, redis, time
from workers.elastic.cli import options_from_env
from workers.elastic.keys import JobKeys
options = options_from_env()
r = redis.Redis.from_url(options.redis_url, socket_timeout=5)
slowest, started = 0.0, time.monotonic()
step = 0
while time.monotonic() - started < 8:
    t = time.monotonic()
    r.set(JobKeys(options.job_id).events + ":mine", step)
    r.xadd(JobKeys(options.job_id).events, {"kind": "progress", "data": json.dumps(
        {"step": step, "samples_per_s": 10.0, "loss": 1.0, "world": 1, "generation": 0})})
    slowest = max(slowest, time.monotonic() - t)
    step += 1
    time.sleep(0.2)
print(json.dumps({"steps": step, "slowest": slowest}), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a job's network (its connection cap) needs root")
def test_a_hostile_edl_program_leaves_its_neighbour_tenant_and_the_node_alone(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """Two tenants' edl programs on one node: one floods, forges and corrupts its event stream,
    tries EVAL, a big key and 200 connections; the other trains on, the node beats on."""
    neighbour = f"{job}-n"
    host.bundle(CODE, HOSTILE_EDL)
    host.bundle(OTHER_CODE, NEIGHBOUR_EDL)
    agent, sent = make_agent(host, node, redis_url)
    hostile = start_payload(job, "c1", launcher="edl")
    calm = start_payload(neighbour, "c2", launcher="edl", code=OTHER_CODE)
    calm["workers"] = [{"worker_id": "w1", "slot": 1, "rank": 0}]
    try:
        assert agent.receive(hostile) == "applied", sent.reports
        assert agent.receive(calm) == "applied", sent.reports
        agent.events.watch(job)
        agent.events.watch(neighbour)
        beats = 0
        deadline = time.monotonic() + 60
        while len(sent.of(WorkerExited)) < 2:
            assert time.monotonic() < deadline, sent.reports[-5:]
            agent.tick()  # never raises
            agent.heartbeat()
            beats += 1
            time.sleep(0.1)
        assert beats > 20 and len(sent.of(Heartbeat)) >= beats
        exits = {e.job: e.outcome for e in sent.of(WorkerExited)}
        log_tail = agent.config.log_path(job, "w0").read_text()[-3000:]
        assert exits == {job: "clean", neighbour: "clean"}, log_tail
        seen = output(agent, job)
        assert seen["flooded"] == 15_000 and seen["eval"].startswith("denied"), seen
        assert seen["setrange"].startswith("denied"), seen
        assert seen["connections"] <= 64, seen  # the agent's socket caps a job's connections
        calm_seen = output(agent, neighbour, "w1")
        assert calm_seen["steps"] >= 20 and calm_seen["slowest"] < 2.0, calm_seen
        forwarded = [r.step for r in sent.of(Progress) if r.job == neighbour]
        assert len(forwarded) >= 10, forwarded  # its events still reach the portal
        dropped = [
            r for r in sent.reports if r.TYPE == "events_dropped" and getattr(r, "job", None) == job
        ]
        assert dropped  # the hostile job's bad events: dropped and counted
    finally:
        JobControl(redis_url, neighbour).cleanup()
        delete_job_user(redis.Redis.from_url(redis_url), neighbour)


def test_a_port_scan_finds_no_portal_redis_that_answers_without_a_password(
    host: Host, node: str, redis_url: str, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The portal's embedded Redis requires its password, so a scan from a sandbox cannot use it.

    The program shares the host's network (torch.distributed needs it) and
    scans every loopback port for a Redis that answers PING without
    credentials.  The embedded server (started here, with its password) must
    not be among them.  If this test run was given an unauthenticated
    ``REDIS_URL`` (a developer machine's own Redis), that port is a fact of the
    environment, not of the portal.  So are other Redis servers that a shared
    machine runs (another checkout's test server from code before the
    password): those are reported as a warning, not failed on.
    """
    from utilities.embedded_redis import ensure_running

    monkeypatch.setenv("REDIS_URL", os.environ.get("REDIS_URL", ""))
    embedded_url = ensure_running(host.base / "embedded")
    embedded_port = urlsplit(embedded_url).port
    given = urlsplit(redis_url)
    unauthenticated = {given.port or 6379} if not given.password else set()
    try:
        agent, _sent, exited = run_program(host, node, redis_url, job, SCAN_SCRIPT)
        assert exited.outcome == "clean", exited
        answered = set(output(agent, job)["answered"])
        assert embedded_port is not None and embedded_port not in answered
        foreign = answered - unauthenticated
        if foreign:
            warnings.warn(
                f"unauthenticated Redis on this machine, not the portal's: {sorted(foreign)}",
                stacklevel=1,
            )
    finally:
        pid = (host.base / "embedded" / "redis" / "pid").read_text()
        os.kill(int(pid), 15)


# --------------------------------------------------------------------------- network

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a job's network needs a root agent")

PROBE_SCRIPT = """
import json, os, socket, sys
targets = json.loads(os.environ["TARGETS"])
seen = {}
for name, (address, port) in targets.items():
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(family)
    s.settimeout(1.0)
    try:
        s.connect((address, port))
        seen[name] = "connected"
    except OSError as exc:
        seen[name] = f"refused: {exc}"
    finally:
        s.close()
print(json.dumps({"seen": seen, "env": {k: v for k, v in os.environ.items() if "IFNAME" in k}}))
"""


def host_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (``SIOCGIFADDR`` on each interface)."""
    out: list[str] = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for name in os.listdir("/sys/class/net"):
        if name == "lo" or name.startswith(("pjb", "pjv")):
            continue
        with contextlib.suppress(OSError):
            request = struct.pack("256s", name[:15].encode())
            out.append(socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x8915, request)[20:24]))
    probe.close()
    return out


@pytest.fixture
def listener() -> Iterator[int]:
    """A host service on every address (as the portal's web server would be)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def run_payload(agent: Agent, sent: Collected, payload: dict[str, Any]) -> WorkerExited:
    assert agent.receive(payload) == "applied", sent.reports
    run_to_exit(agent, sent)
    exited: WorkerExited = sent.of(WorkerExited)[-1]
    return exited


@root_only
def test_a_program_reaches_no_host_service_redis_or_metadata_address(
    host: Host, node: str, redis_url: str, job: str, listener: int
) -> None:
    redis_at = urlsplit(redis_url)
    targets = {
        "loopback service": ("127.0.0.1", listener),
        "redis": (redis_at.hostname or "127.0.0.1", redis_at.port or 6379),
        "metadata": ("169.254.169.254", 80),
        **{f"host {a}": (a, listener) for a in host_addresses()},
    }
    host.bundle(CODE, PROBE_SCRIPT)
    agent, sent = make_agent(host, node, redis_url)
    payload = start_payload(job, "c1", env={"TARGETS": json.dumps(targets)})
    try:
        exited = run_payload(agent, sent, payload)
        assert exited.outcome == "clean", agent.config.log_path(job, "w0").read_text()
        seen = output(agent, job)
        for name, result in seen["seen"].items():
            assert result.startswith("refused"), (name, result)
        assert seen["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
    finally:
        agent.tick()
    # The job ended here: its namespace is gone.
    assert not (NETNS_DIR / net_names(node, job).namespace).exists()


RANK_SCRIPT = """
import json, os, socket, sys, time
rank = int(os.environ["RANK"])
address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(4)
    print(json.dumps({"listening": [address, port]}), flush=True)
    server.settimeout(60)
    conn, peer = server.accept()
    greeting = conn.recv(64).decode()
    print(json.dumps({"greeting": greeting}), flush=True)
else:
    deadline = time.monotonic() + 40
    while True:
        s = socket.socket()
        s.settimeout(1.0)
        try:
            s.connect((address, port))
            s.sendall(b"hello from rank 1")
            print(json.dumps({"sent": True}), flush=True)
            break
        except OSError as exc:
            s.close()
            if time.monotonic() > deadline:
                print(json.dumps({"sent": repr(exc)}), flush=True)
                break
            time.sleep(0.2)
"""


def wait_line(path: Path, key: str, agents: list[Agent], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for agent in agents:
            agent.tick()
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("{") and key in json.loads(line):
                    return json.loads(line)[key]
        time.sleep(0.1)
    raise AssertionError(f"no {key!r} in {path}")


@root_only
def test_a_jobs_ranks_on_two_nodes_reach_each_other_and_another_job_does_not(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(CODE, RANK_SCRIPT)
    other_node = f"{node}-b"
    first, first_sent = make_agent(host, node, redis_url)
    second, second_sent = make_agent(host, other_node, redis_url)
    program: dict[str, Any] = {"world_size": 2, "master_node": node}
    rank0 = start_payload(job, "c1", **program)
    rank0["workers"] = [{"worker_id": "w0", "slot": 0, "rank": 0}]
    rank1 = start_payload(job, "c1", **program, group_rank=1)
    rank1["workers"] = [{"worker_id": "w1", "slot": 0, "rank": 1}]
    intruder_job = f"{job}-x"
    try:
        assert first.receive(rank0) == "applied", first_sent.reports
        address, port = wait_line(first.config.log_path(job, "w0"), "listening", [first])
        # Another tenant's program on the second node tries rank 0's address first.
        intruder = start_payload(
            intruder_job, "c2", env={"TARGETS": json.dumps({"rank 0": [address, port]})}
        )
        host.bundle(CODE, PROBE_SCRIPT, "probe.py")
        intruder["program"]["entrypoint"] = ["probe.py"]
        intruder["workers"] = [{"worker_id": "w0", "slot": 1, "rank": 0}]
        assert second.receive(intruder) == "applied", second_sent.reports
        run_to_exit(second, second_sent)
        seen = output(second, intruder_job)["seen"]
        assert seen["rank 0"].startswith("refused"), seen
        # The job's own rank 1, on the second node, reaches it.
        assert second.receive(rank1) == "applied", second_sent.reports
        assert wait_line(second.config.log_path(job, "w1"), "sent", [first, second]) is True
        greeting = wait_line(first.config.log_path(job, "w0"), "greeting", [first, second])
        assert greeting == "hello from rank 1"
        assert address != "127.0.0.1"
    finally:
        for agent in (first, second):
            agent.processes.end_all()
            agent.tick()


# --------------------------------------------------------------------------- refusal


def test_without_bwrap_tenant_code_is_refused(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(CODE, ENV_SCRIPT)
    agent, sent = make_agent(host, node, redis_url, bwrap="/nonexistent/bwrap")
    assert agent.receive(start_payload(job, "c1")) == "rejected"
    [rejected] = sent.of(Rejected)
    assert "bwrap cannot run here" in rejected.error
    assert "refusing to run tenant code unsandboxed; an admin may set SANDBOX=off" in rejected.error
    assert agent.running() == []


def test_sandbox_off_runs_unsandboxed_with_the_same_cleared_environment(
    host: Host, node: str, redis_url: str, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _sent, exited = run_program(
        host,
        node,
        redis_url,
        job,
        ENV_SCRIPT,
        sandbox={"mode": "off", "bwrap": "/nonexistent/bwrap"},
    )
    assert exited.outcome == "clean", exited
    seen = output(agent, job)
    assert FAKE_SECRET not in json.dumps(seen["env"]) and seen["uid"] == os.getuid()
    assert "SANDBOX=off" in caplog.text


# --------------------------------------------------------------------------- torchrun

DDP_SCRIPT = """
import json, os, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item(),
                  "local_rank": int(os.environ["LOCAL_RANK"])}))
dist.destroy_process_group()
"""


def test_an_unmodified_ddp_script_runs_under_the_torchrun_contract(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(CODE, DDP_SCRIPT)
    agent, sent = make_agent(host, node, redis_url)
    payload = start_payload(job, "c1", workers=2, master_port=free_port())
    assert agent.receive(payload) == "applied"
    run_to_exit(agent, sent, count=2, timeout=90)
    assert {e.outcome for e in sent.of(WorkerExited)} == {"clean"}, sent.of(WorkerExited)
    for rank in (0, 1):
        seen = output(agent, job, f"w{rank}")
        assert seen == {"rank": rank, "world": 2, "sum": 3.0, "local_rank": rank}


SLEEPER = """
import os, time
print("generation", os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
time.sleep(120)
"""


def test_a_torchrun_resize_stops_the_old_generation_then_starts_the_next(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    """StopJob: SIGTERM at once; the next generation's StartWorkers waits for it, then starts."""
    host.bundle(CODE, SLEEPER)
    agent, sent = make_agent(host, node, redis_url)
    agent.start()
    try:
        assert agent.receive(start_payload(job, "gen0")) == "applied"
        old_pid = agent.running()[0].pid
        results: list[str] = []
        stop = {"type": "stop_job", "job": job, "command_id": "stop0", "grace_seconds": 30.0}
        assert agent.receive(stop) == "applied"
        nxt = threading.Thread(
            target=lambda: results.append(agent.receive(start_payload(job, "gen1", generation=1)))
        )
        started = time.monotonic()
        nxt.start()
        nxt.join(timeout=30)
        assert results == ["applied"], sent.reports
        assert time.monotonic() - started < 10  # SIGTERM at once, not after the 30 s grace
        [old] = sent.of(WorkerExited)
        assert old.generation == 0 and old.outcome == "stopped" and old.exit_code == -15
        assert any(isinstance(r, Stopped) for r in sent.reports)
        [record] = agent.running()
        assert record.generation == 1 and record.pid != old_pid and record.rank == 0
        assert [s.command_id for s in sent.of(Started)] == ["gen0", "gen1"]

        # A restarted agent adopts the sandboxed process (its cmdline is bwrap's).
        again, _ = make_agent(host, node, redis_url)
        again.restore()
        assert [r.pid for r in again.running()] == [record.pid]
        assert replace(again.running()[0]) == record
    finally:
        agent.close(stop_children=True)


def test_the_elastic_runtime_runs_under_a_jobs_redis_user(redis_url: str, tmp_path: Path) -> None:
    """Two built-in workers, then a newcomer, with nothing but the job's own Redis user."""
    from devtools.elastic import JobRun

    run = JobRun(redis_url, f"acl{uuid.uuid4().hex[:8]}", tmp_path, args={"epochs": 1000})
    admin = redis.Redis.from_url(redis_url)
    run.redis_url = job_url(admin, redis_url, run.job_id)  # the workers' URL; control stays admin
    try:
        run.start_initial(2)
        run.wait_step(5)
        run.start("w2")
        assert run.wait_event("scale_done", 60)["world"] == 3
        run.stop_and_wait()
        assert set(run.wait_exit().values()) == {0}, run.tail()
    finally:
        run.terminate()
        run.control.cleanup()
        delete_job_user(admin, run.job_id)


@pytest.mark.parametrize(
    ("example", "launcher"), [("torchrun-ddp", "torchrun"), ("elastic-digits", "edl")]
)
def test_the_example_programs_run_sandboxed(
    host: Host, node: str, redis_url: str, job: str, example: str, launcher: str
) -> None:
    """The repository's two example programs, as bundles, two workers each, to a clean end."""
    shutil.copytree(REPO_ROOT / "examples" / example, host.code_root / CODE)
    agent, sent = make_agent(host, node, redis_url)
    payload = start_payload(
        job, "c1", launcher=launcher, workers=2, master_port=free_port(), entrypoint=["train.py"]
    )
    payload["program"]["entrypoint"] += ["--epochs", "1"]
    try:
        assert agent.receive(payload) == "applied", sent.reports
        run_to_exit(agent, sent, count=2, timeout=100)
        logs = {w: agent.config.log_path(job, w).read_text()[-1500:] for w in ("w0", "w1")}
        assert {e.outcome for e in sent.of(WorkerExited)} == {"clean"}, logs
    finally:
        agent.close(stop_children=True)
        delete_job_user(redis.Redis.from_url(redis_url), job)


# --------------------------------------------------------------------------- environments
# A program runs in its own environment (issue 36): built by the agent from local wheels (no
# network), seen in the sandbox; a request that does not build fails the job once, for good.

IMPORTS = """
import json, os, shutil
import alpha, beta
print(json.dumps({"alpha": alpha.__file__, "beta": beta.VERSION,
                  "script": shutil.which("alpha-say")}))
"""


def agent_with_environments(host: Host, node: str, redis_url: str) -> tuple[Agent, Collected]:
    wheels = host.base / "wheels"
    make_wheel(wheels, "alpha", "1.0", requires=("beta>=1",), script="alpha-say")
    make_wheel(wheels, "beta", "1.2")
    agent, sent = make_agent(host, node, redis_url)
    settings = EnvironmentSettings(
        root=host.data_dir / "envs", find_links=str(wheels), no_index=True, timeout_s=120
    )
    agent.processes.environments = EnvironmentCache(settings)
    return agent, sent


def test_a_bundles_requirements_are_built_once_and_its_program_imports_them(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(CODE, IMPORTS)
    host.bundle(CODE, "alpha==1.0  # and its beta\n", "requirements.txt")
    agent, sent = agent_with_environments(host, node, redis_url)
    assert agent.receive(start_payload(job, "c1", launcher="edl")) == "applied", sent.reports
    run_to_exit(agent, sent)
    [exited] = sent.of(WorkerExited)
    assert exited.outcome == "clean", (exited, agent.config.log_path(job, "w0").read_text())
    seen = output(agent, job)
    envs = host.data_dir / "envs"
    assert seen["alpha"].startswith(str(envs)) and seen["beta"] == "1.2"
    assert seen["script"] and seen["script"].startswith(str(envs))
    log = agent.config.log_path(job, "w0").read_text()
    assert log.index("[environment]") < log.index('{"alpha"')  # the build's lines come first
    [started] = sent.of(Started)
    assert started.environment is not None and not started.environment.hit
    assert started.environment.packages == ("alpha==1.0", "beta==1.2")
    assert "built in" in started.environment.describe()

    again, sent_again = agent_with_environments(host, node, redis_url)
    payload = start_payload(f"{job}-2", "c2", launcher="edl")
    assert again.receive(payload) == "applied"
    run_to_exit(again, sent_again)
    [hit] = sent_again.of(Started)
    assert hit.environment is not None and hit.environment.hit
    assert hit.environment.key == started.environment.key and hit.environment.build_s == 0


def test_a_request_that_does_not_build_fails_the_job_with_no_retry_and_starts_nothing(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(CODE, IMPORTS)
    host.bundle(CODE, "alpha==9.9\n", "requirements.txt")
    agent, sent = agent_with_environments(host, node, redis_url)
    assert agent.receive(start_payload(job, "c1", launcher="edl")) == "failed"
    [failed] = sent.of(Failed)
    assert failed.final and failed.error.startswith("its environment does not build:")
    assert "alpha" in failed.error
    assert not sent.of(Started) and not agent.processes.of_job(job)
    assert agent.receive(start_payload(job, "c1", launcher="edl")) == "replayed"
    assert "[environment]" in agent.config.log_path(job, "w0").read_text()


def test_a_console_script_of_the_environment_is_an_entrypoint_and_another_name_is_not(
    host: Host, node: str, redis_url: str, job: str
) -> None:
    host.bundle(CODE, IMPORTS)
    host.bundle(CODE, "alpha==1.0\n", "requirements.txt")
    agent, sent = agent_with_environments(host, node, redis_url)
    payload = start_payload(job, "c1", launcher="torchrun", entrypoint=["alpha-say"])
    assert agent.receive(payload) == "applied", sent.reports
    run_to_exit(agent, sent)
    [exited] = sent.of(WorkerExited)
    log = agent.config.log_path(job, "w0").read_text()
    assert exited.outcome == "clean" and "alpha 1.0" in log, log

    payload = start_payload(f"{job}-2", "c2", launcher="torchrun", entrypoint=["rm", "-rf", "/"])
    assert agent.receive(payload) == "applied"
    [failed] = [f for f in sent.of(Failed) if f.job == f"{job}-2"]
    assert "'rm' is not a console script of the job's environment" in failed.error
    assert not agent.processes.of_job(f"{job}-2")
