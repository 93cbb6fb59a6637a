"""A tenant program's process: its directories, command line, environment and mounts (pure).

Per job, on each node that runs it (created by the agent)::

    <data_dir>/jobs/<job>/checkpoints        CHECKPOINT_DIR  read-write, shared by its workers
    <data_dir>/jobs/<job>/artifacts          ARTIFACT_DIR    read-write, shared by its workers
    <data_dir>/jobs/<job>/scratch/<worker>   SCRATCH_DIR and HOME, read-write, one per worker

Nothing of the artifact store is bound into the sandbox, and no program
gets its credentials.  The elastic runtime (an ``edl`` program, a built-in
workload) reaches the job's prefix (``tenants/<slug>/jobs/<pk>``) through
its agent's store door (``workers.agent.door``: a Unix socket whose folder
is bound read-only), so its checkpoints outlive the node; a ``torchrun``
program's ``CHECKPOINT_DIR`` is node-local, and the agent mirrors it to and
from ``<prefix>/checkpoints`` (``workers.agent.mirror``).  Everything left
in ``ARTIFACT_DIR`` is uploaded to the store when the job ends
(``workers.agent.collect``).  (Without a prefix, in tests, an edl program's
runtime writes ``<data_dir>/jobs/<job>`` and a built-in's
``<data_dir>/checkpoints/<job>``.)  The program runs
``python <code dir>/<entrypoint[0]> <entrypoint[1:]...>`` in its code directory
(the bundle unpacked read-only), never through a shell, with exactly the
environment built here and nothing of the agent's own (no secrets, no broker
or database URLs).

Launchers:

- ``torchrun``: the torchrun contract (RANK, LOCAL_RANK, WORLD_SIZE, ...,
  MASTER_ADDR/PORT), so an unmodified ``init_process_group(init_method="env://")``
  script runs, and ``METRICS_FILE`` (``<scratch>/metrics.jsonl``), where it may
  append JSON lines of metrics (``workers.agent.metrics_tail``); a resize stops the job and starts it again one generation on
  (TORCHELASTIC_RESTART_COUNT).
- ``edl``: the worker options of the elastic runtime as JSON in
  ``EDL_OPTIONS`` (``workers.elastic.cli``), with the job's own Redis user in
  their ``redis_url``, and ``PYTHONPATH`` naming the SDK packages only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from workers.agent.config import REPO_ROOT, AgentConfig, local_store_dir
from workers.agent.environments import Environment
from workers.agent.gpus import cuda_visible
from workers.agent.metrics_file import METRICS_FILE_NAME
from workers.agent.sandbox import HIDDEN_SYSTEM_DIRS, MASKED_FILES, Mounts
from workers.elastic.cli import OPTIONS_ENV, WorkerOptions, options_to_env
from workers.program import entrypoint_kind
from workers.protocol import Program, StartWorkers, WorkerSlot

SDK_PACKAGES: tuple[str, ...] = ("edl", "workers")
"""The repository's packages a program may import (``edl`` and what it imports: ``workers``)."""

DEFAULT_SYNC_TIMEOUT_S = 30.0
DEFAULT_SCALE_LEAD_MS = 500.0


@dataclass(frozen=True)
class JobDirs:
    """A program job's directories on this node (see the module docstring)."""

    root: Path

    @property
    def job(self) -> str:
        """The job's id (``root`` is ``<data_dir>/jobs/<job>``)."""
        return self.root.name

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def scratch(self, worker_id: str) -> Path:
        """One worker's private scratch directory (its HOME)."""
        return self.root / "scratch" / worker_id

    def metrics_file(self, worker_id: str) -> Path:
        """Where a torchrun worker appends its metrics (``METRICS_FILE``), in its scratch."""
        return self.scratch(worker_id) / METRICS_FILE_NAME

    def owned(self, worker_id: str) -> tuple[Path, ...]:
        """What a worker's program writes, so what its uid owns (``sandbox.hand_over``)."""
        return (self.checkpoints, self.artifacts, self.scratch(worker_id))

    def create(self, worker_id: str) -> None:
        """Make the job's and the worker's directories (an adapter's step)."""
        for path in (self.checkpoints, self.artifacts, self.scratch(worker_id)):
            path.mkdir(parents=True, exist_ok=True)


def job_dirs(config: AgentConfig, command: StartWorkers) -> JobDirs:
    """A program job's directories on this node."""
    return JobDirs(config.job_dir(command.job))


