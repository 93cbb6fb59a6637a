"""Reading the cluster out of the database: the allocator state and the policy's snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import BooleanField, ExpressionWrapper, Max, Q

from control.assembly import JobRow, PolicyInput, TenantRow, assemble_snapshot
from control.gpu_speeds import gpu_type_speeds
from fabric.allocator import Allocation, VClosAllocator
from fabric.topology import FabricSpec
from inventory.models import Fabric, Server, ServerState
from inventory.services import suspect_in_effect
from jobs.agent_commands import GpuHome, runtime_job_name
from jobs.choices import ACTIVE_STATES, JobKind, JobState
from jobs.models import Job, JobEvent, JobGpu
from jobs.progress import seconds_left, total_steps
from scheduler.gpu_types import Labels, split_by_type
from scheduler.pipeline import Candidates, Waits
from scheduler.priority import AGED_CEILING, priority_class
from scheduler.types import Gpu as GpuView
from scheduler.types import GpuState, ServerCapacity

# The states the per-job loops compare with, looked up once (an enum member's look-up on
# its class costs more than the comparison, 10,000 times a tick at 10,000 jobs).
_RUNNING, _SCALING = JobState.RUNNING, JobState.SCALING


@dataclass(frozen=True)
class ClusterState:
    """What one tick knows about the cluster (read inside its transaction)."""

    spec: FabricSpec
    homes: dict[int, GpuHome]
    schedulable: frozenset[int]
    holders: dict[int, int]  # gpu index -> job id
    holdings: dict[int, list[int]]  # job id -> its GPUs in rank order
    draining: frozenset[int]
    # Schedulable but in a straggler's cool-down: no new placement or scale-out lands there
    # (a job on one keeps it, so it is not "lost" either).
    suspect: frozenset[int] = frozenset()
    # Of every queued/running/scaling job, when the kept state has them (None: ask the
    # database): the later of its first start and its last progress report (None if
    # neither), for reconcile; when its run-time limit ends, for jobs that have one.
    marks: Mapping[int, datetime | None] | None = None
    deadlines: Mapping[int, datetime] | None = None
    # The fabric's GPUs neither schedulable nor draining (their servers down or gone), when
    # the kept state has them (None: :func:`down_gpus` works them out).
    down: frozenset[int] | None = None
    # Each GPU's type (index -> type slug) and each labelled server's labels (global server
    # id -> sorted pairs): what a typed pass reads (``scheduler.gpu_types``).
    gpu_types: Mapping[int, str] = field(default_factory=dict)
    server_labels: Mapping[int, Labels] = field(default_factory=dict)
    # Each server's CPU cores and host memory where known (global server id -> capacity):
    # what binding packs jobs' per-GPU requests into (``scheduler.packing``).
    server_capacity: Mapping[int, ServerCapacity] = field(default_factory=dict)

    @property
    def mixed(self) -> bool:
        """Whether its GPUs are of several types."""
        return len(set(self.gpu_types.values())) > 1


@dataclass(frozen=True, slots=True)
class ServerRow:
    """What the tick needs of a server: its name, position, state, whether it ever beat.

    ``suspect``: the global ids of its GPUs in a straggler's cool-down now.  Part
    of the row so that the kept state sees a new mark, a cleared one and one that
    lapsed the way it sees any server change.  ``gpu_type`` and ``labels`` (sorted
    pairs): what a job's type and node selector are matched against.
    """

    node: str
    leaf: int
    slot: int
    state: str
    beating: bool
    suspect: tuple[int, ...] = ()
    gpu_type: str = ""
    labels: Labels = ()
    cpu_cores: int = 0
    memory_mib: int = 0


def label_pairs(labels: object) -> Labels:
    """A server's labels (a JSON object) as sorted pairs; anything else: none."""
    return tuple(sorted(labels.items())) if isinstance(labels, dict) else ()


def read_servers() -> list[ServerRow]:
    """Every server, by position (heartbeat times left out: only their presence matters).

    The presence is asked of the database (``IS NOT NULL``): the times would
    change at every heartbeat, and parsing thousands of them costs more than
    the query. The GPUs of each in a straggler's cool-down come from one more query.
    """
    suspect: dict[str, list[int]] = {}
    for node, index in suspect_in_effect().order_by("index").values_list("server__node", "index"):
        suspect.setdefault(node, []).append(index)
    beating = ExpressionWrapper(Q(last_heartbeat__isnull=False), output_field=BooleanField())
    return [
        ServerRow(
            node,
            leaf,
            slot,
            state,
            beating,
            tuple(suspect.get(node, ())),
            gpu_type,
            label_pairs(labels),
            cpu_cores,
            memory_mib,
        )
        for node, leaf, slot, state, beating, gpu_type, labels, cpu_cores, memory_mib in (
            Server.objects.order_by("leaf", "slot")
            .annotate(beating=beating)
            .values_list(
                "node",
                "leaf",
                "slot",
                "state",
                "beating",
                "gpu_type",
                "labels",
                "cpu_cores",
                "memory_mib",
            )
        )
    ]


