"""Reading the cluster out of the database: the allocator state and the policy's snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Max

from fabric.allocator import Allocation, VClosAllocator
from fabric.topology import FabricSpec
from inventory.models import Fabric, Server, ServerState
from jobs.agent_commands import GpuHome, runtime_job_name
from jobs.choices import ACTIVE_STATES, JobState
from jobs.control.fair_share import tenant_shares
from jobs.models import Job, JobEvent, JobGpu
from jobs.progress import seconds_left, total_steps
from scheduler.curves import policy_curve
from scheduler.priority import AGED_CEILING, priority_class
from scheduler.quota import QuotaBook
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
    holdings: dict[int, list[int]]  # job id -> its GPUs in rank order
    draining: frozenset[int]


def read_cluster() -> ClusterState | None:
    """The fabric, where every GPU lives, which are schedulable now, who holds what.

    GPU ids follow from each server's position (the fabric's numbering), so
    this reads the servers, not every GPU row.
    """
    fabric = Fabric.objects.filter(pk=1).first()
    if fabric is None:
        return None
    spec = fabric.spec()
    homes: dict[int, GpuHome] = {}
    schedulable: set[int] = set()
    draining: set[int] = set()
    servers = Server.objects.values_list("node", "leaf", "slot", "state", "last_heartbeat")
    for node, leaf, slot, state, heartbeat in servers:
        first = leaf * spec.gpus_per_leaf + slot * spec.gpus_per_server
        indices = range(first, first + spec.gpus_per_server)
        for local, index in enumerate(indices):
            homes[index] = GpuHome(node=node, local=local)
        if state == ServerState.UP and heartbeat is not None:
            schedulable.update(indices)
        elif state == ServerState.DRAINING:
            draining.update(indices)
    holders: dict[int, int] = {}
    holdings: dict[int, list[int]] = {}
    for job_id, index in JobGpu.objects.order_by("job_id", "rank").values_list(
        "job_id", "gpu__index"
    ):
        holders[index] = job_id
        holdings.setdefault(job_id, []).append(index)
    return ClusterState(
        spec=spec,
        homes=homes,
        schedulable=frozenset(schedulable),
        holders=holders,
        holdings=holdings,
        draining=frozenset(draining),
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


def load_allocator(cluster: ClusterState) -> VClosAllocator:
    """A vClos allocator holding every running job's allocation; other GPUs blocked as needed."""
    allocator = VClosAllocator(cluster.spec)
    allocations = []
    for job_id, data in Job.objects.filter(state__in=ACTIVE_STATES).values_list("id", "allocation"):
        if data:
            allocations.append(_held_shape(data))
        elif gpus := tuple(cluster.holdings.get(job_id, ())):
            # held GPUs without a recorded shape: reserve them as they are
            leaves = tuple(sorted({cluster.spec.leaf_of(g) for g in gpus}))
            allocations.append(Allocation(runtime_job_name(job_id), gpus, leaves))
    allocator.restore(allocations)
    # Held GPUs of draining servers are blocked too: a job released there lands elsewhere.
    blocked = [g for g in range(cluster.spec.total_gpus) if g not in cluster.schedulable]
    allocator.set_unavailable(blocked)
    return allocator


def _last_state_change(job_ids: set[int]) -> dict[int, datetime]:
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


def _finishing(job_ids: set[int]) -> set[int]:
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


@dataclass(frozen=True)
class PolicyInput:
    """What the tick hands the policy, and what it needs to act on the answer."""

    snapshot: Snapshot
    ids: dict[str, int]  # job name in the snapshot -> database id
    held_back: dict[int, str]  # queued jobs kept out by their tenant's quota -> why
    book: QuotaBook  # quota and use per tenant, to check the policy's starts
    profile_candidates: tuple[int, ...]  # running at max, never profiled, tenant profiles


