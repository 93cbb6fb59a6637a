"""The pure parts of running tenant programs: bwrap argv, environments, mounts, settings, ACLs."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from workers.agent import seccomp
from workers.agent.config import (
    REPO_ROOT,
    AgentConfig,
    AgentConfigError,
    AgentEnvironment,
    SandboxSettings,
)
from workers.agent.environments import EnvironmentSettings
from workers.agent.limits import create_cgroups, exit_reason, is_cgroup_v2
from workers.agent.programs import (
    JobDirs,
    builtin_env,
    edl_env,
    job_dirs,
    program_argv,
    program_mounts,
    torchrun_env,
)
from workers.agent.quota import Quota
from workers.agent.redis_acl import derive_password, job_rules, url_for
from workers.agent.sandbox import (
    Identity,
    Mounts,
    args_payload,
    bwrap_argv,
    env_args,
    job_identity,
)
from workers.agent.store import StopRecord, WorkerRecord
from workers.elastic.cli import options_from_env
from workers.protocol import Command, StartWorkers, WorkerExited

CODE = "0f" * 32


def config(tmp_path: Path, **extra: Any) -> AgentConfig:
    return AgentConfig(
        node="n1",
        device=extra.pop("device", "cpu"),
        slots=4,
        redis_url="redis://:adminpw@10.0.0.5:6380/3",
        data_dir=tmp_path / "data",
        python="/srv/portal/.venv/bin/python",
        **extra,
    )


def start(launcher: str = "torchrun", **program: Any) -> StartWorkers:
    command = Command.from_dict(
        {
            "type": "start_workers",
            "job": "j1",
            "command_id": "c1",
            "batch_size": 16,
            "recovery": "consistent",
            "checkpoint_every": 5,
            "initial_world": 4,
            "workers": [{"worker_id": "a", "slot": 2, "rank": 2}, {"worker_id": "b", "slot": 3}],
            "program": {
                "code": CODE,
                "code_path": f"code/{CODE}.tar.gz",
                "entrypoint": ["train.py", "--lr", "0.1"],
                "launcher": launcher,
                "generation": 3,
                "world_size": 4,
                "group_rank": 1,
                "master_addr": "node-a",
                "master_port": 29400,
                "env": {"LR": "0.1"},
                **program,
            },
        }
    )
    assert isinstance(command, StartWorkers)
    return command


def test_bwrap_argv_hides_then_binds_then_remounts_read_only() -> None:
    mounts = Mounts(
        hide=(Path("/repo"), Path("/repo/var")),
        read_only=(Path("/repo/workers"), Path("/usr/lib/python3"), Path("/repo/var/code/x")),
        writable=(Path("/repo/var/jobs/j/scratch/w"),),
    )
    argv = bwrap_argv("bwrap", mounts, ["python", "main.py"], cwd=Path("/repo/var/code/x"))
    text = " ".join(argv)
    assert argv[:6] == ["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    assert "--die-with-parent" not in argv and "--new-session" in argv
    assert text.index("--tmpfs /repo ") < text.index("--tmpfs /repo/var ")
    assert text.index("--tmpfs /repo/var ") < text.index("--ro-bind /repo/workers /repo/workers")
    assert "--bind /repo/var/jobs/j/scratch/w /repo/var/jobs/j/scratch/w" in text
    assert "/usr/lib/python3" not in text  # visible anyway: not bound again
    # Read-only last, innermost first, once every mount point exists.
    assert text.index("--remount-ro /repo/var") < text.index("--remount-ro /repo ")
    assert text.index("--bind /repo/var/jobs") < text.index("--remount-ro")
    assert "--ro-bind-try /dev/null /etc/shadow" in text
    assert argv[-4:] == ["/repo/var/code/x", "--", "python", "main.py"]
    with_parent = bwrap_argv("bwrap", mounts, ["x"], cwd=Path("/"), die_with_parent=True)
    assert "--die-with-parent" in with_parent
    gpus = Mounts(hide=(), read_only=(), writable=(), devices=(Path("/dev/nvidia0"),))
    gpu_text = " ".join(bwrap_argv("bwrap", gpus, ["x"], cwd=Path("/")))
    assert "--perms 1777 --tmpfs /tmp --dev-bind-try /dev/nvidia0 /dev/nvidia0" in gpu_text
    # Mount points inside hidden directories are walkable by a program's own uid.
    assert text.index("--perms 0755 --dir /repo/var/jobs ") < text.index("--bind /repo/var/jobs")
    assert "--dir /repo/var " not in text  # a hidden directory is a tmpfs, not a --dir


def test_under_a_root_agent_bwrap_keeps_no_namespace_uid_and_setpriv_drops_to_the_jobs() -> None:
    mounts = Mounts(hide=(), read_only=(), writable=())
    me = Identity(uid=201234, gid=201234)
    argv = bwrap_argv("bwrap", mounts, ["python", "main.py"], cwd=Path("/"), identity=me, args_fd=7)
    text = " ".join(argv)
    assert argv[:3] == ["bwrap", "--args", "7"] and "--unshare-user" not in argv
    assert "--cap-drop ALL --cap-add CAP_SETUID --cap-add CAP_SETGID --cap-add CAP_SETPCAP" in text
    tail = argv[argv.index("--") + 1 :]
    assert tail == [
        "/usr/bin/setpriv", "--reuid=201234", "--regid=201234", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--", "python", "main.py",
    ]  # fmt: skip
    same = job_identity("job-7", 200_000, 100_000)
    assert same == job_identity("job-7", 200_000, 100_000) and 200_000 <= same.uid < 300_000
    assert job_identity("job-8", 200_000, 100_000) != same


def test_a_programs_environment_travels_as_bwrap_options_in_a_descriptor() -> None:
    args = env_args({"B": "2", "A": "x y"})
    assert args == ["--clearenv", "--setenv", "A", "x y", "--setenv", "B", "2"]
    assert args_payload(args).split(b"\0") == [*(arg.encode() for arg in args), b""]


def test_torchrun_env_is_the_contract_and_nothing_of_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_KEY", "agent-secret")
    cfg = config(tmp_path)
    command = start()
    dirs = JobDirs(cfg.job_dir("j1"))
    first = torchrun_env(cfg, command, command.workers[0], dirs)
    second = torchrun_env(cfg, command, command.workers[1], dirs)
    assert first["RANK"] == "2" and first["LOCAL_RANK"] == "0"
    assert second["RANK"] == "3" and second["LOCAL_RANK"] == "1"  # group_rank 1 * 2 + 1
    for env in (first, second):
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1"
        assert env["MASTER_ADDR"] == "node-a" and env["MASTER_PORT"] == "29400"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "3" and env["TORCHELASTIC_RUN_ID"] == "j1"
        assert env["OMP_NUM_THREADS"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["LR"] == "0.1" and env["TMPDIR"] == "/tmp"
        assert "SECRET_KEY" not in env and "REDIS_URL" not in env and "PYTHONPATH" not in env
    assert first["ROLE_RANK"] == "2"
    assert first["SCRATCH_DIR"] == first["HOME"] == str(cfg.data_dir / "jobs/j1/scratch/a")
    assert first["CHECKPOINT_DIR"] == str(cfg.data_dir / "jobs/j1/checkpoints")
    assert first["ARTIFACT_DIR"] == str(cfg.data_dir / "jobs/j1/artifacts")
    gpu = torchrun_env(config(tmp_path, device="cuda"), command, command.workers[1], dirs)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "2,3" and "OMP_NUM_THREADS" not in gpu


def test_edl_env_hands_the_runtime_its_options(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    command = start("edl")
    dirs = JobDirs(cfg.job_dir("j1"))
    env = edl_env(cfg, command, command.workers[1], dirs, "redis://edl-j1:pw@10.0.0.5:6380/3")
    options = options_from_env(env)
    assert options.job_id == "j1" and options.worker_id == "b" and options.workload == ""
    assert options.redis_url == "redis://edl-j1:pw@10.0.0.5:6380/3"
    # No store prefix (an older control plane): the job's checkpoints stay on this node.
    assert options.store_url == str(dirs.root) and options.checkpoint_every == 5
    assert options.initial_world == 4 and options.batch_size == 16 and options.device == "cpu"
    assert env["PYTHONPATH"] == str(REPO_ROOT)  # the SDK packages, bound alone in the sandbox
    assert "RANK" not in env and "adminpw" not in json.dumps(env)


def test_program_argv_never_uses_a_shell() -> None:
    argv = program_argv("/venv/bin/python", Path("/code/x"), ("train.py", "--name", "a; rm -rf /"))
    assert argv == ["/venv/bin/python", "/code/x/train.py", "--name", "a; rm -rf /"]


def test_program_mounts_hide_the_repo_data_root_database_and_other_bundles(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        sandbox=SandboxSettings(database_file=Path("/srv/db/portal.sqlite3"), hide=(Path("/x"),)),
    )
    dirs = JobDirs(cfg.job_dir("j1"))
    code = Path("/cache/code") / CODE
    mounts = program_mounts(
        cfg, dirs, "a", code, repo_root=Path("/srv/portal"), base_prefix=Path("/opt/py")
    )
    assert set(mounts.hide) >= {
        Path("/srv/portal"),
        cfg.data_dir,
        Path("/root"),
        Path("/srv/db"),
        Path("/cache/code"),
        Path("/x"),
    }
    assert set(mounts.read_only) >= {
        Path("/srv/portal/.venv"),
        Path("/srv/portal/edl"),
        Path("/srv/portal/workers"),
        Path("/opt/py"),
        code,
    }
    assert mounts.writable == (dirs.checkpoints, dirs.artifacts, dirs.scratch("a"))
    secret = tmp_path / "token.txt"
    secret.write_text("x")
    with_file = replace(cfg, sandbox=SandboxSettings(hide=(secret,)))
    masked = program_mounts(with_file, dirs, "a", code, base_prefix=Path("/opt/py"))
    assert secret in masked.masked_files and secret not in masked.hide


def test_sandbox_settings_from_the_environment(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://x", "PORTAL_DATA_DIR": str(tmp_path)}
    default = AgentEnvironment.read(env).sandbox
    assert (default.mode, default.memory_mb, default.max_procs, default.max_open_files) == (
        "on",
        8192,
        512,
        4096,
    )
    custom = AgentEnvironment.read(
        {
            **env,
            "SANDBOX": "off",
            "SANDBOX_MEMORY_MB": "2048",
            "SANDBOX_MAX_PROCS": "64",
            "SANDBOX_HIDE": "/a:/b",
            "SANDBOX_DATABASE_FILE": "/db/p.sqlite3",
        }
    ).sandbox
    assert custom.mode == "off" and custom.memory_mb == 2048 and custom.max_procs == 64
    assert custom.hide == (Path("/a"), Path("/b"))
    assert custom.database_file == Path("/db/p.sqlite3")
    with pytest.raises(AgentConfigError, match="SANDBOX must be on or off"):
        AgentEnvironment.read({**env, "SANDBOX": "maybe"})


def test_a_jobs_quota_on_a_node_from_the_environment(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://x", "PORTAL_DATA_DIR": str(tmp_path)}
    assert AgentEnvironment.read(env).sandbox.quota == Quota(
        disk_bytes=100 * 2**30, entries=500_000, shm_bytes=8 * 2**30, every_s=15.0
    )
    given = {
        "SANDBOX_SCRATCH_MB": "512",
        "SANDBOX_SCRATCH_FILES": "1000",
        "SANDBOX_SHM_MB": "64",
        "SANDBOX_QUOTA_EVERY_SECONDS": "2.5",
    }
    custom = AgentEnvironment.read({**env, **given}).sandbox.quota
    assert custom == Quota(disk_bytes=512 * 2**20, entries=1000, shm_bytes=64 * 2**20, every_s=2.5)
    for name in given:
        with pytest.raises(AgentConfigError, match=name):
            AgentEnvironment.read({**env, name: "-1"})


def test_a_file_too_large_is_told_as_the_scratch_quota() -> None:
    settings = SandboxSettings(quota=Quota(disk_bytes=64 * 2**20))
    why = "file size limit reached: one file may not exceed the job's scratch quota "
    assert exit_reason(settings, 1, "OSError: [Errno 27] File too large", {}) == (
        why + "(SANDBOX_SCRATCH_MB=64)"
    )
    assert exit_reason(settings, 128 + 25, "", {}).startswith(why)  # SIGXFSZ, through bwrap


def test_exit_reasons_name_the_limit() -> None:
    settings = SandboxSettings(memory_mb=2048, max_procs=256)
    memory = exit_reason(settings, 1, "Traceback ...\nMemoryError\n", {})
    assert memory == "memory limit reached (SANDBOX_MEMORY_MB=2048)"
    procs = "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    assert exit_reason(settings, 1, procs, {}) == "process limit reached (SANDBOX_MAX_PROCS=256)"
    assert exit_reason(settings, 1, "ValueError: bad", {}) == ""
    assert exit_reason(settings, 0, "MemoryError", {}) == ""


def test_exit_reasons_from_cgroup_counters(tmp_path: Path) -> None:
    """An OOM kill leaves no MemoryError in the log: the memory cgroup's counter tells."""
    settings = SandboxSettings(memory_mb=512, max_procs=8)
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    memory.mkdir()
    pids.mkdir()
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (pids / "pids.events").write_text("max 0\n")
    groups = {"memory": memory, "pids": pids}
    assert exit_reason(settings, 137, "", groups) == "memory limit reached (SANDBOX_MEMORY_MB=512)"
    (pids / "pids.events").write_text("max 3\n")
    assert exit_reason(settings, 1, "", groups) == "process limit reached (SANDBOX_MAX_PROCS=8)"


