"""A built-in workload starts as a tenant program does: no credential of the agent's anywhere.

Its command line (``ps``, the log header its tenant reads) holds no URL with a
password; its environment is a program's fixed one plus its job's own Redis
user, nothing of the agent's; its sandbox shows the SDK read-only and binds
only its store directory, its scratch HOME and the step log back read-write.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.agent.config import REPO_ROOT, AgentConfig
from workers.agent.launch import log_header, shown_command, worker_argv
from workers.agent.programs import builtin_env, builtin_mounts, builtin_store_dir
from workers.protocol import Command, StartWorkers

AGENT_URL = "redis://portal:agent-secret@127.0.0.1:6380/0"
JOB_URL = "redis://edl-j1:job-pw@127.0.0.1:6380/0"


def config(tmp_path: Path, **extra: object) -> AgentConfig:
    return AgentConfig(
        node="n1",
        device="cpu",
        slots=2,
        redis_url=AGENT_URL,
        data_dir=tmp_path / "data",
        artifact_url=f"file://{tmp_path / 'store'}",
        **extra,  # type: ignore[arg-type]
    )


def builtin(**extra: object) -> StartWorkers:
    command = Command.from_dict(
        {
            "type": "start_workers",
            "job": "j1",
            "command_id": "c1",
            "workload": "mlp-digits",
            "args": {"epochs": 1},
            "batch_size": 32,
            "recovery": "consistent",
            "checkpoint_every": 0,
            "workers": [{"worker_id": "w0", "slot": 0}],
            "initial_world": 1,
            **extra,
        }
    )
    assert isinstance(command, StartWorkers)
    return command


def test_the_command_line_and_its_log_header_hold_no_credential(tmp_path: Path) -> None:
    conf = config(tmp_path)
    argv = worker_argv(conf, builtin(), builtin().workers[0])
    assert not any("agent-secret" in arg or "redis://" in arg for arg in argv)
    env = builtin_env(conf, builtin(), "w0", JOB_URL)
    header = log_header(argv, env)
    assert "job-pw" not in header and "agent-secret" not in header
    assert "REDIS_URL" in header and "PYTHONPATH" in header  # names, never values


def test_the_log_header_masks_any_url_password() -> None:
    shown = shown_command(["python", "x.py", "--db", "postgres://u:hunter2@db/x", AGENT_URL])
    assert "hunter2" not in shown and "agent-secret" not in shown
    assert "postgres://u:***@db/x" in shown and "redis://portal:***@127.0.0.1:6380/0" in shown
    assert shown_command(["redis://127.0.0.1:6379/0", "a:b@c"]) == "redis://127.0.0.1:6379/0 a:b@c"


def test_the_environment_is_fixed_and_carries_only_the_jobs_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "REDIS_URL": AGENT_URL,
        "AGENT_KEY": "ab" * 32,
        "SECRET_KEY": "django-secret",
        "DATABASE_URL": "postgres://u:pw@db/portal",
        "LD_PRELOAD": "/tmp/evil.so",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
    }.items():
        monkeypatch.setenv(name, value)
    conf = config(tmp_path)
    env = builtin_env(conf, builtin(store_prefix="tenants/t/jobs/1"), "w0", JOB_URL)
    assert env["REDIS_URL"] == JOB_URL
    assert env["PYTHONPATH"] == str(REPO_ROOT)
    assert env["HOME"] == str(conf.job_dir("j1") / "scratch" / "w0")
    assert set(env) == {
        "PATH", "HOME", "TMPDIR", "LANG", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "REDIS_URL", "PYTHONPATH",
    }  # fmt: skip
    # An object store: the runtime reaches it through its door, with no credentials.
    s3 = AgentConfig(node="n1", device="cpu", slots=1, redis_url=AGENT_URL, data_dir=tmp_path,
                     artifact_url="s3://bucket/p")  # fmt: skip
    env = builtin_env(s3, builtin(store_prefix="tenants/t/jobs/1"), "w0", JOB_URL)
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AGENT_KEY" not in env


def test_the_sandbox_shows_the_sdk_and_binds_back_only_the_jobs_own_directories(
    tmp_path: Path,
) -> None:
    conf = config(tmp_path, step_log_dir=tmp_path / "steps")
    command = builtin(store_prefix="tenants/t/jobs/1")
    assert builtin_store_dir(conf, command) is None  # its prefix: through its store door
    mounts = builtin_mounts(conf, command, "w0", base_prefix=Path("/usr"))
    assert set(mounts.writable) == {conf.job_dir("j1") / "scratch" / "w0", tmp_path / "steps"}
    assert {REPO_ROOT, conf.data_dir, tmp_path / "store"} <= set(mounts.hide)
    assert {REPO_ROOT / "workers", REPO_ROOT / "edl"} <= set(mounts.read_only)
    # Without a prefix, the node-local checkpoint directory the command names.
    local = builtin(checkpoint_dir=str(conf.data_dir / "checkpoints" / "j1"))
    assert builtin_store_dir(conf, local) == conf.data_dir / "checkpoints" / "j1"
    s3 = AgentConfig(node="n1", device="cpu", slots=1, redis_url=AGENT_URL, data_dir=tmp_path,
                     artifact_url="s3://bucket/p")  # fmt: skip
    assert builtin_store_dir(s3, command) is None