def build_snapshot(cluster: ClusterState, now: datetime) -> PolicyInput:
    """The policy's view: schedulable GPUs and the jobs it may decide on.

    Jobs in the middle of a membership switch (``scaling``) are left out: the
    policy decides on them again once the switch is done.  A queued job whose
    tenant has no quota left for its request is held back (quota rule).
    Returns the snapshot with what the tick needs next to it (``PolicyInput``).
    """
    gpus = []
    for index in sorted(cluster.homes):
        holder = cluster.holders.get(index)
        if holder is not None:
            state, job_name = GpuState.BUSY, runtime_job_name(holder)
        elif index in cluster.schedulable:
            state, job_name = GpuState.FREE, None
        else:
            state, job_name = GpuState.DOWN, None
        gpus.append(
            GpuView(
                id=index,
                server=cluster.spec.server_of(index),
                leaf=cluster.spec.leaf_of(index),
                state=state,
                job=job_name,
            )
        )
    rows = (
        Job.objects.filter(state__in=(JobState.QUEUED, JobState.RUNNING, JobState.SCALING))
        .order_by("submitted_at", "id")
        .values_list(
            "id",
            "state",
            "parallelism",
            "tenant_id",
            "tenant__slug",
            "tenant__gpu_quota",
            "submitted_at",
            "gpus",
            "min_gpus",
            "max_gpus",
            "attained_gpu_seconds",
            "priority",
            "throughput_curve",
            "measured_curve",
            "profile_state",
            "tenant__profile_jobs",
            "tenant__priority_weight",
        )
    )
    # Quota counts each job's requested share only: GPUs above it are idle extras that
    # the policy reclaims first, so they never keep a tenant's next job waiting.
    in_use: dict[int, int] = {}
    for row in rows:
        if row[1] in ACTIVE_STATES:
            in_use[row[3]] = in_use.get(row[3], 0) + min(row[2], row[7])
    holdings = cluster.holdings
    about_to_end = _finishing(
        {
            row[0]
            for row in rows
            if row[1] == JobState.RUNNING and row[9] > len(holdings.get(row[0], ()))
        }
    )
    since = _last_state_change({row[0] for row in rows if priority_class(row[11]) > AGED_CEILING})
    views: list[JobView] = []
    ids: dict[str, int] = {}
    held_back: dict[int, str] = {}
    book = QuotaBook()
    profile_candidates: list[int] = []
    weights: dict[str, float] = {}
    epoch = now.timestamp()
    for (
        job_id,
        state,
        _parallelism,
        tenant_id,
        slug,
        quota,
        submitted,
        requested,
        lo,
        hi,
        service,
        priority,
        curve_json,
        measured_json,
        profile_state,
        tenant_profiles,
        weight,
    ) in rows:
        if state == JobState.SCALING or profile_state == "requested":
            continue  # switching or profiling: its size belongs to the runtime for now
        held = tuple(holdings.get(job_id, ())) if state == JobState.RUNNING else ()
        if tenant_profiles and not profile_state and lo < hi and len(held) == hi:
            profile_candidates.append(job_id)
        if state == JobState.QUEUED and in_use.get(tenant_id, 0) + lo > quota:
            held_back[job_id] = (
                f"tenant {slug} holds {in_use.get(tenant_id, 0)} of its {quota}-GPU quota"
            )
            continue
        book.quota[slug] = quota
        weights[slug] = weight
        book.in_use[slug] = in_use.get(tenant_id, 0)
        if held and job_id in about_to_end:
            hi = len(held)  # a newcomer would join a job about to end: no growth
        name = runtime_job_name(job_id)
        profiled = {int(k): float(v) for k, v in (curve_json or {}).items()}
        measured = {int(k): float(v) for k, v in (measured_json or {}).items()}
        curve = policy_curve(profiled, measured, hi)
        views.append(
            JobView(
                id=name,
                submit_time=submitted.timestamp() - epoch,
                requested_gpus=requested,
                tenant=slug,
                min_gpus=lo,
                max_gpus=hi,
                gpus=held,
                attained_service=service,
                state=ViewState.RUNNING if held else ViewState.QUEUED,
                priority=priority,
                queue_since=since[job_id].timestamp() - epoch if job_id in since else None,
                throughput=curve,
            )
        )
        ids[name] = job_id
    snapshot = Snapshot(
        now=0.0,
        cluster=Cluster(gpus=tuple(gpus), fabric_spec=cluster.spec),
        jobs=tuple(views),
        tenants=tenant_shares(weights, now),
    )
    return PolicyInput(snapshot, ids, held_back, book, tuple(profile_candidates))
