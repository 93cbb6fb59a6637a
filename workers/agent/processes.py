"""The agent's process table: the training processes it runs and the stops it enforces.

A tenant program (``StartWorkers.program``) runs from its unpacked code
directory, which an injected ``resolve_code(program) -> Path`` provides (the
node's code cache), under the sandbox (``workers.agent.sandbox``) with its
limits (``workers.agent.limits``) and its launcher's environment
(``workers.agent.programs``).  A built-in workload (``python -m
workers.elastic.worker``) runs the same way, with the repository's SDK
packages as its code and its job's own Redis user, never the agent's.

Not thread-safe on its own: the ``Agent`` calls it under its one lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from workers.agent import limits, redis_acl, seccomp
from workers.agent.build_sandbox import SandboxedBuilds
from workers.agent.config import REPO_ROOT, AgentConfig, local_store_dir
from workers.agent.door import StoreDoors, default_root
from workers.agent.environments import Environment, EnvironmentCache, HostBuilds, requested
from workers.agent.gpus import cuda_visible, device_nodes
from workers.agent.isolation import NetworkIsolation
from workers.agent.lab import LabTokens
from workers.agent.lab_launch import hold_argv, lab_argv, lab_env
from workers.agent.launch import (
    log_tail,
    process_matches,
    same_process,
    spawn,
    worker_argv,
)
from workers.agent.mirror import CheckpointMirror
from workers.agent.programs import (
    JobDirs,
    base_env,
    builtin_env,
    builtin_mounts,
    builtin_owned,
    edl_env,
    job_dirs,
    placement,
    program_argv,
    program_mounts,
    program_slots,
    torchrun_env,
    with_environment,
)
from workers.agent.sandbox import (
    BUILDER_ENV,
    SETPRIV,
    Identity,
    Mounts,
    args_payload,
    bwrap_argv,
    bwrap_binary,
    env_args,
    hand_over,
    job_identity,
    memory_file,
    private_directory,
    refusal,
    sandbox_problem,
)
from workers.agent.store import AgentStore, StopRecord, WorkerRecord
from workers.agent.warm import WarmPool, enabled_for
from workers.artifacts import ArtifactStore
from workers.clock import Clock
from workers.lab_protocol import base_url_of
from workers.protocol import Program, RunningWorker, StartWorkers, WorkerSlot

ResolveCode = Callable[[Program], Path]
"""The unpacked, read-only code directory of a program's bundle (the node's code cache)."""


class ProgramUnavailable(RuntimeError):
    """A tenant program cannot start on this node (no code, no sandbox)."""


def no_code_cache(program: Program) -> Path:
    """The default ``ResolveCode``: this agent was given no code cache."""
    raise ProgramUnavailable(f"no code cache configured: cannot unpack bundle {program.code}")


log = logging.getLogger(__name__)

NO_RUNTIME = frozenset({"torchrun", "session"})
"""Launchers whose processes have no elastic runtime to ask, nor a job Redis user."""

RestoreHome = Callable[[str, str, Program, Path, "tuple[int, int] | None"], object]
"""(job, worker id, program, HOME, owner): a session's home restored before its lab starts."""

ChildKey = tuple[str, str]
"""(job, worker id)."""


@dataclass
class Child:
    """A training process: started by this agent (``popen``) or adopted after a restart."""

    record: WorkerRecord
    popen: subprocess.Popen[bytes] | None
    stop_signal_sent: float | None = None

    def poll(self, module: str) -> tuple[bool, int | None]:
        """(exited, exit code); the code is None for an adopted process."""
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None and self.record.sandboxed:
                code = program_exit_code(code)
            return code is not None, code
        return not is_alive(self.record, module), None

    def signal(self, signum: int) -> bool:
        """Signal the process's whole group (the worker and anything it started).

        A sandboxed program is not in bubblewrap's group (``--new-session``):
        SIGTERM goes to every process below bubblewrap but bubblewrap's own
        (so the program may end gracefully), SIGKILL to all of them and to
        every member of its pids cgroup.  False when there was nobody to
        signal yet (a sandbox still starting): the caller tries again.
        """
        if not self.record.sandboxed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.record.pid, signum)
            return True
        if signum == signal.SIGKILL:
            targets = [self.record.pid, *limits.descendants(self.record.pid)]
            targets += limits.members(self.cgroups().values())
        else:
            targets = [
                pid for pid in limits.descendants(self.record.pid) if _command_name(pid) != "bwrap"
            ]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return bool(targets)

    def cgroups(self) -> dict[str, Path]:
        """The worker's cgroups by controller (none for a built-in workload)."""
        return _cgroups(self.record)