@dataclass(frozen=True)
class ServerLayout:
    """Where every GPU lives and which are schedulable, draining or suspect, from the server rows."""

    homes: dict[int, GpuHome]
    schedulable: frozenset[int]
    draining: frozenset[int]
    suspect: frozenset[int] = frozenset()
    gpu_types: Mapping[int, str] = field(default_factory=dict)
    server_labels: Mapping[int, Labels] = field(default_factory=dict)
    server_capacity: Mapping[int, ServerCapacity] = field(default_factory=dict)


def server_layout(spec: FabricSpec, servers: Iterable[ServerRow]) -> ServerLayout:
    """Lay out ``servers`` on the fabric's GPU numbering.

    GPU ids follow from each server's position, so this needs the servers, not
    every GPU row.
    """
    homes: dict[int, GpuHome] = {}
    schedulable: set[int] = set()
    draining: set[int] = set()
    suspect: set[int] = set()
    gpu_types: dict[int, str] = {}
    server_labels: dict[int, Labels] = {}
    server_capacity: dict[int, ServerCapacity] = {}
    for server in servers:
        suspect.update(server.suspect)
        first = server.leaf * spec.gpus_per_leaf + server.slot * spec.gpus_per_server
        indices = range(first, first + spec.gpus_per_server)
        for local, index in enumerate(indices):
            homes[index] = GpuHome(node=server.node, local=local)
            gpu_types[index] = server.gpu_type
        if server.labels:
            server_labels[spec.server_of(first)] = server.labels
        if server.cpu_cores or server.memory_mib:
            server_capacity[spec.server_of(first)] = ServerCapacity(
                server.cpu_cores, server.memory_mib
            )
        if server.state == ServerState.UP and server.beating:
            schedulable.update(indices)
        elif server.state == ServerState.DRAINING:
            draining.update(indices)
    return ServerLayout(
        homes,
        frozenset(schedulable),
        frozenset(draining),
        frozenset(suspect),
        gpu_types,
        server_labels,
        server_capacity,
    )


def read_cluster() -> ClusterState | None:
    """The fabric, where every GPU lives, which are schedulable now, who holds what."""
    fabric = Fabric.objects.filter(pk=1).first()
    if fabric is None:
        return None
    spec = fabric.spec()
    layout = server_layout(spec, read_servers())
    holders: dict[int, int] = {}
    holdings: dict[int, list[int]] = {}
    for job_id, index in JobGpu.objects.order_by("job_id", "rank").values_list(
        "job_id", "gpu__index"
    ):
        holders[index] = job_id
        holdings.setdefault(job_id, []).append(index)
    return ClusterState(
        spec=spec,
        homes=layout.homes,
        schedulable=layout.schedulable,
        holders=holders,
        holdings=holdings,
        draining=layout.draining,
        suspect=layout.suspect,
        gpu_types=layout.gpu_types,
        server_labels=layout.server_labels,
        server_capacity=layout.server_capacity,
    )


def _held_shape(data: dict[str, Any]) -> Allocation:
    """What the allocator's state needs of a persisted allocation: GPUs, leaves, uplinks.

    Spines, links and routes follow from those and are skipped: this runs for
    every running job on every tick.
    """
    return Allocation(
        job_id=data["job"],
        gpus=tuple(data["gpus"]),
        leaves=tuple(data["leaves"]),
        uplinks=tuple(data.get("uplinks", ())),
    )


def held_allocation(
    job_id: int, data: dict[str, Any] | None, cluster: ClusterState
) -> Allocation | None:
    """What the allocator must reserve for an active job: its persisted shape, else its GPUs."""
    if data:
        return _held_shape(data)
    if gpus := tuple(cluster.holdings.get(job_id, ())):
        # held GPUs without a recorded shape: reserve them as they are
        leaves = tuple(sorted({cluster.spec.leaf_of(g) for g in gpus}))
        return Allocation(runtime_job_name(job_id), gpus, leaves)
    return None


def down_gpus(cluster: ClusterState) -> frozenset[int]:
    """The fabric's GPUs that are neither schedulable nor draining: their servers are down,
    or gone (the jobs holding them lost them)."""
    if cluster.down is not None:
        return cluster.down
    return unusable_gpus(cluster.spec, cluster.schedulable, cluster.draining)


