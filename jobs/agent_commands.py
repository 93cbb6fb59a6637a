"""Agent commands for a job's membership change (pure: no ORM, no Celery).

A job's workers are named by the GPU they sit on (``w<gpu>``), so a change
from ``old`` to ``new`` GPUs is: joiners = new - old, leavers = old - new.

    only joiners            StartWorkers(join=True) on each node that hosts joiners
    only leavers            ScaleIn(leavers) to one node (the runtime is job-wide)
    both                    Migrate(leavers, joining=StartWorkers(join=True)) to the first
                            joiners' node, StartWorkers(join=True) to the other nodes
    start (old empty)       StartWorkers(initial_world=len(new)) on each node
    stop (new empty)        StopJob on each node that hosts workers

Every StartWorkers, ScaleIn and Migrate carries ``rank_order``: the workers
of ``new`` in its order, which is the allocation's rank order, so the runtime
orders the next generation by the new plan, survivors included (a survivor's
own ``--rank`` is the plan it started in).

A tenant's program (``JobLaunch.program``) rides in every StartWorkers.  A
``torchrun`` program cannot change size while it runs, so any change with
both ``old`` and ``new`` is stop-resume: StopJob on the old nodes (SIGTERM,
then the grace period), StartWorkers of the next run on the new nodes (the
agents start it once the old processes have exited); ranks follow the order
of ``new``, which is the allocation's order.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.protocol import (
    Command,
    Migrate,
    Program,
    ScaleIn,
    StartWorkers,
    StopJob,
    WorkerSlot,
)

JOB_NAME_PREFIX = "job-"


def runtime_job_name(job_id: int) -> str:
    """The job's name in the runtime and the agent protocol."""
    return f"{JOB_NAME_PREFIX}{job_id}"


def job_id_from_name(name: str) -> int | None:
    """Inverse of :func:`runtime_job_name`; None for names that are not ours."""
    if not name.startswith(JOB_NAME_PREFIX):
        return None
    digits = name[len(JOB_NAME_PREFIX) :]
    return int(digits) if digits.isdigit() else None


def worker_id(gpu: int) -> str:
    """The worker that runs on GPU ``gpu``."""
    return f"w{gpu}"


def gpu_of_worker(name: str) -> int | None:
    """Inverse of :func:`worker_id`; None for names that are not ours."""
    digits = name[1:] if name.startswith("w") else ""
    return int(digits) if digits.isdigit() else None


def leaving_workers(command: Command) -> tuple[str, ...]:
    """The workers a command asks to leave (they may sit on other nodes than its own)."""
    if isinstance(command, ScaleIn):
        return command.worker_ids
    if isinstance(command, Migrate):
        return command.leaving
    return ()


@dataclass(frozen=True)
class ProgramLaunch:
    """A tenant's program: its bundle, entrypoint argv, launcher and variables.

    ``generation`` is the run the next start belongs to (torchrun), ``master_port``
    the port rank 0 listens on, ``grace_seconds`` how long a stopped torchrun
    program has between SIGTERM and SIGKILL.  ``environment`` is the job's own
    Python dependencies as stored (``workers.environment``; empty: the node's
    base layer), which the agent builds before it starts the program.
    ``home_prefix`` and ``home_quota_mib``: a session's persistent home in the store
    and its quota (``jobs.sessions``), restored into its lab's HOME and synced back at
    stop; empty for a batch job.
    """

    code: str
    code_path: str
    entrypoint: tuple[str, ...]
    launcher: str
    env: Mapping[str, str]
    generation: int
    master_port: int
    grace_seconds: float
    environment: Mapping[str, Any] = field(default_factory=dict)
    home_prefix: str = ""
    home_quota_mib: int = 0

    @property
    def restarts_to_resize(self) -> bool:
        """Whether a change of GPUs stops the program and starts it again (torchrun)."""
        return self.launcher == "torchrun"


@dataclass(frozen=True)
class JobLaunch:
    """What every StartWorkers of a job carries: a built-in workload, or a program."""

    job_id: int
    workload: str
    args: Mapping[str, Any]
    batch_size: int
    recovery: str
    checkpoint_every: int
    program: ProgramLaunch | None = None
    store_prefix: str | None = None
    """The job's prefix in the artifact store (``workers.artifacts.job_prefix``)."""
    checkpoint_keep: int = 2
    checkpoint_min_seconds: float = 0.0


@dataclass(frozen=True)
class GpuHome:
    """Where a GPU lives: its server's agent node, its device index there, the node's address."""

    node: str
    local: int
    address: str = "127.0.0.1"


