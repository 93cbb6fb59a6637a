"""Starting one training process: its command line, environment and log file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from workers.agent.config import REPO_ROOT, AgentConfig
from workers.protocol import StartWorkers, WorkerSlot


def worker_argv(
    config: AgentConfig, command: StartWorkers, worker: WorkerSlot, store_url: str | None = None
) -> list[str]:
    """The command line of the training process for ``worker`` (see workers.elastic.cli).

    It holds no credential: the job's Redis URL travels in the environment
    (``programs.builtin_env``), since a command line is visible to ``ps`` and
    is the first line of the worker's log, which its tenant reads.  ``store_url``:
    the job's store door (``workers.agent.door``), else the store the command names.
    """
    if store_url is None:
        store_url = config.job_store_url(command.job, command.store_prefix, command.checkpoint_dir)
    argv = [
        config.python,
        "-m",
        config.worker_module,
        "--job", command.job,
        "--worker", worker.worker_id,
        "--workload", command.workload,
        "--args", json.dumps(command.args, sort_keys=True),
        "--batch-size", str(command.batch_size),
        "--recovery", command.recovery,
        "--store-url", store_url,
        "--checkpoint-every", str(command.checkpoint_every),
        "--checkpoint-keep", str(command.checkpoint_keep),
        "--device", config.device_for(worker.slot),
    ]  # fmt: skip
    # A newcomer joins the running job; only the first generation is told its size.
    if not command.join and command.initial_world is not None:
        argv += ["--initial-world", str(command.initial_world)]
    if worker.rank is not None:  # the allocation's order: every generation sorts by it
        argv += ["--rank", str(worker.rank)]
    if command.checkpoint_min_seconds > 0:
        argv += ["--checkpoint-min-seconds", repr(command.checkpoint_min_seconds)]
    if command.checkpoint_minutes is not None:
        argv += ["--checkpoint-minutes", repr(command.checkpoint_minutes)]
    if command.max_steps is not None:
        argv += ["--max-steps", str(command.max_steps)]
    if command.sync_timeout_s is not None:
        argv += ["--sync-timeout", repr(command.sync_timeout_s)]
    if config.step_log_dir is not None:
        argv += ["--step-log", str(config.step_log_path(command.job, worker.worker_id))]
    return argv


def spawn(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    *,
    cwd: Path = REPO_ROOT,
    preexec_fn: Callable[[], None] | None = None,
    stdin: int = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
    program_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a process in its own session with stdout and stderr appended to ``log_path``.

    ``env`` is the process's whole environment; ``preexec_fn`` runs in the
    child before exec (a program's resource limits); ``stdin``: PIPE for a
    warm process (``warm.py``), which reads its assignment there;
    ``pass_fds``: descriptors the child keeps (bubblewrap's ``--args``).
    ``program_env``: the environment the log header names when it is not
    ``env`` (a sandboxed program's, which bubblewrap sets).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    shown = log_header(argv, env if program_env is None else program_env)
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shown}\n".encode())
        log.flush()
        # Own session: a Ctrl-C or SIGTERM aimed at the agent's group does not hit
        # training, and the agent can signal a worker's whole process group.
        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec_fn,
            pass_fds=pass_fds,
        )


def log_header(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """How a process is shown at the top of its log, which its job's tenant reads.

    The command line with any URL's password masked, and the names of the
    environment's variables, never their values (they hold the job's own
    Redis user, a store's keys).
    """
    return f"{shown_command(argv)} (environment: {env_names(env)})"


URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*:)[^@\s]+@")
"""``scheme://user:`` (group 1), then a password up to ``@``."""


def shown_command(argv: Sequence[str]) -> str:
    """``argv`` joined, each ``scheme://user:password@`` shown as ``scheme://user:***@``."""
    return " ".join(URL_PASSWORD.sub(r"\1***@", arg) for arg in argv)


def env_names(env: Mapping[str, str]) -> str:
    """The variable names of an environment, for the log (values may hold credentials)."""
    return " ".join(sorted(env))


def log_tail(path: Path | str, limit: int = 2000) -> str:
    """The last ``limit`` characters of a log file ("" if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def process_matches(pid: int, job: str, worker_id: str, module: str) -> bool:
    """Whether ``pid`` is alive and is the training process of (job, worker).

    Used to adopt processes after an agent restart without trusting a reused pid.
    """
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie has exited already.
    if status.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    args = raw.decode(errors="replace").split("\0")
    return module in args and _flag(args, "--job") == job and _flag(args, "--worker") == worker_id


def same_process(pid: int, start_ticks: int) -> bool:
    """Whether ``pid`` is alive, not a zombie, and started at ``start_ticks``.

    How a restarted agent recognises a tenant program's process: its command
    line is bubblewrap's (or the user's), but pid and kernel start time
    together name one process for the machine's uptime.
    """
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = status.rsplit(")", 1)[-1].split()
    return fields[0] != "Z" and int(fields[19]) == start_ticks


def _flag(args: list[str], name: str) -> str | None:
    try:
        return args[args.index(name) + 1]
    except (ValueError, IndexError):
        return None