def test_on_a_cgroup_v2_host_a_worker_gets_one_cgroup_with_memory_pids_and_cpu(
    tmp_path: Path,
) -> None:
    """This machine mounts cgroup v1 (its v2 tree offers no memory controller), so the v2
    path is checked on a directory laid out like a v2-only host's /sys/fs/cgroup."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    settings = SandboxSettings(memory_mb=512, max_procs=64, cgroup_root=tmp_path)
    made = create_cgroups(settings, "portal-n0-j1-w0-0")
    path = tmp_path / "portal-sandbox" / "portal-n0-j1-w0-0"
    assert made == {"unified": path}
    assert (path / "memory.max").read_text() == str(512 * 1024 * 1024)
    assert (path / "pids.max").read_text() == "64" and (path / "cpu.weight").read_text() == "100"
    for holder in (tmp_path, tmp_path / "portal-sandbox"):
        assert (holder / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert exit_reason(settings, 137, "", made) == "memory limit reached (SANDBOX_MEMORY_MB=512)"
    (path / "memory.events").write_text("oom_kill 0\n")
    (path / "pids.events").write_text("max 2\n")
    assert exit_reason(settings, 1, "", made) == "process limit reached (SANDBOX_MAX_PROCS=64)"
    # A hybrid host like this one: v2 offers no memory controller, so v1 is used.
    assert not is_cgroup_v2(Path("/sys/fs/cgroup/unified"))


def test_records_written_before_programs_still_load() -> None:
    old: dict[str, Any] = {
        "job": "j",
        "worker_id": "w",
        "slot": 0,
        "pid": 1,
        "log_path": "l",
        "started_at": 1.0,
    }
    record = WorkerRecord(**old)
    assert record.rank is None and record.generation is None and not record.sandboxed
    assert StopRecord(command_id="c", deadline=1.0).kill_after is None
    exited = WorkerExited.from_dict(
        {
            "type": "worker_exited",
            "node": "n",
            "job": "j",
            "worker_id": "w",
            "slot": 0,
            "exit_code": 1,
            "outcome": "crashed",
        }
    )
    assert isinstance(exited, WorkerExited) and exited.generation is None and exited.reason == ""


def test_job_acl_rules_and_urls() -> None:
    password = derive_password(b"secret", "j1")
    assert password == derive_password(b"secret", "j1") != derive_password(b"secret", "j2")
    assert password != derive_password(b"other", "j1")
    rules = job_rules("j1", password)
    assert rules[:4] == ["reset", "on", f">{password}", "~edl:j1:*"]
    assert {"&edl:j1:*", "-@all", "-@dangerous", "-@admin", "-@scripting"} <= set(rules)
    assert "+@all" not in rules and "+eval" not in rules  # an allow-list, no scripts
    url = url_for("redis://:admin@10.0.0.5:6380/3?ssl_cert_reqs=none", "edl-j1", "p w")
    assert url == "redis://edl-j1:p%20w@10.0.0.5:6380/3?ssl_cert_reqs=none"


def with_prefix(launcher: str) -> StartWorkers:
    command = start(launcher)
    data = {**command.to_dict(), "store_prefix": "tenants/acme/jobs/7"}
    again = Command.from_dict(data)
    assert isinstance(again, StartWorkers)
    return again


DOOR = "door+unix:///run/portal-door/0123456789abcdef/store.sock"


def test_nothing_of_a_directory_store_is_bound_into_the_sandbox(tmp_path: Path) -> None:
    store = tmp_path / "shared"
    cfg = config(tmp_path, artifact_url=f"file://{store}")
    command = with_prefix("edl")
    dirs = job_dirs(cfg, command)
    assert dirs.checkpoints == dirs.root / "checkpoints"  # node-local; the door reaches the store
    env = edl_env(cfg, command, command.workers[0], dirs, "redis://edl-j1:pw@h:1/0", DOOR)
    assert options_from_env(env).store_url == DOOR
    assert options_from_env(env).checkpoint_keep == 2
    assert not any(name.startswith("AWS_") for name in env)
    mounts = program_mounts(cfg, dirs, "a", Path("/cache/code") / CODE, base_prefix=Path("/o"))
    assert store in mounts.hide  # every job's and tenant's objects, this job's too
    assert mounts.writable == (dirs.checkpoints, dirs.artifacts, dirs.scratch("a"))
    assert not any(store in path.parents or path == store for path in mounts.writable)


def test_an_object_stores_credentials_reach_no_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "the-agents-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-agents-secret")
    cfg = config(tmp_path, artifact_url="s3://bucket/portal")
    command = with_prefix("edl")
    dirs = job_dirs(cfg, command)
    env = edl_env(cfg, command, command.workers[0], dirs, "redis://u:p@h:1/0", DOOR)
    assert options_from_env(env).store_url == DOOR
    builtin = builtin_env(cfg, command, "a", "redis://u:p@h:1/0")
    torchrun = torchrun_env(cfg, with_prefix("torchrun"), command.workers[0], dirs)
    for each in (env, builtin, torchrun):
        assert not any(name.startswith("AWS_") for name in each)
        assert "the-agents" not in repr(each)


def test_local_store_dirs() -> None:
    from workers.agent.config import local_store_dir

    assert local_store_dir("file:///srv/store") == Path("/srv/store")
    assert local_store_dir("/srv/store") == Path("/srv/store")
    assert local_store_dir("s3://bucket/x") is None
    assert local_store_dir("") is None  # no store configured: nothing to hide or bind


def test_the_system_call_filter_is_a_whole_bpf_program_per_architecture() -> None:
    for machine in ("x86_64", "aarch64"):
        rules = seccomp.filter_for(machine)
        assert rules is not None and len(rules) % 8 == 0 and len(rules) // 8 < 4096
        code, _jt, _jf, k = struct.unpack("<HBBI", rules[-8:])
        assert (code, k) == (seccomp.RET_K, seccomp.RET_ALLOW)  # what is not refused runs
    assert seccomp.filter_for("sparc64") is None
    x86 = seccomp.program(seccomp.X86_64)
    refused = {struct.unpack("<HBBI", x86[i : i + 8])[3] for i in range(0, len(x86), 8)}
    assert {272, 308, 101, 250, 165} <= refused  # unshare, setns, ptrace, keyctl, mount


def test_environment_settings_from_the_environment(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://x", "PORTAL_DATA_DIR": str(tmp_path)}
    default = AgentEnvironment.read(env).environments
    assert default == EnvironmentSettings(root=tmp_path.resolve() / "envs")
    given = {
        "ENVIRONMENT_CACHE_DIR": str(tmp_path / "shared"),
        "ENVIRONMENT_CACHE_MAX_GB": "2",
        "ENVIRONMENT_INDEX_URL": "https://pypi.internal/simple",
        "ENVIRONMENT_EXTRA_INDEX_URLS": "https://a/simple https://b/simple",
        "ENVIRONMENT_FIND_LINKS": "/srv/wheels",
        "ENVIRONMENT_NO_INDEX": "on",
        "ENVIRONMENT_BUILD_TIMEOUT_SECONDS": "60",
    }
    assert AgentEnvironment.read({**env, **given}).environments == EnvironmentSettings(
        root=(tmp_path / "shared").resolve(),
        max_bytes=2 * 2**30,
        index_url="https://pypi.internal/simple",
        extra_index_urls=("https://a/simple", "https://b/simple"),
        find_links="/srv/wheels",
        no_index=True,
        timeout_s=60.0,
    )
    with pytest.raises(AgentConfigError, match="ENVIRONMENT_NO_INDEX must be a boolean"):
        AgentEnvironment.read({**env, "ENVIRONMENT_NO_INDEX": "maybe"})
    with pytest.raises(AgentConfigError, match="ENVIRONMENT_CACHE_MAX_GB must be positive"):
        AgentEnvironment.read({**env, "ENVIRONMENT_CACHE_MAX_GB": "0"})
