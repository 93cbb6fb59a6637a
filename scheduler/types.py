"""The policy interface's plain data: a frozen cluster/job snapshot in, decisions out.

The control plane builds a :class:`Snapshot` from its database every tick and
applies the returned decisions; the simulator builds the same objects from its
own state.  Nothing here does I/O or keeps state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class GpuState(StrEnum):
    """What a GPU is doing right now."""

    FREE = "free"
    BUSY = "busy"
    DOWN = "down"


class JobState(StrEnum):
    """Where a job is in its life as the policy sees it."""

    QUEUED = "queued"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU slot: its global id, the server and leaf it hangs off, its state, and its type.

    ``gpu_type`` is a short name (``"a100-40g"``, ``"h100-80g"``); ``""`` (the
    default type) is today's clusters, where every GPU is alike.  A job never
    holds GPUs of two types (:mod:`scheduler.gpu_types`).
    """

    id: int
    server: int
    leaf: int
    state: GpuState = GpuState.FREE
    job: str | None = None
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class ServerCapacity:
    """A server's host CPU cores and memory (MiB), which its GPUs' jobs share.

    0 is "not known" and bounds nothing (a server registered by hand, before its
    agent reported).  A job's GPUs on the server take ``JobView.cpus_per_gpu`` and
    ``mem_per_gpu_mib`` each (:mod:`scheduler.packing`).
    """

    cpus: int = 0
    mem_mib: int = 0

    def __post_init__(self) -> None:
        for name in ("cpus", "mem_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"server capacity {name} must be a whole number >= 0, not {value!r}"
                )