def _cgroups(record: WorkerRecord) -> dict[str, Path]:
    return {c: Path(p) for c, p in (record.cgroups or {}).items()}


def program_exit_code(bwrap_code: int) -> int:
    """The program's exit status from bubblewrap's: ``128 + N`` means killed by signal N.

    Reported as ``-N``, like an unsandboxed process (a program that itself
    exits with 129-192 is taken for a signalled one).
    """
    if 128 < bwrap_code <= 128 + 64:
        return -(bwrap_code - 128)
    return bwrap_code


def is_alive(record: WorkerRecord, module: str) -> bool:
    """Whether the process of ``record`` still runs (pid not reused by another process)."""
    if record.start_ticks is not None:
        return same_process(record.pid, record.start_ticks)
    return process_matches(record.pid, record.job, record.worker_id, module)


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Exit:
    """A child that has exited: its record, its exit code (None: adopted), how it was ended.

    ``reason``: the sandbox limit that ended a program, when it can be told.
    """

    record: WorkerRecord
    code: int | None
    signalled: bool
    reason: str = ""


def running(record: WorkerRecord) -> RunningWorker:
    """The protocol's view of a process record."""
    return RunningWorker(
        job=record.job, worker_id=record.worker_id, slot=record.slot, pid=record.pid
    )


