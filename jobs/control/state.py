"""Reading the cluster out of the database: the allocator state and the policy's snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fabric.allocator import Allocation, VClosAllocator
from fabric.topology import FabricSpec
from jobs.choices import ACTIVE_STATES, JobState
from jobs.control.commands import GpuHome, runtime_job_name
from jobs.models import Job, JobGpu
from portal.models import Fabric, Gpu, ServerState
from scheduler.types import Cluster, GpuState, JobView, Snapshot
from scheduler.types import Gpu as GpuView
from scheduler.types import JobState as ViewState


@dataclass(frozen=True)
class ClusterState:
    """What one tick knows about the cluster (read inside its transaction)."""

    spec: FabricSpec
    homes: dict[int, GpuHome]
    schedulable: frozenset[int]
    holders: dict[int, int]  # gpu index -> job id
    draining: frozenset[int]


def read_cluster() -> ClusterState | None:
    """The fabric, where every GPU lives, which are schedulable now, who holds what."""
    fabric = Fabric.objects.filter(pk=1).first()
    if fabric is None:
        return None
    homes: dict[int, GpuHome] = {}
    schedulable: set[int] = set()
    draining: set[int] = set()
    rows = Gpu.objects.values_list(
        "index", "local", "server__node", "server__state", "server__last_heartbeat"
    )
    for index, local, node, state, heartbeat in rows:
        homes[index] = GpuHome(node=node, local=local)
        if state == ServerState.UP and heartbeat is not None:
            schedulable.add(index)
        elif state == ServerState.DRAINING:
            draining.add(index)
    holders = dict(JobGpu.objects.values_list("gpu__index", "job_id"))
    return ClusterState(
        spec=fabric.spec(),
        homes=homes,
        schedulable=frozenset(schedulable),
        holders=holders,
        draining=frozenset(draining),
    )


def job_gpus(job_id: int) -> tuple[int, ...]:
    """A job's GPUs in rank order."""
    return tuple(
        JobGpu.objects.filter(job_id=job_id).order_by("rank").values_list("gpu__index", flat=True)
    )


def load_allocator(cluster: ClusterState) -> VClosAllocator:
    """A vClos allocator holding every running job's allocation; other GPUs blocked as needed."""
    allocator = VClosAllocator(cluster.spec)
    allocations = []
    for job_id, data in Job.objects.filter(state__in=ACTIVE_STATES).values_list("id", "allocation"):
        if data:
            allocations.append(Allocation.from_dict(data))
        else:  # held without a recorded shape (placement 'consolidated'): reserve the GPUs
            gpus = job_gpus(job_id)
            if gpus:
                allocations.append(
                    Allocation(runtime_job_name(job_id), gpus, (cluster.spec.leaf_of(gpus[0]),))
                )
    allocator.restore(allocations)
    # Held GPUs of draining servers are blocked too: a job released there lands elsewhere.
    blocked = [g for g in range(cluster.spec.total_gpus) if g not in cluster.schedulable]
    allocator.set_unavailable(blocked)
    return allocator


def build_snapshot(cluster: ClusterState, now: datetime) -> tuple[Snapshot, dict[str, Job]]:
    """The policy's view: schedulable GPUs and the jobs it may decide on.

    Jobs in the middle of a membership switch (``scaling``) are left out: the
    policy decides on them again once the switch is done.  A queued job whose
    tenant has no quota left for its request is held back (quota rule).
    """
    gpus = []
    for index in sorted(cluster.homes):
        holder = cluster.holders.get(index)
        if holder is not None:
            state, job = GpuState.BUSY, runtime_job_name(holder)
        elif index in cluster.schedulable:
            state, job = GpuState.FREE, None
        else:
            state, job = GpuState.DOWN, None
        leaf = cluster.spec.leaf_of(index)
        gpus.append(
            GpuView(id=index, server=cluster.spec.server_of(index), leaf=leaf, state=state, job=job)
        )
    jobs = list(
        Job.objects.filter(state__in=(JobState.QUEUED, JobState.RUNNING))
        .select_related("tenant")
        .order_by("submitted_at", "id")
    )
    in_use: dict[int, int] = {}
    for job in Job.objects.filter(state__in=ACTIVE_STATES).values("tenant_id", "parallelism"):
        in_use[job["tenant_id"]] = in_use.get(job["tenant_id"], 0) + job["parallelism"]
    views: list[JobView] = []
    by_name: dict[str, Job] = {}
    epoch = now.timestamp()
    for job in jobs:
        name = runtime_job_name(job.pk)
        held = job_gpus(job.pk) if job.state == JobState.RUNNING else ()
        over_quota = in_use.get(job.tenant_id, 0) + job.min_gpus > job.tenant.gpu_quota
        if job.state == JobState.QUEUED and over_quota:
            continue
        curve = {int(k): float(v) for k, v in (job.throughput_curve or {}).items()} or None
        views.append(
            JobView(
                id=name,
                submit_time=job.submitted_at.timestamp() - epoch,
                requested_gpus=job.gpus,
                tenant=job.tenant.slug,
                min_gpus=job.min_gpus,
                max_gpus=job.max_gpus,
                gpus=held,
                attained_service=job.attained_gpu_seconds,
                state=ViewState.RUNNING if held else ViewState.QUEUED,
                priority=job.priority,
                throughput=curve,
            )
        )
        by_name[name] = job
    return Snapshot(
        now=0.0, cluster=Cluster(gpus=tuple(gpus), fabric_spec=cluster.spec), jobs=tuple(views)
    ), by_name