@dataclass(frozen=True, slots=True)
class Cluster:
    """The GPUs of the cluster.

    ``fabric_spec`` (a ``fabric.topology.FabricSpec``) and ``allocations`` (the
    running jobs' ``fabric.allocator.Allocation`` objects) are optional; the
    vClos placement needs both.  ``server_labels`` holds each labelled server's
    labels as sorted ``(label, value)`` pairs (``pool=train``, ``rack=r12``), by
    server id; a job's ``selector`` is matched against them.  ``server_capacity``
    holds the CPU cores and host memory of each server that has them known, by
    server id (absent: unbounded); binding packs jobs' CPU and memory requests
    into them (:mod:`scheduler.packing`).
    """

    gpus: tuple[Gpu, ...]
    fabric_spec: Any = None
    allocations: tuple[Any, ...] = ()
    server_labels: Mapping[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    server_capacity: Mapping[int, ServerCapacity] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        """All GPUs that are not down."""
        return sum(1 for g in self.gpus if g.state is not GpuState.DOWN)

    def free_gpu_ids(self) -> tuple[int, ...]:
        """Ids of the GPUs free now, ascending."""
        return tuple(sorted(g.id for g in self.gpus if g.state is GpuState.FREE))

    @staticmethod
    def uniform(servers: int, gpus_per_server: int, servers_per_leaf: int = 0) -> Cluster:
        """A cluster of identical servers, all GPUs free; GPU ids run server by server."""
        per_leaf = servers_per_leaf or servers
        gpus = tuple(
            Gpu(id=s * gpus_per_server + k, server=s, leaf=s // per_leaf)
            for s in range(servers)
            for k in range(gpus_per_server)
        )
        return Cluster(gpus=gpus)

    @staticmethod
    def mixed(
        pools: tuple[tuple[str, int], ...], gpus_per_server: int, servers_per_leaf: int = 0
    ) -> Cluster:
        """A cluster of ``(gpu type, servers)`` pools in that order, all GPUs free; ids run
        server by server and leaves fill in order, so a leaf may hold two types."""
        servers = [name for name, count in pools for _ in range(count)]
        per_leaf = servers_per_leaf or len(servers) or 1
        gpus = tuple(
            Gpu(id=s * gpus_per_server + k, server=s, leaf=s // per_leaf, gpu_type=name)
            for s, name in enumerate(servers)
            for k in range(gpus_per_server)
        )
        return Cluster(gpus=gpus)


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as a policy sees it.

    ``attained_service`` is GPU-seconds already received; ``remaining_work`` is
    seconds still needed at the requested parallelism (an oracle only SRTF
    reads); ``throughput`` maps a GPU count to samples/s (the profile EDL's
    ``profile(min, max)`` would produce); ``queue_since`` is when the job last
    started, was preempted or changed queue (it orders jobs inside a queue).
    ``weight`` (finite, > 0; 1.0 by default) is how much its extra GPUs are
    worth to its owner: Elastic-Tiresias hands idle GPUs to heavier jobs first
    and reclaims extras from lighter ones first (:class:`scheduler.policies.elastic.WeightRule`
    says how); a sweep gives its promoted trials more.  No other phase reads it.
    ``gpu_types`` are the GPU types it accepts, preferred first (empty: any);
    ``selector`` the ``(label, value)`` pairs a server must carry to hold it
    (empty: any server).  Its whole allocation is of one type, elastic extras
    included (:mod:`scheduler.gpu_types`).  ``throughput_by_type``: its curve on
    each GPU type where it differs (a profile per model and type, or
    :func:`scheduler.throughput.curve` with the type's speed); a typed pass reads the
    curve of the type it runs or is routed to in place of ``throughput``.
    ``cpus_per_gpu`` and ``mem_per_gpu_mib`` are the host CPU cores and memory it needs
    beside each GPU (0: none asked); a server holds it only where they fit.
    ``interactive`` marks a session (a person at the keyboard): by default batch work of
    its own priority class never preempts it (``docs/scheduler.md``).
    """

    id: str
    submit_time: float
    requested_gpus: int
    tenant: str = ""
    min_gpus: int = 0
    max_gpus: int = 0
    gpus: tuple[int, ...] = ()
    attained_service: float = 0.0
    remaining_work: float | None = None
    state: JobState = JobState.QUEUED
    priority: int = 50
    queue_since: float | None = None
    throughput: Mapping[int, float] | None = None
    weight: float = 1.0
    gpu_types: tuple[str, ...] = ()
    selector: tuple[tuple[str, str], ...] = ()
    throughput_by_type: Mapping[str, Mapping[int, float]] | None = None
    cpus_per_gpu: int = 0
    mem_per_gpu_mib: int = 0
    interactive: bool = False

    def __post_init__(self) -> None:
        weight = self.weight
        if weight != 1.0 and not 0 < weight < float("inf"):
            raise ValueError(f"job {self.id}: weight must be a finite number > 0, not {weight!r}")

    @property
    def running(self) -> bool:
        """True while the job holds GPUs."""
        return self.state is JobState.RUNNING


@dataclass(frozen=True, slots=True)
class TenantShare:
    """A tenant's fair-share inputs: its weight and its decayed GPU-seconds held at snapshot time.

    Both must be finite and >= 0 (ValueError otherwise): a bad row from the
    database stops the tick with a clear message instead of a silent order.
    """

    weight: float
    usage: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("weight", self.weight), ("usage", self.usage)):
            if not 0 <= value < float("inf"):
                raise ValueError(f"tenant share {name} must be a finite number >= 0, not {value!r}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may read: the time (from an injected clock), the cluster, the jobs.

    ``tenants`` turns fair share on (see :mod:`scheduler.fairshare`); empty: off.
    """

    now: float
    cluster: Cluster
    jobs: tuple[JobView, ...] = field(default_factory=tuple)
    tenants: Mapping[str, TenantShare] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Start:
    """Start (or resume) a queued job on these GPUs, in rank order.

    ``base`` is the size the job may start on instead when no placement has
    room for ``len(gpus)`` now: its size without the idle GPUs an elastic
    policy added as extras (EDL starts it there and scales it out later).
    0, or ``len(gpus)`` itself: no smaller size; the start is all or nothing.
    """

    job: str
    gpus: tuple[int, ...]
    base: int = 0


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job and give back its GPUs; it keeps its progress and queues again."""

    job: str


@dataclass(frozen=True, slots=True)
class Scale:
    """Change a running job's GPUs to exactly this tuple (grow or shrink, stop-free in EDL)."""

    job: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a running job to these GPUs without changing its size (one communicator switch)."""

    job: str
    gpus: tuple[int, ...]


Decision = Start | Preempt | Scale | Migrate
