"""Agent commands for a job's membership change (pure: no ORM, no Celery).

A job's workers are named by the GPU they sit on (``w<gpu>``), so a change
from ``old`` to ``new`` GPUs is: joiners = new - old, leavers = old - new.

    only joiners            StartWorkers(join=True) on each node that hosts joiners
    only leavers            ScaleIn(leavers) to one node (the runtime is job-wide)
    both                    Migrate(leavers, joining=StartWorkers(join=True)) to the first
                            joiners' node, StartWorkers(join=True) to the other nodes
    start (old empty)       StartWorkers(initial_world=len(new)) on each node
    stop (new empty)        StopJob on each node that hosts workers
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.protocol import Command, Migrate, ScaleIn, StartWorkers, StopJob, WorkerSlot

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


@dataclass(frozen=True)
class JobLaunch:
    """What every StartWorkers of a job carries."""

    job_id: int
    workload: str
    args: Mapping[str, Any]
    batch_size: int
    recovery: str
    checkpoint_every: int


@dataclass(frozen=True)
class GpuHome:
    """Where a GPU lives: its server's agent node and its device index there."""

    node: str
    local: int


def _command_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _by_node(gpus: Sequence[int], homes: Mapping[int, GpuHome]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for gpu in gpus:
        grouped.setdefault(homes[gpu].node, []).append(gpu)
    return grouped


def _start(
    launch: JobLaunch,
    gpus: Sequence[int],
    homes: Mapping[int, GpuHome],
    *,
    join: bool,
    initial_world: int | None,
) -> StartWorkers:
    return StartWorkers(
        job=runtime_job_name(launch.job_id),
        command_id=_command_id("start"),
        workload=launch.workload,
        args=dict(launch.args),
        batch_size=launch.batch_size,
        recovery=launch.recovery,  # type: ignore[arg-type]
        checkpoint_every=launch.checkpoint_every,
        workers=tuple(WorkerSlot(worker_id=worker_id(g), slot=homes[g].local) for g in gpus),
        initial_world=initial_world,
        join=join,
    )


def membership_commands(
    launch: JobLaunch,
    old: Sequence[int],
    new: Sequence[int],
    homes: Mapping[int, GpuHome],
    *,
    reason: str,
) -> list[tuple[str, Command]]:
    """The (node, command) pairs that move a job from GPUs ``old`` to ``new``."""
    name = runtime_job_name(launch.job_id)
    joiners = [g for g in new if g not in set(old)]
    leavers = [g for g in old if g not in set(new)]
    if not new:
        return [
            (node, StopJob(job=name, command_id=_command_id("stop"), reason=reason[:200]))
            for node in _by_node(old, homes)
        ]
    if not old:
        return [
            (node, _start(launch, gpus, homes, join=False, initial_world=len(new)))
            for node, gpus in _by_node(new, homes).items()
        ]
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
                    joining=_start(launch, first_gpus, homes, join=True, initial_world=None),
                    joiners=len(joiners),
                    reason=reason[:200],
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
                ),
            )
        )
    for node, gpus in joiner_nodes:
        commands.append((node, _start(launch, gpus, homes, join=True, initial_world=None)))
    return commands