class ProcessTable:
    """Which training process runs in which slot, and which jobs are being stopped."""

    def __init__(
        self,
        config: AgentConfig,
        store: AgentStore,
        clock: Clock,
        resolve_code: ResolveCode = no_code_cache,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.resolve_code = resolve_code
        self.children: dict[ChildKey, Child] = {}
        self.stops: dict[str, StopRecord] = {}
        self.job_users: set[str] = set()
        """Jobs whose Redis user this agent created (deleted when the job ends here)."""
        self._leftover_cgroups: list[str] = []
        self.warm = WarmPool(config, enabled_for(config))
        """Warm worker processes of the idle slots (``AGENT_WARM_WORKERS=1``, SANDBOX=off;
        warm.py)."""
        self.isolation = NetworkIsolation(config, store.redis)
        """Each job's own network and doors out here (``SANDBOX_NETWORK=job``)."""
        self.doors = StoreDoors(default_root(), f"{config.data_dir}\0{config.node}")
        """Each job's door to its prefix of the artifact store (``workers.agent.door``)."""
        self.mirror = CheckpointMirror(config.mirror_limits, clock)
        """A torchrun job's node-local CHECKPOINT_DIR, mirrored to its store prefix."""
        self.environments = EnvironmentCache(
            config.environment_settings(),
            runner=SandboxedBuilds(config) if config.sandbox.mode == "on" else HostBuilds(),
        )
        """Tenants' own dependencies, built once per request (``workers.agent.environments``)."""
        self.restore_home: RestoreHome = lambda job, worker_id, program, home, owner: None
        """Fills a session's HOME from its persistent home (``program.home_prefix``) before
        its lab starts (the agent's ``LabHomes.restore``)."""
        store_root = local_store_dir(config.artifact_url)
        if store_root is not None:  # a sandbox hides it, so it must exist before the first
            store_root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ queries
    def has(self, job: str, worker_id: str) -> bool:
        """Whether ``worker_id`` of ``job`` runs here."""
        return (job, worker_id) in self.children

    def older(self, job: str, worker_id: str, generation: int | None) -> bool:
        """Whether ``worker_id`` of ``job`` runs here from a generation before ``generation``."""
        child = self.children.get((job, worker_id))
        if child is None or generation is None or child.record.generation is None:
            return False
        return child.record.generation < generation

    def slot_holders(self) -> dict[int, ChildKey]:
        """Busy slots and who holds them."""
        return {child.record.slot: key for key, child in self.children.items()}

    def of_job(self, job: str) -> list[Child]:
        """The processes of ``job`` on this node."""
        return [child for (j, _w), child in self.children.items() if j == job]

    def records(self) -> list[WorkerRecord]:
        """Every process record, ordered by (job, worker)."""
        return [child.record for _key, child in sorted(self.children.items())]

    def free_slots(self) -> tuple[int, ...]:
        """The slots no process holds."""
        busy = {child.record.slot for child in self.children.values()}
        return tuple(slot for slot in range(self.config.slots) if slot not in busy)

    def running_of(self, command: StartWorkers) -> tuple[RunningWorker, ...]:
        """Those workers of ``command`` that run here."""
        out = []
        for worker in command.workers:
            child = self.children.get((command.job, worker.worker_id))
            if child is not None:
                out.append(running(child.record))
        return tuple(out)

    # ------------------------------------------------------------------ changes
    def sandbox_refusal(self) -> str | None:
        """Why tenant programs cannot start here (None: they can); bwrap is probed once."""
        settings = self.config.sandbox
        if settings.mode == "off":
            return None
        problem = sandbox_problem(settings.bwrap)
        if problem is None and os.geteuid() == 0 and not os.access(SETPRIV, os.X_OK):
            problem = (
                f"{SETPRIV} is missing: a root agent needs it to run programs as their own uid"
            )
        return refusal(problem) if problem is not None else None

    def start(
        self, command: StartWorkers, worker: WorkerSlot, prepared: Environment | None = None
    ) -> WorkerRecord:
        """Start one training process; ``prepared``: its program's environment, when the
        start already made it ready (else it is found in the cache here).

        Raises OSError if it cannot start, ``ProgramUnavailable`` (or what
        ``resolve_code`` raises) if a program cannot, or a built-in cannot run
        in the sandbox.
        """
        if command.program is not None:
            self.warm.release(worker.slot)  # a program never runs in the agent's warm process
            return self._start_program(command, command.program, worker, prepared)
        return self._start_builtin(command, worker)

    def _job_redis_url(self, command: StartWorkers) -> str:
        """The URL of the job's own Redis user: with the password the control plane made it
        with (``redis_password``), else made here (an agent on the portal's user)."""
        job, password = command.job, command.redis_password
        if password is not None:
            url = redis_acl.url_for(self.config.redis_url, redis_acl.job_user(job), password)
        else:
            url = redis_acl.job_url(self.store.redis, self.config.redis_url, job)
        self.job_users.add(job)
        return self.isolation.redis_url(job, url, self._identity(job))

    def _store_door(self, command: StartWorkers) -> str | None:
        """The store URL of ``command``'s job: its door, opened here on first use (None: the
        command names no store prefix)."""
        if command.store_prefix is None:
            return None
        return self._open_door(command.job, command.store_prefix)

    def _open_door(self, job: str, store_prefix: str) -> str:
        url = self.config.job_store_url(job, store_prefix, None)
        return self.doors.open(job, url, self._owner(job))

    def _mirror_checkpoints(self, job: str, store_prefix: str) -> None:
        """Mirror ``job``'s CHECKPOINT_DIR here (pulled from its prefix before the first of
        its processes starts); a running mirror goes on, one finishing is waited for."""
        if self.mirror.mirrors(job) and not self.mirror.busy(job):
            return
        url = self.config.job_store_url(job, store_prefix, None)
        directory = JobDirs(self.config.job_dir(job)).checkpoints
        self.mirror.begin(job, lambda: ArtifactStore(url), directory, self._owner(job))

    def _owner(self, job: str) -> tuple[int, int] | None:
        """The (uid, gid) that ``job``'s sockets and pulled files belong to (None: the agent's)."""
        identity = self._identity(job)
        return (identity.uid, identity.gid) if identity is not None else None

    def _identity(self, job: str) -> Identity | None:
        """The host uid ``job``'s programs run as (None: the agent is not root)."""
        if os.geteuid() != 0:
            return None
        return job_identity(job, self.config.sandbox.uid_base, self.config.sandbox.uid_count)

    def _start_builtin(self, command: StartWorkers, worker: WorkerSlot) -> WorkerRecord:
        """A built-in workload runs as a tenant program does: the job's Redis user, a fixed
        environment, the sandbox and its limits; in a warm process only where SANDBOX=off."""
        self._refuse_unsandboxed()
        redis_url = self._job_redis_url(command)
        argv = worker_argv(self.config, command, worker, self._store_door(command))
        args = json.dumps(command.args, sort_keys=True)
        warm = self.warm.start(worker.slot, argv, redis_url, command.workload, args)
        if warm is not None:
            # its command line is the warm module's: adoption recognises it by start time
            record = self._remember(
                command,
                worker,
                warm.popen,
                warm.log_path,
                start_ticks=limits.start_ticks(warm.popen.pid),
                store_prefix=command.store_prefix,
            )
            log.info(
                "started worker %s of job %s in a warm process (pid %d)",
                worker.worker_id,
                command.job,
                warm.popen.pid,
            )
            return record
        env = builtin_env(self.config, command, worker.worker_id, redis_url)
        owned = builtin_owned(self.config, command, worker.worker_id, Path(env["HOME"]))
        return self._launch(
            command,
            worker,
            argv,
            env,
            cwd=REPO_ROOT,
            owned=owned,
            mounts=lambda: builtin_mounts(
                self.config,
                command,
                worker.worker_id,
                base_prefix=Path(sys.base_prefix),
                devices=device_nodes(self.config.gpus, [worker.slot]),
            ),
            generation=0,
            store_prefix=command.store_prefix,
        )

    def _start_program(
        self,
        command: StartWorkers,
        program: Program,
        worker: WorkerSlot,
        prepared: Environment | None = None,
    ) -> WorkerRecord:
        self._refuse_unsandboxed()
        code_dir = self.resolve_code(program)
        environment = prepared or self.environment(command.job, program, code_dir)
        dirs = job_dirs(self.config, command)
        dirs.create(worker.worker_id)
        if program.launcher == "session":
            return self._start_session(command, program, worker, code_dir, environment, dirs)
        if program.launcher == "edl":
            redis_url = self._job_redis_url(command)
            env = edl_env(self.config, command, worker, dirs, redis_url, self._store_door(command))
        else:
            env = torchrun_env(self.config, command, worker, dirs)
            if command.store_prefix is not None:
                self._mirror_checkpoints(command.job, command.store_prefix)
            env["MASTER_ADDR"] = self.isolation.master_addr(
                command.job, program.master_node, program.master_addr
            )
        if environment is not None:
            with_environment(env, environment)
        return self._launch(
            command,
            worker,
            program_argv(
                self.config.python,
                code_dir,
                program.entrypoint,
                environment.scripts if environment is not None else None,
            ),
            env,
            cwd=code_dir,
            mounts=lambda: program_mounts(
                self.config,
                dirs,
                worker.worker_id,
                code_dir,
                base_prefix=Path(sys.base_prefix),
                devices=device_nodes(self.config.gpus, program_slots(command, worker)),
                environment=environment.path if environment is not None else None,
            ),
            generation=program.generation,
            owned=dirs.owned(worker.worker_id),
            rank=placement(command, worker).rank,
            launcher=program.launcher,
            store_prefix=command.store_prefix,
            code=program.code,
            environment=environment.key if environment is not None else None,
        )

    def _start_session(
        self,
        command: StartWorkers,
        program: Program,
        worker: WorkerSlot,
        code_dir: Path,
        environment: Environment | None,
        dirs: JobDirs,
    ) -> WorkerRecord:
        """A session's worker (``workers.agent.lab_launch``): rank 0 runs JupyterLab in its
        HOME (restored from the user's persistent home first) with every GPU of the
        command; the others hold theirs.  Same sandbox, limits and filter as any program."""
        home = dirs.scratch(worker.worker_id)
        where = placement(command, worker)
        slots = [w.slot for w in command.workers] if where.rank == 0 else [worker.slot]
        env = base_env(self.config, dirs, worker.worker_id, program)
        if self.config.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible(self.config.gpus, slots)
        if environment is not None:
            with_environment(env, environment)
        if where.rank == 0:
            identity = self._identity(command.job)
            owner = (identity.uid, identity.gid) if identity is not None else None
            self.restore_home(command.job, worker.worker_id, program, home, owner)
            token = LabTokens(self.store.redis, self.config.node).issue(
                command.job, worker.worker_id
            )
            env.update(lab_env(home, token))
            argv = lab_argv(self.config.python, base_url_of(command.job), home)
        else:
            argv = hold_argv(self.config.python)
        return self._launch(
            command,
            worker,
            argv,
            env,
            cwd=home,
            mounts=lambda: program_mounts(
                self.config,
                dirs,
                worker.worker_id,
                code_dir,
                base_prefix=Path(sys.base_prefix),
                devices=device_nodes(self.config.gpus, slots),
                environment=environment.path if environment is not None else None,
            ),
            generation=program.generation,
            owned=dirs.owned(worker.worker_id),
            rank=where.rank,
            launcher=program.launcher,
            store_prefix=command.store_prefix,
            code=program.code,
            environment=environment.key if environment is not None else None,
        )

    def environment(
        self, job: str, program: Program, code_dir: Path, out: IO[str] | None = None
    ) -> Environment | None:
        """What ``program`` runs in beyond the node's base layer (None: nothing): built now
        in ``job``'s sandbox (its output to ``out``) or found in the cache.  None as well
        where the sandbox cannot run (the start refuses, saying why).  Raises
        EnvironmentFailed."""
        spec = requested(program.environment, code_dir)
        if spec.empty or self.sandbox_refusal() is not None:
            return None
        return self.environments.ensure(spec, out, job=job)

    def _remember(
        self,
        command: StartWorkers,
        worker: WorkerSlot,
        popen: subprocess.Popen[bytes],
        log_path: Path,
        **details: Any,
    ) -> WorkerRecord:
        """Keep the new process in the table and in the agent's store (for adoption)."""
        record = WorkerRecord(
            job=command.job,
            worker_id=worker.worker_id,
            slot=worker.slot,
            pid=popen.pid,
            log_path=str(log_path),
            started_at=self.clock.now(),
            **details,
        )
        self.children[(command.job, worker.worker_id)] = Child(record=record, popen=popen)
        self.store.save_worker(record)
        return record

    def _refuse_unsandboxed(self) -> None:
        refused = self.sandbox_refusal()
        if refused is not None:
            raise ProgramUnavailable(refused)

    def _launch(
        self,
        command: StartWorkers,
        worker: WorkerSlot,
        argv: list[str],
        env: dict[str, str],
        *,
        cwd: Path,
        mounts: Callable[[], Mounts],
        generation: int,
        owned: tuple[Path, ...],
        **details: Any,
    ) -> WorkerRecord:
        """Start ``argv`` in the sandbox (unless SANDBOX=off) with its limits; remember it.

        ``owned``: the paths the program writes, handed to its uid when it has
        one (a root agent's sandbox).  ``details``: what the record keeps beyond
        the process (a program's launcher, rank, store prefix); a built-in's
        record has none, and its
        ``generation`` (0) only names its cgroups.  The caller has refused an
        unsandboxed start (``_refuse_unsandboxed``).
        """
        settings = self.config.sandbox
        sandboxed = settings.mode == "on"
        name = f"portal-{self.config.node}-{command.job}-{worker.worker_id}-{generation}"
        cgroups = limits.create_cgroups(settings, name)
        preexec = limits.preexec(settings, cgroups, address_space=self.config.device == "cpu")
        log_path = self.config.log_path(command.job, worker.worker_id)
        try:
            if sandboxed:
                popen = self._spawn_sandboxed(
                    command.job, argv, env, cwd, mounts(), owned, log_path, preexec
                )
            else:
                log.warning(
                    "SANDBOX=off: worker %s of job %s runs unsandboxed",
                    worker.worker_id,
                    command.job,
                )
                popen = spawn(argv, env, log_path, cwd=cwd, preexec_fn=preexec)
        except BaseException:
            for path in cgroups.values():
                limits.remove_cgroup(path)
            raise
        if "launcher" in details:
            details["generation"] = generation
        record = self._remember(
            command,
            worker,
            popen,
            log_path,
            sandboxed=sandboxed,
            start_ticks=limits.start_ticks(popen.pid),
            cgroups={c: str(p) for c, p in cgroups.items()} or None,
            **details,
        )
        log.info(
            "started worker %s of job %s, %s (pid %d%s)",
            worker.worker_id,
            command.job,
            details.get("launcher") or f"built-in {command.workload}",
            popen.pid,
            ", sandboxed" if sandboxed else "",
        )
        return record

    def _spawn_sandboxed(
        self,
        job: str,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        mounts: Mounts,
        owned: tuple[Path, ...],
        log_path: Path,
        preexec: Callable[[], None],
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` under bubblewrap: bubblewrap with ``BUILDER_ENV`` only, the program's
        ``env`` through a memory file (``--args``), as the job's own uid under a root agent."""
        settings = self.config.sandbox
        identity = self._identity(job)
        env = {**env, **self.isolation.variables()}
        door = (self.doors.directory(job),) if self.doors.serves(job) else ()
        mounts = replace(
            mounts, read_only=(*mounts.read_only, *self.isolation.read_only(job), *door)
        )
        preexec, namespace_fd = self.isolation.joining(job, preexec)
        if mounts.shm_dir is not None:
            uids = (identity.uid,) if identity is not None else ()
            owned = (*owned, private_directory(mounts.shm_dir, uids))
        if identity is not None:
            hand_over(owned, identity)
        args_fd = memory_file("bwrap-args", args_payload(env_args(env)))
        rules = seccomp.filter_for()
        seccomp_fd = memory_file("bwrap-seccomp", rules) if rules is not None else None
        fds = (args_fd,) if seccomp_fd is None else (args_fd, seccomp_fd)
        try:
            full = bwrap_argv(
                settings.bwrap or bwrap_binary(),
                mounts,
                argv,
                cwd=cwd,
                die_with_parent=settings.die_with_agent,
                identity=identity,
                args_fd=args_fd,
                seccomp_fd=seccomp_fd,
            )
            return spawn(
                full,
                dict(BUILDER_ENV),
                log_path,
                cwd=cwd,
                preexec_fn=preexec,
                pass_fds=fds,
                program_env=env,
            )
        finally:
            for fd in fds if namespace_fd is None else (*fds, namespace_fd):
                os.close(fd)

    def adopt(self, record: WorkerRecord) -> bool:
        """Adopt a process a previous agent started; False (and forget it) if it is gone."""
        if is_alive(record, self.config.worker_module):
            if record.launcher not in NO_RUNTIME:  # an edl program or a built-in: the job's user
                self.job_users.add(record.job)
            if record.store_prefix is not None and record.launcher == "torchrun":
                self._mirror_checkpoints(record.job, record.store_prefix)
            elif record.store_prefix is not None:
                self._open_door(record.job, record.store_prefix)  # the old agent's closed
            if record.sandboxed:  # its namespace outlived the agent; its doors out did not
                own_redis = record.launcher not in NO_RUNTIME
                self.isolation.adopt(record.job, self._identity(record.job), own_redis)
            self.children[(record.job, record.worker_id)] = Child(record=record, popen=None)
            log.info(
                "adopted worker %s of job %s (pid %d)", record.worker_id, record.job, record.pid
            )
            return True
        self.store.drop_worker(record.job, record.worker_id)
        return False

    def stop(self, job: str, command_id: str, grace_seconds: float) -> None:
        """Remember that ``job`` stops here: its processes are signalled after the grace.

        A torchrun program has no runtime to ask: its processes get SIGTERM at
        once and SIGKILL after the grace (torchrun's own semantics); nor has a
        session (Jupyter shuts its kernels down on SIGTERM).
        """
        now = self.clock.now()
        if any(child.record.launcher in NO_RUNTIME for child in self.of_job(job)):
            record = StopRecord(command_id=command_id, deadline=now, kill_after=grace_seconds)
        else:
            record = StopRecord(command_id=command_id, deadline=now + grace_seconds)
        self.stops[job] = record
        self.store.save_stop(job, record)

    def reap(self) -> list[Exit]:
        """Forget the processes that exited; return them."""
        exits = []
        for key, child in list(self.children.items()):
            exited, code = child.poll(self.config.worker_module)
            if not exited:
                continue
            del self.children[key]
            self.store.drop_worker(child.record.job, child.record.worker_id)
            exits.append(
                Exit(
                    child.record,
                    code,
                    child.stop_signal_sent is not None,
                    self._diagnose(child.record, code),
                )
            )
        self._remove_cgroups()
        self.warm.fill(self.free_slots())
        return exits

    def _diagnose(self, record: WorkerRecord, code: int | None) -> str:
        if not (record.sandboxed or record.cgroups or record.launcher):
            return ""  # a built-in workload in a warm process: no sandbox limits
        tail = log_tail(record.log_path) if code != 0 else ""
        cgroups = _cgroups(record)
        reason = limits.exit_reason(self.config.sandbox, code, tail, cgroups)
        for pid in limits.members(cgroups.values()):  # nothing may outlive its worker
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._leftover_cgroups += [str(path) for path in cgroups.values()]
        return reason

    def _remove_cgroups(self, wait_seconds: float = 0.0) -> None:
        """Remove the cgroups of exited programs (retried while the last members die)."""
        deadline = self.clock.monotonic() + wait_seconds
        while True:
            for path in list(self._leftover_cgroups):
                limits.remove_cgroup(path)
                if not os.path.exists(path):
                    self._leftover_cgroups.remove(path)
            if not self._leftover_cgroups or self.clock.monotonic() >= deadline:
                return
            self.clock.sleep(0.05)

    def enforce_stops(self) -> None:
        """SIGTERM what is left of a stopping job after its grace, SIGKILL a while later."""
        now = self.clock.now()
        for job, stop in self.stops.items():
            if now < stop.deadline:
                continue
            kill_after = (
                stop.kill_after
                if stop.kill_after is not None
                else self.config.stop_kill_after_seconds
            )
            for child in self.of_job(job):
                if child.stop_signal_sent is None:
                    if child.signal(signal.SIGTERM):
                        child.stop_signal_sent = now
                        log.info(
                            "stop deadline passed: SIGTERM to worker %s of job %s",
                            child.record.worker_id,
                            job,
                        )
                elif now - child.stop_signal_sent > kill_after:
                    child.signal(signal.SIGKILL)

    def end_all(self) -> None:
        """SIGTERM every process, SIGKILL those still there after ``stop_kill_after_seconds``."""
        self.warm.close()
        children = list(self.children.values())
        for child in children:
            child.stop_signal_sent = self.clock.now()
            child.signal(signal.SIGTERM)
        deadline = self.clock.monotonic() + self.config.stop_kill_after_seconds
        while self.clock.monotonic() < deadline and any(
            not c.poll(self.config.worker_module)[0] for c in children
        ):
            self.clock.sleep(0.1)
        for child in children:
            if not child.poll(self.config.worker_module)[0]:
                child.signal(signal.SIGKILL)
                if child.popen is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.popen.wait(timeout=5)

    def release_job(self, job: str) -> None:
        """Remove what ``job`` held on this node beyond its files: its shared ``/dev/shm``,
        its network and Redis socket."""
        shutil.rmtree(self.config.job_shm_dir(job), ignore_errors=True)
        self.isolation.release(job)
        self.doors.close(job)

    def release(self, wait_seconds: float = 2.0) -> None:
        """Remove what exited programs left behind (their cgroups), waiting a little."""
        self._remove_cgroups(wait_seconds)