def unusable_gpus(
    spec: FabricSpec, schedulable: frozenset[int], draining: frozenset[int]
) -> frozenset[int]:
    """The fabric's GPUs in neither ``schedulable`` nor ``draining`` (:func:`down_gpus`)."""
    usable = schedulable | draining
    return frozenset(g for g in range(spec.total_gpus) if g not in usable)


def blocked_gpus(cluster: ClusterState) -> frozenset[int]:
    """GPUs the allocator must not hand out: every one that is not schedulable now, or suspect.

    Held GPUs of draining servers are blocked too: a job released there lands elsewhere.
    A held suspect GPU stays its job's (the allocator keeps what a job holds); it is
    blocked for the next placement once released.
    """
    return frozenset(
        g
        for g in range(cluster.spec.total_gpus)
        if g not in cluster.schedulable or g in cluster.suspect
    )


def load_allocator(cluster: ClusterState) -> VClosAllocator:
    """A vClos allocator holding every running job's allocation; other GPUs blocked as needed."""
    allocator = VClosAllocator(cluster.spec)
    allocations = []
    for job_id, data in Job.objects.filter(state__in=ACTIVE_STATES).values_list("id", "allocation"):
        if (allocation := held_allocation(job_id, data, cluster)) is not None:
            allocations.append(allocation)
    allocator.restore(allocations)
    allocator.set_unavailable(sorted(blocked_gpus(cluster)))
    return allocator


def last_state_changes(job_ids: set[int]) -> dict[int, datetime]:
    """When each job last started, was stopped or was requeued (its latest state event).

    Class ageing measures a job's wait from there; only jobs that can age (the
    low class) are asked for, in one query.
    """
    if not job_ids:
        return {}
    rows = (
        JobEvent.objects.filter(job_id__in=job_ids)
        .exclude(to_state="")
        .values("job_id")
        .annotate(last=Max("at"))
        .values_list("job_id", "last")
    )
    return dict(rows)


def finishing_jobs(job_ids: set[int]) -> set[int]:
    """Which of these running jobs end within ``SCALE_OUT_MIN_SECONDS_LEFT`` at their rate.

    Asked only for running jobs that could still grow, in one query, so the
    tick does not read every job's arguments.
    """
    if not job_ids:
        return set()
    rows = Job.objects.filter(pk__in=job_ids).values_list(
        "pk", "workload", "args", "batch_size", "step", "samples_per_s"
    )
    return {pk for pk, *progress in rows if finishing(*progress)}


def finishing(
    workload: str, args: Any, batch_size: int, step: int, samples_per_s: float | None
) -> bool:
    """Whether a running job ends within ``SCALE_OUT_MIN_SECONDS_LEFT`` at its measured rate.

    A scale-out takes seconds (a newcomer starts, the state is broadcast): one
    decided just before the last step makes a worker join a job that has ended.
    Programs do not say their length, so only built-in workloads are held back.
    """
    total = total_steps(workload, args if isinstance(args, dict) else {}, batch_size)
    left = seconds_left(total, step, batch_size, samples_per_s)
    return left is not None and left < settings.SCALE_OUT_MIN_SECONDS_LEFT


class AssembledHoldBack:
    """Step 1 of the tick's scheduling pass (``scheduler.pipeline.HoldBack``).

    The snapshot assembly applies it, where the rows are (:func:`assemble_snapshot`:
    scheduler.quota's hold-back rule, the switching and profiling jobs set aside);
    this step hands the pass its candidates, and why each held-back job waits.
    """

    __slots__ = ()

    def hold_back(self, state: PolicyInput) -> tuple[Candidates, Waits]:
        """The assembled snapshot's candidates and the held-back jobs' waits (by name)."""
        waits = {runtime_job_name(job): reason for job, reason in state.held_back.items()}
        split = split_by_type(state.snapshot)  # None on today's untyped snapshots
        if split is not None and split.waits:  # never satisfiable: the pass leaves them out
            waits = {**split.waits, **waits}
        return Candidates(state.snapshot, state.book, state.blocked), waits


SNAPSHOT_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.SCALING)
"""The jobs a snapshot describes (those the policy may decide on, and those it must leave)."""

JOB_ROW_FIELDS = (
    "id",
    "state",
    "parallelism",
    "tenant_id",
    "submitted_at",
    "gpus",
    "min_gpus",
    "max_gpus",
    "attained_gpu_seconds",
    "priority",
    "throughput_curve",
    "measured_curve",
    "profile_state",
    "sched_weight",
    "gpu_types",
    "node_selector",
    "kind",
    "cpus_per_gpu",
    "mem_per_gpu_mib",
    "workload",
    "ran_on_type",
)
TENANT_ROW_FIELDS = ("slug", "gpu_quota", "profile_jobs", "priority_weight", "gpu_type_quota")