def _command_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _by_node(gpus: Sequence[int], homes: Mapping[int, GpuHome]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for gpu in gpus:
        grouped.setdefault(homes[gpu].node, []).append(gpu)
    return grouped


def _program(
    program: ProgramLaunch, node: str, everyone: Sequence[int], homes: Mapping[int, GpuHome]
) -> Program:
    nodes = list(dict.fromkeys(homes[g].node for g in everyone))  # in rank order
    return Program(
        code=program.code,
        code_path=program.code_path,
        entrypoint=program.entrypoint,
        launcher=program.launcher,  # type: ignore[arg-type]
        env=dict(program.env),
        generation=program.generation,
        world_size=len(everyone),
        group_rank=nodes.index(node),
        master_addr=homes[everyone[0]].address,
        master_node=homes[everyone[0]].node,
        master_port=program.master_port,
        environment=dict(program.environment),
        home_prefix=program.home_prefix,
        home_quota_mib=program.home_quota_mib,
    )


def _start(
    launch: JobLaunch,
    gpus: Sequence[int],
    homes: Mapping[int, GpuHome],
    *,
    join: bool,
    initial_world: int | None,
    everyone: Sequence[int],
) -> StartWorkers:
    """Start ``gpus`` (all on one node) of a job that will run on ``everyone``."""
    rank = {g: r for r, g in enumerate(everyone)}
    program = launch.program
    # A torchrun program has no elastic runtime to order: its ranks are its RANK variables.
    elastic = program is None or not program.restarts_to_resize
    return StartWorkers(
        job=runtime_job_name(launch.job_id),
        command_id=_command_id("start"),
        workload="" if program else launch.workload,
        args={} if program else dict(launch.args),
        batch_size=launch.batch_size,
        recovery=launch.recovery,  # type: ignore[arg-type]
        checkpoint_every=launch.checkpoint_every,
        workers=tuple(
            WorkerSlot(worker_id=worker_id(g), slot=homes[g].local, rank=rank[g]) for g in gpus
        ),
        initial_world=initial_world,
        join=join,
        program=_program(program, homes[gpus[0]].node, everyone, homes) if program else None,
        store_prefix=launch.store_prefix,
        checkpoint_keep=launch.checkpoint_keep,
        checkpoint_min_seconds=launch.checkpoint_min_seconds,
        rank_order=rank_order(everyone) if elastic else (),
    )


def rank_order(gpus: Sequence[int]) -> tuple[str, ...]:
    """The workers of ``gpus`` (in the allocation's rank order), as the runtime names them."""
    return tuple(worker_id(g) for g in gpus)


def _stops(
    launch: JobLaunch, gpus: Sequence[int], homes: Mapping[int, GpuHome], reason: str
) -> list[tuple[str, Command]]:
    program = launch.program
    grace: dict[str, float] = {}
    # TORCHRUN_GRACE_SECONDS is torchrun's SIGTERM-to-SIGKILL grace; edl programs stop as
    # the built-in workloads do (the runtime is asked first, with StopJob's default grace).
    if program is not None and program.restarts_to_resize:
        grace["grace_seconds"] = program.grace_seconds
    name = runtime_job_name(launch.job_id)
    return [
        (node, StopJob(job=name, command_id=_command_id("stop"), reason=reason[:200], **grace))
        for node in _by_node(gpus, homes)
    ]


def _starts(
    launch: JobLaunch, new: Sequence[int], homes: Mapping[int, GpuHome]
) -> list[tuple[str, Command]]:
    return [
        (node, _start(launch, gpus, homes, join=False, initial_world=len(new), everyone=new))
        for node, gpus in _by_node(new, homes).items()
    ]


def membership_commands(
    launch: JobLaunch,
    old: Sequence[int],
    new: Sequence[int],
    homes: Mapping[int, GpuHome],
    *,
    reason: str,
) -> list[tuple[str, Command]]:
    """The (node, command) pairs that move a job from GPUs ``old`` to ``new``.

    ``new`` is in the allocation's rank order (``Allocation.gpus``); the
    commands carry that order (``rank_order``) for the runtime.
    """
    name = runtime_job_name(launch.job_id)
    joiners = [g for g in new if g not in set(old)]
    leavers = [g for g in old if g not in set(new)]
    if not new:
        return _stops(launch, old, homes, reason)
    if not old:
        return _starts(launch, new, homes)
    if launch.program is not None and launch.program.restarts_to_resize:
        return _stops(launch, old, homes, reason) + _starts(launch, new, homes)
    commands: list[tuple[str, Command]] = []
    joiner_nodes = list(_by_node(joiners, homes).items())
    if leavers and joiner_nodes:
        first_node, first_gpus = joiner_nodes[0]
        commands.append(
            (
                first_node,
                Migrate(
                    job=name,
                    command_id=_command_id("migrate"),
                    leaving=tuple(worker_id(g) for g in leavers),
                    joining=_start(
                        launch, first_gpus, homes, join=True, initial_world=None, everyone=new
                    ),
                    joiners=len(joiners),
                    reason=reason[:200],
                    rank_order=rank_order(new),
                ),
            )
        )
        joiner_nodes = joiner_nodes[1:]
    elif leavers:
        node = homes[leavers[0]].node
        commands.append(
            (
                node,
                ScaleIn(
                    job=name,
                    command_id=_command_id("scalein"),
                    worker_ids=tuple(worker_id(g) for g in leavers),
                    reason=reason[:200],
                    rank_order=rank_order(new),
                ),
            )
        )
    for node, gpus in joiner_nodes:
        commands.append(
            (node, _start(launch, gpus, homes, join=True, initial_world=None, everyone=new))
        )
    return commands
