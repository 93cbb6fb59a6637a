"""Small builders for hand-made snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.types import Cluster, Gpu, GpuState, JobState, JobView, Snapshot


def cluster(servers: int = 1, per_server: int = 8, busy: dict[int, str] | None = None) -> Cluster:
    """A uniform cluster; ``busy`` maps GPU id -> job id."""
    busy = busy or {}
    gpus = tuple(
        Gpu(
            id=s * per_server + k,
            server=s,
            leaf=0,
            state=GpuState.BUSY if (s * per_server + k) in busy else GpuState.FREE,
            job=busy.get(s * per_server + k),
        )
        for s in range(servers)
        for k in range(per_server)
    )
    return Cluster(gpus=gpus)


def queued(id: str, gpus: int, submit: float = 0.0, **kw: Any) -> JobView:
    """A queued job."""
    return JobView(id=id, submit_time=submit, requested_gpus=gpus, **kw)


def running(id: str, gpu_ids: tuple[int, ...], submit: float = 0.0, **kw: Any) -> JobView:
    """A running job on these GPUs."""
    kw.setdefault("requested_gpus", len(gpu_ids))
    return JobView(id=id, submit_time=submit, gpus=gpu_ids, state=JobState.RUNNING, **kw)


def snapshot(now: float, clu: Cluster, *jobs: JobView) -> Snapshot:
    """A snapshot at ``now``."""
    return Snapshot(now=now, cluster=clu, jobs=tuple(jobs))


def typed_cluster(
    pools: tuple[tuple[str, int], ...],
    per_server: int = 4,
    busy: dict[int, str] | None = None,
    labels: Mapping[int, tuple[tuple[str, str], ...]] | None = None,
) -> Cluster:
    """A cluster of ``(gpu type, servers)`` pools (:meth:`Cluster.mixed`, one leaf per
    server); ``busy`` maps GPU id -> job id, ``labels`` server id -> its label pairs."""
    busy = busy or {}
    base = Cluster.mixed(pools, per_server, servers_per_leaf=1)
    gpus = tuple(
        Gpu(g.id, g.server, g.leaf, GpuState.BUSY, busy[g.id], g.gpu_type) if g.id in busy else g
        for g in base.gpus
    )
    return Cluster(gpus=gpus, server_labels=labels or {})