@dataclass(frozen=True)
class Placement:
    """Where one worker of a start command sits among that command's workers on this node."""

    local_rank: int
    local_world_size: int
    rank: int


def placement(command: StartWorkers, worker: WorkerSlot) -> Placement:
    """LOCAL_RANK (order in the command), LOCAL_WORLD_SIZE, RANK (given, else group-derived)."""
    local_rank = command.workers.index(worker)
    local_world = len(command.workers)
    program = command.program
    group_rank = program.group_rank if program is not None else 0
    rank = worker.rank if worker.rank is not None else group_rank * local_world + local_rank
    return Placement(local_rank=local_rank, local_world_size=local_world, rank=rank)


def program_slots(command: StartWorkers, worker: WorkerSlot) -> list[int]:
    """The GPUs a program's process uses: a torchrun process may pick any of its command's
    (``cuda:LOCAL_RANK``), an edl process only its own."""
    program = command.program
    if program is not None and program.launcher == "torchrun":
        return [w.slot for w in command.workers]
    return [worker.slot]


def venv_dir(python: str) -> Path:
    """The environment that holds the ``python`` executable (``<venv>/bin/python``)."""
    return Path(python).parent.parent


def program_argv(
    python: str, code_dir: Path, entrypoint: tuple[str, ...], scripts: Path | None = None
) -> list[str]:
    """The node's interpreter on what the entrypoint names (``workers.program``): a file of
    the bundle, ``-m module`` (run from the bundle's directory), or a console script of the
    job's environment (``scripts``: its ``bin``); ValueError when that script is not there."""
    kind = entrypoint_kind(entrypoint)
    if kind == "module":
        return [python, *entrypoint]
    if kind == "script":
        return [python, str(code_dir / entrypoint[0]), *entrypoint[1:]]
    script = scripts / entrypoint[0] if scripts is not None else None
    if script is None or not script.is_file() or script.is_symlink():
        raise ValueError(
            f"{entrypoint[0]!r} is not a console script of the job's environment "
            "(its requirements install none by that name)"
        )
    return [python, str(script), *entrypoint[1:]]