def _curve(data: Any) -> dict[int, float]:
    return {int(k): float(v) for k, v in (data or {}).items()}


def job_row(values: Mapping[str, Any]) -> JobRow:
    """A :class:`JobRow` from a ``values()`` dict of :data:`JOB_ROW_FIELDS`."""
    return JobRow(
        id=values["id"],
        state=values["state"],
        parallelism=values["parallelism"],
        tenant_id=values["tenant_id"],
        submitted_at=values["submitted_at"],
        gpus=values["gpus"],
        min_gpus=values["min_gpus"],
        max_gpus=values["max_gpus"],
        attained_gpu_seconds=values["attained_gpu_seconds"],
        priority=values["priority"],
        profiled=_curve(values["throughput_curve"]),
        measured=_curve(values["measured_curve"]),
        profile_state=values["profile_state"],
        weight=values["sched_weight"],
        gpu_types=tuple(values["gpu_types"] or ()),
        selector=label_pairs(values["node_selector"]),
        interactive=values["kind"] == JobKind.SESSION,
        cpus_per_gpu=values["cpus_per_gpu"],
        mem_per_gpu_mib=values["mem_per_gpu_mib"],
        workload=values["workload"],
        ran_on_type=values["ran_on_type"],
    )


def gpu_view(cluster: ClusterState, index: int) -> GpuView:
    """How the policy sees GPU ``index``: busy (and whose), free, or down."""
    holder = cluster.holders.get(index)
    if holder is not None:
        state, job_name = GpuState.BUSY, runtime_job_name(holder)
    elif index in cluster.schedulable and index not in cluster.suspect:
        state, job_name = GpuState.FREE, None
    else:
        state, job_name = GpuState.DOWN, None
    return GpuView(
        id=index,
        server=cluster.spec.server_of(index),
        leaf=cluster.spec.leaf_of(index),
        state=state,
        job=job_name,
        gpu_type=cluster.gpu_types.get(index, ""),
    )


def growing_jobs(rows: Iterable[JobRow], holdings: Mapping[int, list[int]]) -> set[int]:
    """Running jobs that could still grow (the ones whose end must be checked)."""
    held = holdings.get
    return {
        row.id for row in rows if row.state == _RUNNING and row.max_gpus > len(held(row.id, ()))
    }


def timed_jobs(rows: Iterable[JobRow]) -> set[int]:
    """The jobs whose last state change the tick needs, asked for in one query.

    Jobs of the low class, which age (their wait counts from there), and jobs in
    ``scaling``, whose switch the watchdog times (``control.switch_watchdog``).
    """
    return {
        row.id
        for row in rows
        if row.state == _SCALING or priority_class(row.priority) > AGED_CEILING
    }


def build_snapshot(
    cluster: ClusterState, now: datetime, *, epoch: float | None = None
) -> PolicyInput:
    """The policy's view, read from the database in full (the reference path).

    Jobs in the middle of a membership switch (``scaling``) are left out: the
    policy decides on them again once the switch is done.  A queued job whose
    tenant has no quota left for its request is held back (quota rule).
    Returns the snapshot with what the tick needs next to it (``PolicyInput``).
    The incremental tick (``control.incremental``) keeps the same inputs
    between ticks and assembles them with the same :func:`assemble_snapshot`;
    ``epoch`` is the time base (:func:`assemble_snapshot`).
    """
    gpus = tuple(gpu_view(cluster, index) for index in sorted(cluster.homes))
    values = (
        Job.objects.filter(state__in=SNAPSHOT_STATES)
        .order_by("submitted_at", "id")
        .values(*JOB_ROW_FIELDS, *(f"tenant__{name}" for name in TENANT_ROW_FIELDS))
    )
    rows: list[JobRow] = []
    tenants: dict[int, TenantRow] = {}
    for value in values:
        rows.append(job_row(value))
        if value["tenant_id"] not in tenants:
            tenants[value["tenant_id"]] = TenantRow(
                *(value[f"tenant__{name}"] for name in TENANT_ROW_FIELDS)
            )
    about_to_end = finishing_jobs(growing_jobs(rows, cluster.holdings))
    since = last_state_changes(timed_jobs(rows))
    return assemble_snapshot(
        cluster,
        gpus,
        rows,
        tenants,
        about_to_end,
        since,
        now,
        epoch=epoch,
        server_capacity=cluster.server_capacity,
        type_speeds=gpu_type_speeds(),
    )