def fixed_env(config: AgentConfig, home: Path) -> dict[str, str]:
    """What every training process gets and nothing of the agent's own environment.

    No secret, broker or database URL: a process's Redis credentials are its
    job's own user's, added by its launcher (``edl_env``, ``builtin_env``).
    """
    env = {
        "PATH": os.pathsep.join(
            [str(venv_dir(config.python) / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
        ),
        "HOME": str(home),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    if config.device == "cpu":
        # One process per slot: intra-op threads would fight each other.
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return env


def base_env(
    config: AgentConfig, dirs: JobDirs, worker_id: str, program: Program
) -> dict[str, str]:
    """What every program process gets, before its launcher's variables."""
    env = dict(program.env)
    scratch = dirs.scratch(worker_id)
    env.update(fixed_env(config, scratch))
    env.update(
        CHECKPOINT_DIR=str(dirs.checkpoints),
        ARTIFACT_DIR=str(dirs.artifacts),
        SCRATCH_DIR=str(scratch),
    )
    return env


def builtin_store_dir(config: AgentConfig, command: StartWorkers) -> Path | None:
    """The node-local directory a built-in job's runtime writes (checkpoints, artifacts):
    the one the command names, without a store prefix (tests); None with a prefix, which it
    reaches through its door."""
    if command.store_prefix is not None:
        return None
    return local_store_dir(config.job_store_url(command.job, None, command.checkpoint_dir))


def builtin_owned(
    config: AgentConfig, command: StartWorkers, worker_id: str, home: Path
) -> tuple[Path, ...]:
    """Make what a built-in workload writes, and say what its uid must own (an adapter's step).

    Its scratch HOME, its store directory (``builtin_store_dir``) and, where the
    agent keeps step logs (tests, benchmarks), its own step-log file: the shared
    step-log directory stays the agent's.
    """
    dirs = [home]
    store = builtin_store_dir(config, command)
    if store is not None:
        dirs.append(store)
    for path in dirs:
        path.mkdir(parents=True, exist_ok=True)
    if config.step_log_dir is None:
        return tuple(dirs)
    config.step_log_dir.mkdir(parents=True, exist_ok=True)
    step_log = config.step_log_path(command.job, worker_id)
    step_log.touch()
    return (*dirs, step_log)


def builtin_env(
    config: AgentConfig,
    command: StartWorkers,
    worker_id: str,
    redis_url: str,
    repo_root: Path = REPO_ROOT,
) -> dict[str, str]:
    """A built-in workload's environment: a program's fixed one, the job's Redis user.

    ``python -m workers.elastic.worker`` reads ``REDIS_URL`` (never its command
    line, which ``ps`` and the log header show); ``PYTHONPATH`` names the
    repository, of which the sandbox shows only the SDK packages.
    """
    env = fixed_env(config, JobDirs(config.job_dir(command.job)).scratch(worker_id))
    if config.device == "cuda" and config.gpus:  # its own GPU only, as cuda:0 (device_for)
        slot = next(w.slot for w in command.workers if w.worker_id == worker_id)
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible(config.gpus, [slot])
    env.update(REDIS_URL=redis_url, PYTHONPATH=str(repo_root))
    return env


def torchrun_env(
    config: AgentConfig, command: StartWorkers, worker: WorkerSlot, dirs: JobDirs
) -> dict[str, str]:
    """The torchrun contract for one process (plus the base environment)."""
    program = _program(command)
    where = placement(command, worker)
    env = base_env(config, dirs, worker.worker_id, program)
    env.update(
        RANK=str(where.rank),
        LOCAL_RANK=str(where.local_rank),
        WORLD_SIZE=str(program.world_size),
        LOCAL_WORLD_SIZE=str(where.local_world_size),
        GROUP_RANK=str(program.group_rank),
        ROLE_RANK=str(where.rank),
        ROLE_WORLD_SIZE=str(program.world_size),
        MASTER_ADDR=program.master_addr,
        MASTER_PORT=str(program.master_port),
        TORCHELASTIC_RESTART_COUNT=str(program.generation),
        TORCHELASTIC_RUN_ID=command.job,
        METRICS_FILE=str(dirs.metrics_file(worker.worker_id)),
    )
    if config.device == "cuda":
        # torchrun's scripts pick cuda:LOCAL_RANK: the command's slots, in order.
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible(config.gpus, program_slots(command, worker))
    return env


def edl_options(
    config: AgentConfig,
    command: StartWorkers,
    worker: WorkerSlot,
    dirs: JobDirs,
    redis_url: str,
    store_url: str | None = None,
) -> WorkerOptions:
    """The elastic runtime's options of one process, as ``worker_argv`` gives a built-in's.

    ``store_url``: the job's store door (``workers.agent.door``); without one
    (no store prefix) the runtime keeps its files in the job's node directory.
    """
    return WorkerOptions(
        job_id=command.job,
        worker_id=worker.worker_id,
        workload="",
        args={},
        batch_size=command.batch_size,
        recovery=command.recovery,
        store_url=store_url or str(dirs.root),
        checkpoint_every=command.checkpoint_every,
        checkpoint_keep=command.checkpoint_keep,
        checkpoint_minutes=command.checkpoint_minutes,
        checkpoint_min_seconds=command.checkpoint_min_seconds,
        initial_world=None if command.join else command.initial_world,
        # The process sees only its own GPU (CUDA_VISIBLE_DEVICES), as device 0.
        device="cuda:0" if config.device == "cuda" else "cpu",
        redis_url=redis_url,
        max_steps=command.max_steps,
        step_log=None,
        sync_timeout_s=command.sync_timeout_s or DEFAULT_SYNC_TIMEOUT_S,
        scale_lead_ms=DEFAULT_SCALE_LEAD_MS,
        drop_stragglers=False,
        slow_ms=0.0,
        rank=worker.rank,
    )


def edl_env(
    config: AgentConfig,
    command: StartWorkers,
    worker: WorkerSlot,
    dirs: JobDirs,
    redis_url: str,
    store_url: str | None = None,
    sdk_root: Path = REPO_ROOT,
) -> dict[str, str]:
    """The edl launcher's environment: ``EDL_OPTIONS`` (with the job's store door,
    ``store_url``), the SDK on ``PYTHONPATH``; no store credentials."""
    env = base_env(config, dirs, worker.worker_id, _program(command))
    options = edl_options(config, command, worker, dirs, redis_url, store_url)
    env[OPTIONS_ENV] = options_to_env(options)
    env["PYTHONPATH"] = str(sdk_root)
    if config.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible(config.gpus, program_slots(command, worker))
    return env


def with_environment(env: dict[str, str], environment: Environment) -> dict[str, str]:
    """A program's variables with its environment's packages first on ``PYTHONPATH`` (before
    the SDK, where it has it) and their console scripts first on ``PATH``."""
    sdk = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(environment.site), sdk) if p)
    env["PATH"] = os.pathsep.join((str(environment.scripts), env["PATH"]))
    return env


def program_mounts(
    config: AgentConfig,
    dirs: JobDirs,
    worker_id: str,
    code_dir: Path,
    *,
    repo_root: Path = REPO_ROOT,
    base_prefix: Path,
    home: Path = Path("/root"),
    devices: tuple[Path, ...] = (),
    environment: Path | None = None,
) -> Mounts:
    """What one worker's sandbox hides and binds back (``workers.agent.sandbox``): only the
    job's node directories are writable; its environment (if any) comes back read-only."""
    mounts = confined(
        config,
        code_dir,
        dirs.owned(worker_id),
        repo_root=repo_root,
        base_prefix=base_prefix,
        home=home,
        devices=devices,
        shm_dir=config.job_shm_dir(dirs.job),
    )
    if environment is None:
        return mounts
    return replace(mounts, read_only=(*mounts.read_only, environment))


def builtin_mounts(
    config: AgentConfig,
    command: StartWorkers,
    worker_id: str,
    *,
    repo_root: Path = REPO_ROOT,
    base_prefix: Path,
    home: Path = Path("/root"),
    devices: tuple[Path, ...] = (),
) -> Mounts:
    """A built-in workload's sandbox: a program's, with the repository's SDK as its code.

    Writable: its node-local store directory without a prefix (``builtin_store_dir``), its
    scratch HOME,
    and the agent's step-log directory when one is set (tests, benchmarks).
    """
    store = builtin_store_dir(config, command)
    writable = [JobDirs(config.job_dir(command.job)).scratch(worker_id)]
    if store is not None:
        writable.append(store)
    if config.step_log_dir is not None:
        writable.append(config.step_log_dir)
    return confined(
        config,
        repo_root / "workers",
        tuple(writable),
        repo_root=repo_root,
        base_prefix=base_prefix,
        home=home,
        devices=devices,
        shm_dir=config.job_shm_dir(command.job),
    )


def confined(
    config: AgentConfig,
    code_dir: Path,
    writable: tuple[Path, ...],
    *,
    repo_root: Path,
    base_prefix: Path,
    home: Path,
    devices: tuple[Path, ...],
    shm_dir: Path,
) -> Mounts:
    """The sandbox every training process gets: the host read-only, the portal's data,
    the repository, the store and other bundles hidden; its code, the venv and the SDK
    read-only; ``writable`` bound back read-write."""
    venv = venv_dir(config.python)
    real_venv = venv.resolve()
    python_home = base_prefix.resolve()
    extra_files = tuple(path for path in config.sandbox.hide if path.is_file())
    hide = {repo_root, config.data_dir, home, *set(config.sandbox.hide) - set(extra_files)}
    environments = config.environment_settings().root
    if environments.is_dir():  # every job's environments: only the program's own comes back
        hide.add(environments)
    hide.update(path for path in HIDDEN_SYSTEM_DIRS if path.is_dir() and not path.is_symlink())
    cache_root = code_dir.parent  # the other bundles unpacked next to this one
    if cache_root != Path("/") and not any(
        p == cache_root or cache_root in p.parents for p in (venv, real_venv, python_home)
    ):
        hide.add(cache_root)
    if real_venv.parent != repo_root and (real_venv.parent / "pyproject.toml").exists():
        hide.add(real_venv.parent)  # the venv is another checkout's: hide that repository too
    if config.sandbox.database_file is not None:
        hide.add(config.sandbox.database_file.parent)
    store_root = local_store_dir(config.artifact_url)
    if store_root is not None:
        hide.add(store_root)  # every tenant's objects: only the job's own prefix comes back
    read_only = {
        venv,
        real_venv,
        python_home,
        code_dir,
        *(repo_root / name for name in SDK_PACKAGES),
    }
    return Mounts(
        hide=tuple(sorted(hide)),
        read_only=tuple(sorted(read_only)),
        writable=writable,
        devices=devices if config.device == "cuda" else (),
        masked_files=MASKED_FILES + extra_files,  # a file cannot take a tmpfs: /dev/null it
        tmp_bytes=config.sandbox.tmp_mb * 1024 * 1024,
        shm_dir=shm_dir,
    )


def _program(command: StartWorkers) -> Program:
    if command.program is None:
        raise ValueError(f"start_workers {command.command_id} has no program")
    return command.program
